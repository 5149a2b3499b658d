"""The error model (spec/FORMAT.md §11.1): every check `Container.open` makes raises a
FormatError with a code from the one list, and the code list is closed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from moepack.format.errors import CODES, FormatError, reject

FORMAT = Path(__file__).resolve().parents[1] / "format"
OPEN_PATH = ("header.py", "reader.py", "canonical.py", "rules.py", "sections.py", "mtp.py")


def _uncoded_raises(path: Path) -> list[int]:
    """Lines where FormatError(...) is built without a code (positional or keyword)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "FormatError":
            if len(node.args) < 2 and not any(k.arg == "code" for k in node.keywords):
                bad.append(node.lineno)
    return bad


@pytest.mark.parametrize("name", OPEN_PATH)
def test_every_open_check_has_a_code(name: str) -> None:
    assert _uncoded_raises(FORMAT / name) == []


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
