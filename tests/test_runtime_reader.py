"""The C reader (runtime/src/container.c) against the spec vectors and the Python reader.

Every valid vector must open; every invalid one must be refused with the code and substring its
.expected.json names AND with the Python reader's code, field, offset and message. Damaged
variants (bit flips, truncations, rewritten and resealed indexes) must get the same verdict,
code, field, offset and text from both readers, and never crash the C side. BLAKE3 is compared
with the reference `blake3` package.

"The same text" stops at CPython's own words: for JSON syntax errors the Python reader quotes the
`json` module, whose wording changes between versions (3.13: "Illegal trailing comma before end
of array" where 3.10-3.12 say "Expecting value"), so there the two must agree up to the spec's
stable substring `bad JSON` (spec/FORMAT.md section 11) and both end with a position.
"""

from __future__ import annotations

import ctypes
import json
import random
import re
import struct
from pathlib import Path

import blake3
import pytest
from damage import reseal
from moepack.format import Container, FormatError
from moepack.format.errors import CODES
from moepack.runtime import _lib
from spec_vectors import INVALID, VALID

ROOT = Path(__file__).resolve().parents[1]

@pytest.fixture(scope="module")
def lib():
    lib = _lib.load()
    lib.mp_blake3_digest.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p]
    lib.mp_blake3_digest.restype = ctypes.c_int
    return lib


def c_check(lib, path: Path) -> tuple[int, str]:
    r = _lib.check_container(path)
    return r.rc, r.message


def py_error(path: Path) -> FormatError | None:
    try:
        with Container.open(path):
            return None
    except FormatError as e:
        return e


# `{where}: bad JSON: {CPython's json message}: line L column C (char N)`
JSON_SYNTAX = re.compile(r"(.*: bad JSON): .+: line \d+ column \d+ \(char \d+\)")


def same_message(c_msg: str, py_msg: str) -> bool:
    """Equal, except that a JSON syntax error's detail (CPython's words) is not compared."""
    py_syntax = JSON_SYNTAX.fullmatch(py_msg)
    if py_syntax is None:
        return c_msg == py_msg
    c_syntax = JSON_SYNTAX.fullmatch(c_msg)
    return c_syntax is not None and c_syntax.group(1) == py_syntax.group(1)


def test_vectors_present():
    assert VALID and INVALID, "spec/vectors is empty"


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_vector_opens(lib, path):
    rc, msg = c_check(lib, path)
    assert rc == 0, msg


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_vector_refused(lib, path):
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    c = _lib.check_container(path)
    assert c.rc == -2, f"rc {c.rc}: {c.message}"  # MP_EFORMAT
    assert expected["error"] in c.message and c.code == expected["code"], c
    py = py_error(path)
    assert py is not None and (py.code, py.field, py.offset) == (c.code, c.field, c.offset), c
    assert same_message(c.message, str(py)), f"\n  C : {c.message}\n  Py: {py}"


def test_missing_file_is_io_error(lib, tmp_path):
    rc, msg = c_check(lib, tmp_path / "nope.moepack")
    assert rc == -3 and "nope.moepack" in msg  # MP_EIO


