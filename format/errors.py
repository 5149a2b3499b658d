"""The one exception type for rejected containers."""


class FormatError(ValueError):
    """A container (or part of one) violates spec/FORMAT.md. The message names field and offset."""
