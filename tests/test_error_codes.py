"""The error model (spec/FORMAT.md §11.1): every check `Container.open` makes raises a
FormatError with a code from the one list, and the code list is closed."""

from __future__ import annotations

import pytest
from moepack.format.errors import CODES, FormatError, reject

# that every FormatError in format/ names its code: test_later_error_codes.py scans them all


def test_codes_are_one_closed_list() -> None:
    with pytest.raises(ValueError, match="not in moepack.format.errors.CODES"):
        FormatError("x", "no_such_code")
    assert all(code.isidentifier() and code.islower() for code in CODES)


def test_reject_names_field_and_offset() -> None:
    e = reject("bad_magic", "header.magic", "bad magic 00", 0)
    assert (str(e), e.code, e.field, e.offset) == (
        "header.magic at offset 0: bad magic 00", "bad_magic", "header.magic", 0)
    e = reject("truncated", None, "truncated: file is 3 bytes")
    assert (str(e), e.field, e.offset) == ("truncated: file is 3 bytes", None, None)
