"""Subcommands of `moepack` provided by moepack.verify."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this package's subcommands to the `moepack` app."""
