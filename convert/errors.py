"""Exception types of moepack.convert; every message names the file and tensor concerned."""

from __future__ import annotations


class ConvertError(Exception):
    """A conversion or export cannot proceed (the message says why and what to do)."""


class SourceError(ConvertError):
    """The source checkpoint is unreadable or disagrees with its config.json."""


class UnsupportedArchitecture(ConvertError):
    """config.json names an architecture no adapter handles."""