def _mutations(data: bytes, rng: random.Random):
    off, n = struct.unpack_from("<QQ", data, 32)
    index = data[off : off + n]
    doc = json.loads(index)
    for _ in range(40):  # header bit flips
        b = bytearray(data)
        b[rng.randrange(128)] ^= 1 << rng.randrange(8)
        yield bytes(b)
    for cut in (0, 1, 127, 128, 129, off - 1, off, off + n // 2, len(data) - 1):
        yield data[:cut]
    for _ in range(60):  # byte edits of the index, resealed (reach the JSON checks)
        b = bytearray(index)
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(b))
            b[i] = rng.choice(b'{}[]",:0-19eE.\\ ntfu\xc3\xff')
        yield reseal(data, bytes(b))
    for _ in range(80):  # structural edits of one section, re-encoded canonically and resealed
        d = json.loads(index)
        s = rng.choice(d["sections"])
        key = rng.choice(sorted(s))
        s[key] = rng.choice([None, True, -1, 0, 1, 63, 64, 2**63 - 1, 2**63, 1.5, "x", [], {},
                             "gate", [1, 2], s[key]])
        if rng.random() < 0.3:
            s.pop(rng.choice(sorted(s)), None)
        new = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        yield reseal(data, new.encode())
    m = doc["manifest"]
    for key in ("model", "source", "converter", "codecs"):
        d = json.loads(index)
        d["manifest"].pop(key)
        yield reseal(data, json.dumps(d, sort_keys=True, separators=(",", ":")).encode())
    assert m


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_damaged_variants_same_verdict_and_message(lib, path, tmp_path):
    data = path.read_bytes()
    rng = random.Random(path.stem)
    target = tmp_path / "m.moepack"
    for i, variant in enumerate(_mutations(data, rng)):
        target.write_bytes(variant)
        c = _lib.check_container(target)
        py = py_error(target)
        if py is None:
            assert c.rc == 0, f"variant {i}: Python opens it, C says {c.message}"
        else:
            assert (c.rc, c.code, c.field, c.offset) == (-2, py.code, py.field, py.offset) \
                and same_message(c.message, str(py)), \
                f"variant {i}:\n  C : {c}\n  Py: {py.code} {py.field} {py.offset} {py}"


@pytest.mark.parametrize("bad, detail", [
    (b'{"manifest":[1,]}', "Expecting value"),  # 3.13's json: "Illegal trailing comma ..."
    (b'{"manifest":{"a":1,}}', "Expecting property name enclosed in double quotes"),
    (b'{"manifest" 1}', "Expecting ':' delimiter"),
])
def test_json_syntax_errors_agree_up_to_the_stable_substring(lib, tmp_path, bad, detail):
    """The C reader's JSON detail is fixed (CPython 3.11's words, runtime/tests_c/test_json.c);
    whatever this Python's `json` says, both readers refuse at the same place with `bad JSON`."""
    target = tmp_path / "m.moepack"
    target.write_bytes(reseal(VALID[0].read_bytes(), bad))
    c = _lib.check_container(target)
    py = py_error(target)
    assert c.rc == -2 and f"bad JSON: {detail}: line 1 column" in c.message, c
    assert c.code == "json_syntax" and py is not None and py.code == "json_syntax"
    assert same_message(c.message, str(py)), f"\n  C : {c.message}\n  Py: {py}"


LENGTHS = [0, 1, 63, 64, 65, 127, 128, 1023, 1024, 1025, 2047, 2048, 2049, 3072, 4095, 4096,
           5000, 8193, 31 * 1024, 32 * 1024 + 1, 100_000, (1 << 20) + 7]


def test_blake3_matches_reference(lib):
    rng = random.Random(3)
    for n in LENGTHS:
        data = bytes(rng.getrandbits(8) for _ in range(min(n, 4096))) * (n // 4096 + 1)
        data = data[:n]
        out = ctypes.create_string_buffer(32)
        assert lib.mp_blake3_digest(data, n, out) == 0
        assert out.raw == blake3.blake3(data).digest(), n


def test_c_codes_are_the_spec_codes():
    """Every code the C reader can give is one of moepack.format.errors.CODES (FORMAT.md §11.1),
    and every FAIL names one first (a message format in its place would compile)."""
    src = ROOT / "runtime" / "src"
    container = (src / "container.c").read_text()
    text = container + (src / "json.c").read_text()
    first = re.findall(r"\bFAIL\(\s*([^,]+),", container)
    assert all(re.fullmatch(r'"[a-z0-9_]+"|code|jcode|CODE', a) for a in first), first
    used = {a.strip('"') for a in first if a.startswith('"')}
    used |= set(re.findall(r'(?:code|\*code|p->code) = "([a-z0-9_]+)"', text))
    used |= set(re.findall(r'fail_text\(p, "([a-z0-9_]+)"', text))
    used |= set(re.findall(r'fail_at\(e, "([a-z0-9_]+)"', text))
    used |= set(re.findall(r'\(mpc_error_info\)\{"([a-z0-9_]+)"', text))
    assert len(used) > 40 and used <= set(CODES), sorted(used - set(CODES))
