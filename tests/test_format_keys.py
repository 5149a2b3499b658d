"""Required keys, JSON types and numbers in the index (FORMAT.md §3, §6, §11 steps 20-25): both
readers give the same code, field, offset and message for each edit of a valid vector.

An absent required key is `missing_key` naming the object it belongs in (`OBJECT: missing key
'K'`), at every depth; the same key present with JSON null is `wrong_type` (`…K: expected …, got
NoneType`). A key's JSON type is checked before its content rules (names, part names). Found by a
reader written from the spec alone (the stranger's probes)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from damage import reseal
from moepack.format import Container, FormatError
from moepack.runtime import _lib
from spec_vectors import INVALID, VECTORS

MIXTRAL = VECTORS / "valid" / "mixtral2.moepack"
BLOBS = VECTORS / "valid" / "blobs.moepack"
MTP = VECTORS / "valid" / "mtp.moepack"
MANIFEST = "index.manifest"
FILE0 = f"{MANIFEST}.source.files[0]"
NORM = "index.sections[1] ('layers.0.attn_norm')"  # a tensor of mixtral2
BANK = "index.sections[26] ('experts.1')"  # mixtral2's second expert bank
TOKENIZER = "index.sections[10] ('tokenizer.json')"  # a blob of blobs.moepack

Doc = dict[str, Any]


def _canonical(doc: Doc) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def _edited(vector: Path, edit: Callable[[Doc], None]) -> bytes:
    data = vector.read_bytes()
    off = struct.unpack_from("<Q", data, 32)[0]
    doc = json.loads(data[off:])
    edit(doc)
    return reseal(data, _canonical(doc))


def _section(doc: Doc, name: str) -> Doc:
    return next(s for s in doc["sections"] if s["name"] == name)


def _drop(path: str, key: str) -> Callable[[Doc], None]:
    """Delete `key` from the object at `path` (dotted keys / [i] from the index's top level,
    `sections:NAME` for a section by name)."""
    return lambda doc: _walk(doc, path).pop(key)


def _set(path: str, key: str, value: Any) -> Callable[[Doc], None]:
    return lambda doc: _walk(doc, path).__setitem__(key, value)


def _walk(doc: Doc, path: str) -> Any:
    obj: Any = doc
    for part in path.split("/"):
        if part.startswith("sections:"):
            obj = _section(doc, part.removeprefix("sections:"))
        elif part.isdigit():
            obj = obj[int(part)]
        else:
            obj = obj[part]
    return obj


def _both(tmp_path: Path, data: bytes) -> tuple[FormatError | None, _lib.ContainerCheck]:
    path = tmp_path / "edited.moepack"
    path.write_bytes(data)
    c = _lib.check_container(path)
    try:
        with Container.open(path):
            return None, c
    except FormatError as e:
        return e, c


def _agree(tmp_path: Path, data: bytes) -> FormatError:
    py, c = _both(tmp_path, data)
    assert py is not None, f"Python opens it; C: {c}"
    assert (c.rc, c.code, c.field, c.offset, c.message) == \
        (-2, py.code, py.field, py.offset, str(py)), f"\n  C : {c}\n  Py: {py.code} {py}"
    return py


S = "sections:"
# id -> (vector, edit, field of the object the key belongs in, key)
ABSENT: dict[str, tuple[Path, Callable[[Doc], None], str, str]] = {
    "model.arch": (MIXTRAL, _drop("manifest/model", "arch"), f"{MANIFEST}.model", "arch"),
    "source.architecture": (MIXTRAL, _drop("manifest/source", "architecture"),
                            f"{MANIFEST}.source", "architecture"),
    "source.config": (MIXTRAL, _drop("manifest/source", "config"), f"{MANIFEST}.source",
                      "config"),
    "source.files": (MIXTRAL, _drop("manifest/source", "files"), f"{MANIFEST}.source", "files"),
    "files[0].name": (MIXTRAL, _drop("manifest/source/files/0", "name"), FILE0, "name"),
    "files[0].size": (MIXTRAL, _drop("manifest/source/files/0", "size"), FILE0, "size"),
    "files[0].sha256": (MIXTRAL, _drop("manifest/source/files/0", "sha256"), FILE0, "sha256"),
    "converter.name": (MIXTRAL, _drop("manifest/converter", "name"), f"{MANIFEST}.converter",
                       "name"),
    "converter.version": (MIXTRAL, _drop("manifest/converter", "version"),
                          f"{MANIFEST}.converter", "version"),
    "converter.settings": (MIXTRAL, _drop("manifest/converter", "settings"),
                           f"{MANIFEST}.converter", "settings"),
    "codecs.attn.name": (MIXTRAL, _drop("manifest/codecs/attn", "name"),
                         f"{MANIFEST}.codecs.attn", "name"),
    "section.type": (MIXTRAL, _drop(f"{S}layers.0.attn_norm", "type"), NORM, "type"),
    "section.name": (MIXTRAL, _drop(f"{S}layers.0.attn_norm", "name"), "index.sections[1]",
                     "name"),
    "section.offset": (MIXTRAL, _drop(f"{S}layers.0.attn_norm", "offset"), NORM, "offset"),
    "section.length": (MIXTRAL, _drop(f"{S}layers.0.attn_norm", "length"), NORM, "length"),
    "section.hash": (MIXTRAL, _drop(f"{S}layers.0.attn_norm", "hash"), NORM, "hash"),
    "tensor.class": (MIXTRAL, _drop(f"{S}layers.0.attn_norm", "class"), NORM, "class"),
    "tensor.shape": (MIXTRAL, _drop(f"{S}layers.0.attn_norm", "shape"), NORM, "shape"),
    "tensor.codec": (MIXTRAL, _drop(f"{S}layers.0.attn_norm", "codec"), NORM, "codec"),
    "codec.name": (MIXTRAL, _drop(f"{S}layers.0.attn_norm/codec", "name"), f"{NORM}.codec",
                   "name"),
    "blob.compression": (BLOBS, _drop(f"{S}tokenizer.json", "compression"), TOKENIZER,
                         "compression"),
    "blob.raw_length": (BLOBS, _drop(f"{S}tokenizer.json", "raw_length"), TOKENIZER,
                        "raw_length"),
    "bank.layer": (MIXTRAL, _drop(f"{S}experts.1", "layer"), BANK, "layer"),
    "bank.count": (MIXTRAL, _drop(f"{S}experts.1", "count"), BANK, "count"),
    "bank.stride": (MIXTRAL, _drop(f"{S}experts.1", "stride"), BANK, "stride"),
    "bank.record_length": (MIXTRAL, _drop(f"{S}experts.1", "record_length"), BANK,
                           "record_length"),
    "bank.hashes": (MIXTRAL, _drop(f"{S}experts.1", "hashes"), BANK, "hashes"),
    "bank.parts": (MIXTRAL, _drop(f"{S}experts.1", "parts"), BANK, "parts"),
    "part.name": (MIXTRAL, _drop(f"{S}experts.1/parts/1", "name"), f"{BANK}.parts[1]", "name"),
    "part.shape": (MIXTRAL, _drop(f"{S}experts.1/parts/1", "shape"), f"{BANK}.parts[1]",
                   "shape"),
    "part.codec": (MIXTRAL, _drop(f"{S}experts.1/parts/1", "codec"), f"{BANK}.parts[1]",
                   "codec"),
    "part.offset": (MIXTRAL, _drop(f"{S}experts.1/parts/1", "offset"), f"{BANK}.parts[1]",
                    "offset"),
    "part.length": (MIXTRAL, _drop(f"{S}experts.1/parts/1", "length"), f"{BANK}.parts[1]",
                    "length"),
}


@pytest.mark.parametrize("case", sorted(ABSENT))
def test_absent_required_key_is_missing_key_naming_its_object(tmp_path: Path, case: str) -> None:
    vector, edit, obj, key = ABSENT[case]
    e = _agree(tmp_path, _edited(vector, edit))
    assert (e.code, e.field, e.offset, str(e)) == \
        ("missing_key", obj, None, f"{obj}: missing key {key!r}")


# id -> (vector, edit, field, code): the key present with JSON null
NULL: dict[str, tuple[Path, Callable[[Doc], None], str, str]] = {
    "model.arch": (MIXTRAL, _set("manifest/model", "arch", None), f"{MANIFEST}.model.arch",
                   "wrong_type"),
    "files[0].sha256": (MIXTRAL, _set("manifest/source/files/0", "sha256", None),
                        f"{FILE0}.sha256", "wrong_type"),
    "converter.settings": (MIXTRAL, _set("manifest/converter", "settings", None),
                           f"{MANIFEST}.converter.settings", "wrong_type"),
    "section.hash": (MIXTRAL, _set(f"{S}layers.0.attn_norm", "hash", None), f"{NORM}.hash",
                     "wrong_type"),
    "bank.parts": (MIXTRAL, _set(f"{S}experts.1", "parts", None), f"{BANK}.parts",
                   "wrong_type"),
    "codec.name": (MIXTRAL, _set(f"{S}layers.0.attn_norm/codec", "name", None),
                   f"{NORM}.codec.name", "wrong_type"),
    # an enumeration: any value that is not one of its strings, null included
    "blob.compression": (BLOBS, _set(f"{S}tokenizer.json", "compression", None),
                         f"{TOKENIZER}.compression", "blob_compression"),
}


@pytest.mark.parametrize("case", sorted(NULL))
def test_null_is_a_value_of_the_wrong_type(tmp_path: Path, case: str) -> None:
    vector, edit, field, code = NULL[case]
    e = _agree(tmp_path, _edited(vector, edit))
    assert (e.code, e.field) == (code, field)
    assert "NoneType" in str(e) or "None is not" in str(e)


# JSON type first, content rules only for a value of the right type (§11 steps 24, 25)
TYPE_FIRST: dict[str, tuple[Callable[[Doc], None], str, str]] = {
    "section name not a string": (_set(f"{S}layers.0.attn_norm", "name", 5),
                                  "index.sections[1].name", "expected a string, got int"),
    "bank hashes not a string": (_set(f"{S}experts.1", "hashes", 7), f"{BANK}.hashes",
                                 "expected a string, got int"),
    "a part not an object": (lambda d: _section(d, "experts.1")["parts"].__setitem__(2, 3),
                             f"{BANK}.parts[2]", "expected an object, got int"),
    "a file name not a string": (_set("manifest/source/files/0", "name", []),
                                 f"{FILE0}.name", "expected a string, got list"),
}


@pytest.mark.parametrize("case", sorted(TYPE_FIRST))
def test_type_is_checked_before_content(tmp_path: Path, case: str) -> None:
    edit, field, why = TYPE_FIRST[case]
    e = _agree(tmp_path, _edited(MIXTRAL, edit))
    assert (e.code, e.field, str(e)) == ("wrong_type", field, f"{field}: {why}")


@pytest.mark.parametrize("value, field, why", [
    ("x", "source.skipped", "expected an array, got str"),
    (None, "source.skipped", "expected an array, got NoneType"),
    (["ok", 3], "source.skipped[1]", "expected a string, got int"),
])
def test_skipped_is_an_array_of_strings(tmp_path: Path, value: Any, field: str,
                                        why: str) -> None:
    e = _agree(tmp_path, _edited(MIXTRAL, _set("manifest/source", "skipped", value)))
    assert (e.code, e.field, str(e)) == \
        ("wrong_type", f"{MANIFEST}.{field}", f"{MANIFEST}.{field}: {why}")


@pytest.mark.parametrize("value", [[], ["vision tower: not converted"]])
def test_valid_skipped_opens_in_both(tmp_path: Path, value: list[str]) -> None:
    py, c = _both(tmp_path, _edited(MIXTRAL, _set("manifest/source", "skipped", value)))
    assert py is None and (c.rc, c.message) == (0, "")


@pytest.mark.parametrize("number", ["1e999", "-1e400", "1.8e308"])
def test_float_overflowing_binary64_is_not_canonical(tmp_path: Path, number: str) -> None:
    """§3 forbids it; step 20 refuses it: no binary64 writes back as that text."""
    data = _edited(MIXTRAL, _set("manifest/converter/settings", "zz", 0.5))
    off = struct.unpack_from("<Q", data, 32)[0]
    index = data[off:]
    assert index.count(b'"zz":0.5') == 1
    e = _agree(tmp_path, reseal(data, index.replace(b'"zz":0.5', f'"zz":{number}'.encode())))
    assert (e.code, e.field, e.offset) == ("not_canonical", "index", off)
    assert str(e) == f"index at offset {off}: not canonical JSON: a number overflows binary64"


def test_codec_key_absent_or_null(tmp_path: Path) -> None:
    """Inside a codec object both are the codec's own error (bad_codec), worded apart."""
    q = f"{S}layers.0.attn.q/codec"
    absent = _agree(tmp_path, _edited(MIXTRAL, _drop(q, "group_size")))
    null = _agree(tmp_path, _edited(MIXTRAL, _set(q, "group_size", None)))
    assert absent.code == null.code == "bad_codec"
    assert str(absent).endswith("codec 'q8': missing key 'group_size'")
    assert str(null).endswith("codec 'q8': 'group_size' must be an integer, got None")


