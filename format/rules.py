"""Validity rules shared by the planner (never plan a bad file) and the reader (never open one)."""

from __future__ import annotations

import re
from math import prod
from typing import Any

from moepack.format import codecs
from moepack.format.errors import FormatError, reject
from moepack.format.limits import MAX_DIM, MAX_DIMS, MAX_ELEMENTS, MAX_NAME_BYTES, MAX_U63

from moepack.safefs import name_problem

_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[\x21-\x7e]+")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value: Any, where: str, lo: int = 0, hi: int = MAX_U63) -> int:
    if not is_int(value):
        raise reject("wrong_type", where, f"expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise reject("out_of_range", where, f"{value} outside {lo}..{hi}")
    return value


def required(obj: dict, key: str, where: str) -> Any:
    """`obj[key]`, or the FormatError `WHERE: missing key 'KEY'` (code missing_key) when the key is
    absent; `where` names the object. A key present with JSON null is returned (None): the type
    check that follows refuses it as `wrong_type`, so absent and null stay distinct."""
    if key not in obj:
        raise reject("missing_key", where, f"missing key {key!r}")
    return obj[key]


def _check_type(value: Any, kind: type, what: str, where: str) -> Any:
    if not isinstance(value, kind):
        raise reject("wrong_type", where, f"expected {what}, got {type(value).__name__}")
    return value


def check_str(value: Any, where: str) -> str:
    return _check_type(value, str, "a string", where)


def check_obj(value: Any, where: str) -> dict:
    return _check_type(value, dict, "an object", where)


def check_list(value: Any, where: str) -> list:
    return _check_type(value, list, "an array", where)


def check_name(value: Any, where: str) -> str:
    name = check_str(value, where)
    if not 1 <= len(name) <= MAX_NAME_BYTES or not _NAME.fullmatch(name):
        raise reject("bad_name", where,
                     f"name must be 1-{MAX_NAME_BYTES} printable ASCII characters")
    return name


def check_blob_name(name: str, where: str) -> str:
    """A blob's name becomes a file name on export (FORMAT.md §4.2): a single plain file name,
    by the same rule as moepack.safefs.name_problem."""
    problem = name_problem(name)
    if problem:
        raise reject("blob_name", where, f"{problem}; a blob name must be a plain file name")
    return name


def check_hex_hash(value: Any, where: str) -> bytes:
    text = check_str(value, where)
    if not _HEX64.fullmatch(text):
        raise reject("bad_hash_string", where, "bad hash string (want 64 lowercase hex characters)")
    return bytes.fromhex(text)


def check_shape(value: Any, where: str) -> tuple[int, ...]:
    dims = check_list(value, where)
    if not 1 <= len(dims) <= MAX_DIMS:
        raise reject("bad_shape", where,
                     f"shape must have 1..{MAX_DIMS} dimensions, has {len(dims)}")
    shape = tuple(check_int(d, f"{where}[{i}]", 1, MAX_DIM) for i, d in enumerate(dims))
    if prod(shape) > MAX_ELEMENTS:
        raise reject("bad_shape", where, f"shape has more than {MAX_ELEMENTS} elements")
    return shape


def codec_nbytes(codec: Any, shape: tuple[int, ...], where: str) -> int:
    """Encoded size of `shape` under `codec`; any problem with the codec object is a FormatError.

    The codec checks validate every key's type explicitly: any other exception is a bug."""
    codec = check_obj(codec, f"{where}.codec")
    name = check_str(required(codec, "name", f"{where}.codec"), f"{where}.codec.name")
    code = "bad_codec" if name in codecs.CODECS else "unknown_codec"
    try:
        codecs.validate_codec(codec, shape)
        n = codecs.encoded_nbytes(codec, shape)
    except FormatError as e:
        raise reject(code, f"{where}.codec", str(e)) from None
    return check_int(n, f"{where}.codec size")


CLASS_CODECS = {"codebook": ("f32", "f16")}  # classes whose codec is restricted (CODECS.md §3)


def check_class_codec(cls: str, codec: dict, where: str) -> None:
    """A class in CLASS_CODECS takes only its listed codecs (call after the codec is valid)."""
    allowed = CLASS_CODECS.get(cls)
    if allowed is not None and codec["name"] not in allowed:
        raise reject("class_codec", f"{where}.codec", f"codec {codec['name']!r} not allowed for "
                     f"class {cls!r} (must be {' or '.join(map(repr, allowed))})")


def validate_manifest(manifest: Any, where: str = "index.manifest") -> dict:
    """Check the manifest keys of FORMAT.md section 6 (unknown keys are allowed and ignored)."""
    m = check_obj(manifest, where)
    for key in ("model", "source", "converter", "codecs"):
        check_obj(required(m, key, where), f"{where}.{key}")
    check_str(required(m["model"], "arch", f"{where}.model"), f"{where}.model.arch")
    sw = f"{where}.source"
    src = m["source"]
    check_str(required(src, "architecture", sw), f"{sw}.architecture")
    check_obj(required(src, "config", sw), f"{sw}.config")
    files = check_list(required(src, "files", sw), f"{sw}.files")
    names = []
    for i, f in enumerate(files):
        fw = f"{sw}.files[{i}]"
        check_obj(f, fw)
        names.append(check_str(required(f, "name", fw), f"{fw}.name"))
        check_int(required(f, "size", fw), f"{fw}.size")
        check_hex_hash(required(f, "sha256", fw), f"{fw}.sha256")
    if names != sorted(names) or len(set(names)) != len(names):
        raise reject("files_unsorted", f"{sw}.files", "not sorted by name or names repeat")
    if "skipped" in src:  # optional; when present, an array of strings (section 6)
        for i, line in enumerate(check_list(src["skipped"], f"{sw}.skipped")):
            check_str(line, f"{sw}.skipped[{i}]")
    cw = f"{where}.converter"
    conv = m["converter"]
    check_str(required(conv, "name", cw), f"{cw}.name")
    check_str(required(conv, "version", cw), f"{cw}.version")
    check_obj(required(conv, "settings", cw), f"{cw}.settings")
    for cls, codec in m["codecs"].items():
        kw = f"{where}.codecs.{cls}"
        check_str(required(check_obj(codec, kw), "name", kw), f"{kw}.name")
    return m
