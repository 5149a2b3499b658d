"""moepack.format: the container format (spec/FORMAT.md) — planner, writer, reader, codecs."""

from moepack.format.errors import FormatError

__all__ = ["FormatError"]