def test_mtp_sections_need_their_keys_too(tmp_path: Path) -> None:
    """Checked as unknown sections at open (common keys), then by their own rules on request."""
    with Container.open(MTP) as c:
        bank = c.mtp_banks()[0]["name"]
    e = _agree(tmp_path, _edited(MTP, _drop(f"{S}{bank}", "hash")))
    assert e.code == "missing_key" and str(e).endswith("missing key 'hash'")
    path = tmp_path / "mtp.moepack"
    path.write_bytes(_edited(MTP, _drop(f"{S}{bank}", "count")))
    with Container.open(path) as c, pytest.raises(FormatError) as e:
        c.mtp_banks()
    assert e.value.code == "missing_key" and str(e.value).endswith("missing key 'count'")


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_field_and_offset_are_the_message_prefix(path: Path) -> None:
    """FORMAT.md §11 'Field and offset': the message is `FIELD[ at offset N]: WHY`."""
    with pytest.raises(FormatError) as e:
        Container.open(path)
    err = e.value
    if err.field is None:
        assert err.code in ("truncated", "unfinished") and str(err).startswith(
            "truncated: " if err.code == "truncated" else "unfinished conversion: ")
        return
    at = f" at offset {err.offset}" if err.offset is not None else ""
    assert str(err).startswith(f"{err.field}{at}: ")
    if err.field.startswith("index.") or err.code in ("wrong_type", "missing_key"):
        assert err.offset is None  # index structure: a path, no offset
    elif err.field == "index":  # index text: the index's start in the file
        assert err.offset == struct.unpack_from("<Q", path.read_bytes(), 32)[0]
