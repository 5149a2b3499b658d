"""Unit checks of the format library's pieces: canonical JSON, blobs, planner refusals, writer and
reader API edges."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import blake3
import pytest
import zstandard
from moepack.format import (
    BlobSpec,
    Container,
    ContainerWriter,
    FormatError,
    TensorSpec,
    pack_record,
    plan_layout,
)
from moepack.format.blobs import decompress_blob
from moepack.format.canonical import canonical_json, parse_canonical
from moepack.format.synthetic import Q8, encode_synthetic, mixtral_spec, write_synthetic


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (b'{"a":1,"a":2}', "duplicate key 'a'"),
        (b'{"b":1,"a":2}', "not canonical"),
        (b'{"a": 1}', "not canonical"),
        (b'["\\u00e9"]', "not canonical"),  # non-ASCII must be raw UTF-8
        (b'["\\ud83d\\ude00"]', "not canonical"),
        (b"[-0]", "not canonical"),
        (b"[1.0e5]", "not canonical"),
        (b"[1e400]", "not canonical"),
        (b"[Infinity]", "forbidden constant"),
        (b"[9223372036854775808]", "integer out of range"),
        (b"[" + b"9" * 5000 + b"]", "integer out of range"),
        (b"[" * 65 + b"]" * 65, "nesting depth 65"),
        (b'["\xed\xa0\x80"]', "invalid UTF-8"),  # an encoded surrogate
        (b"\xef\xbb\xbf{}", "bad JSON"),  # BOM
        (b'{"a":', "bad JSON"),
    ],
)
def test_parse_canonical_rejects(text: bytes, error: str) -> None:
    with pytest.raises(FormatError, match=error):
        parse_canonical(text, "index")


def test_canonical_round_trip() -> None:
    doc = {"é": ["\n\x01\"\\", 1e-05, 1e16, -(1 << 63), None, True], "a": {"z": 1.5, "b": []}}
    text = canonical_json(doc)
    assert text == json.dumps(doc, sort_keys=True, separators=(",", ":"),
                              ensure_ascii=False).encode()
    assert parse_canonical(text, "x") == doc
    deep: list = []
    for _ in range(63):
        deep = [deep]
    assert parse_canonical(canonical_json(deep), "x") == deep  # depth 64 is allowed


def test_blob_decompression_bounds() -> None:
    raw = b"tokenizer " * 1000
    frame = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(raw)
    assert decompress_blob(frame, len(raw), "b") == raw
    with pytest.raises(FormatError, match="more than 100"):
        decompress_blob(frame, 100, "b")
    with pytest.raises(FormatError, match="decompressed to 10000 bytes"):
        decompress_blob(frame, 20000, "b")
    with pytest.raises(FormatError, match="blob holds"):
        decompress_blob(frame + frame, len(raw), "b")
    with pytest.raises(FormatError, match="not a zstd frame"):
        decompress_blob(b"\x28\xb5", 1, "b")
    with pytest.raises(FormatError, match="blob holds"):
        decompress_blob(frame[:-9], len(raw), "b")  # the last block's header claims more bytes
    with pytest.raises(FormatError, match="truncated"):
        decompress_blob(frame[: zstandard.frame_header_size(frame) + 1], len(raw), "b")
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    assert decompress_blob(unsized, len(raw), "b") == raw


def test_zstd_blob_round_trip(tmp_path: Path) -> None:
    raw = json.dumps({"model": {"vocab": {f"t{i}": i for i in range(500)}}}).encode()
    z = zstandard.ZstdCompressor(level=19).compress(raw)
    spec = mixtral_spec(layers=1, experts=2, alignment=512,
                        blobs={"tokenizer.json": (len(z), "zstd", len(raw))})
    write_synthetic(tmp_path / "z.moepack", spec, {"tokenizer.json": z})
    with Container.open(tmp_path / "z.moepack") as c:
        assert c.blob("tokenizer.json") == raw
        assert bytes(c.section_bytes("tokenizer.json")) == z
        assert c.blob_info("tokenizer.json")["raw_length"] == len(raw)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"alignment": 1000}, "not a power of two"),
        ({"alignment": 256}, "outside 512"),
        ({"tensors": (TensorSpec("bad name", "norm", (4,), {"name": "f32"}),)}, "printable"),
        ({"tensors": (TensorSpec("t", "norm", (0,), {"name": "f32"}),)}, "outside 1"),
        ({"tensors": (TensorSpec("t", "norm", (4,), {"name": "q3"}),)}, "unknown codec"),
        ({"tensors": (TensorSpec("t", "attn", (4, 4), {"name": "q8"}),)}, "group_size"),
        ({"tensors": (TensorSpec("t", "", (4,), {"name": "f32"}),)}, "class"),
        ({"tensors": (TensorSpec("c", "codebook", (1, 256, 8), {"name": "bf16"}),)},
         "codec 'bf16' not allowed for class 'codebook'"),
        ({"tensors": (TensorSpec("x", "n", (4,), {"name": "f32"}),) * 2}, "repeat"),
        ({"blobs": (BlobSpec("b", 10, "none", 9),)}, "raw_length"),
        ({"blobs": (BlobSpec("b", 10, "lz4", 9),)}, "compression"),
        ({"blobs": (BlobSpec("b", 0),)}, "outside 1"),
        ({"manifest": {"model": {}}}, "missing key 'source'"),
    ],
)
def test_planner_refuses_bad_specs(change: dict, error: str) -> None:
    spec = replace(mixtral_spec(layers=1, experts=2, alignment=512), **change)
    with pytest.raises(FormatError, match=error):
        plan_layout(spec)


@pytest.mark.parametrize(("value", "code"), [(float("nan"), "forbidden_constant"),
                                           (float("inf"), "forbidden_constant"),
                                           (1 << 63, "integer_range")])
def test_planner_refuses_numbers_canonical_json_cannot_hold(value: object, code: str) -> None:
    spec = mixtral_spec(layers=1, experts=2, alignment=512)
    manifest = {**spec.manifest, "converter": {**spec.manifest["converter"], "x": [value]}}
    with pytest.raises(FormatError) as e:
        plan_layout(replace(spec, manifest=manifest))
    assert (e.value.code, e.value.field) == (code, "index.manifest")


def test_planner_does_not_report_its_callers_bug_as_a_bad_file() -> None:
    """A manifest holding a non-JSON value is the writer's bug: TypeError, not FormatError."""
    spec = mixtral_spec(layers=1, experts=2, alignment=512)
    manifest = {**spec.manifest, "converter": {**spec.manifest["converter"], "x": {1, 2}}}
    with pytest.raises(TypeError):
        plan_layout(replace(spec, manifest=manifest))


def test_planner_refuses_bad_banks() -> None:
    spec = mixtral_spec(layers=2, experts=2, alignment=512)
    with pytest.raises(FormatError, match="same layer"):
        plan_layout(replace(spec, banks=(spec.banks[0], spec.banks[0])))
    b = spec.banks[0]
    with pytest.raises(FormatError, match="names must be"):
        plan_layout(replace(spec, banks=(replace(b, parts=b.parts[::-1]),)))
    with pytest.raises(FormatError, match="outside 1..65536"):
        plan_layout(replace(spec, banks=(replace(b, count=0),)))


def test_layout_is_value_independent_and_exact() -> None:
    spec = mixtral_spec(layers=3, experts=5, alignment=1024)
    a, b = plan_layout(spec), plan_layout(spec)
    assert a.sections == b.sections and a.file_size == b.file_size
    bank = a.bank(2)
    assert bank.stride % 1024 == 0 and bank.offset % 1024 == 0
    assert bank.record_offset(4) == bank.offset + 4 * bank.stride
    assert [p.offset % 64 for p in bank.parts] == [0, 0, 0]
    with pytest.raises(IndexError):
        bank.record_offset(5)
    with pytest.raises(KeyError):
        a.bank(7)


def test_finalize_with_same_length_manifest(tmp_path: Path) -> None:
    spec = mixtral_spec(layers=1, experts=2, alignment=512)
    layout = plan_layout(spec)
    manifest = json.loads(json.dumps(spec.manifest))
    manifest["source"]["files"][0]["sha256"] = "ab" * 32  # same width as the placeholder
    longer = json.loads(json.dumps(manifest))
    longer["source"]["files"][0]["size"] = 10**12
    path = tmp_path / "m.moepack"
    with ContainerWriter(path, layout) as w:
        for t in spec.tensors:
            w.write_tensor(t.name, encode_synthetic(t.codec, t.shape, t.name))
        with pytest.raises(FormatError, match="same length"):
            w.finalize(manifest=longer)
        w.finalize(manifest=manifest)
    with Container.open(path) as c:
        assert c.manifest["source"]["files"][0]["sha256"] == "ab" * 32


def test_short_records_are_zero_padded(tmp_path: Path) -> None:
    spec = mixtral_spec(layers=1, experts=2, alignment=4096, inter=24)
    layout = plan_layout(spec)
    bank = layout.bank(0)
    assert bank.record_length < bank.stride  # room for a write past record_length
    path = tmp_path / "r.moepack"
    with ContainerWriter(path, layout) as w:
        digest = w.write_expert(0, 0, b"\x07" * 100)
        with pytest.raises(ValueError, match="past record_length"):
            w.write_expert(0, 1, b"\x01" * bank.stride)
        full = pack_record(bank, {p.name: b"\x02" * p.length for p in bank.parts})
        w.write_expert(0, 1, full + bytes(bank.stride - len(full)))
        cid = w.finalize()
    with Container.open(path) as c:
        assert c.id == cid
        rec = bytes(c.expert_record(0, 0))
        assert rec == b"\x07" * 100 + bytes(bank.stride - 100)
        assert c.expert_hash(0, 0) == digest == blake3.blake3(rec).digest()
        assert bytes(c.expert_part_bytes(0, 1, "up")) == b"\x02" * bank.parts[1].length


def test_reader_api_errors(tmp_path: Path) -> None:
    path = tmp_path / "a.moepack"
    write_synthetic(path, mixtral_spec(layers=1, experts=2, alignment=512))
    c = Container.open(path)
    with pytest.raises(KeyError):
        c.tensor_bytes("nope")
    with pytest.raises(KeyError):
        c.blob("embed")  # a tensor, not a blob
    with pytest.raises(KeyError):
        c.expert_range(5, 0)
    with pytest.raises(IndexError):
        c.expert_record(0, 2)
    with pytest.raises(KeyError):
        c.expert_part(0, 0, "side")
    view = c.tensor_bytes("embed")
    c.close()  # a view still alive must not make close fail
    assert len(view) == c.tensor_info("embed")["length"]
    c.close()


def test_missing_codebook_is_a_format_error(tmp_path: Path) -> None:
    spec = mixtral_spec(layers=1, experts=2, alignment=512)
    spec = replace(spec, tensors=tuple(t for t in spec.tensors if "codebook" not in t.name))
    write_synthetic(tmp_path / "n.moepack", spec)
    with Container.open(tmp_path / "n.moepack") as c, pytest.raises(FormatError, match="codebook"):
        c.expert_part(0, 0, "gate")


def _set_flags(path: Path, flags: int) -> None:
    """Rewrite header.flags and reseal the header hash (the index is untouched)."""
    data = bytearray(path.read_bytes())
    data[12:16] = flags.to_bytes(4, "little")
    data[96:128] = blake3.blake3(bytes(data[:96])).digest()
    path.write_bytes(bytes(data))


def test_rvq_files_carry_the_tile_flag_and_1_0_rvq_is_refused(tmp_path: Path) -> None:
    """FORMAT.md §2/§10: writers set required flag bit 0 exactly when a part is rvq; a file with
    rvq parts and without the bit was made by format 1.0 (other code layout) and is refused."""
    rvq, q8 = tmp_path / "rvq.moepack", tmp_path / "q8.moepack"
    write_synthetic(rvq, mixtral_spec(layers=1, experts=2, alignment=512))
    write_synthetic(q8, mixtral_spec(layers=1, experts=2, alignment=512, expert=Q8))
    with Container.open(rvq) as c, Container.open(q8) as d:
        assert (c.version, c.header.flags, d.version, d.header.flags) == ((1, 1), 1, (1, 1), 0)
    _set_flags(q8, 1)  # the flag on a file without rvq is harmless
    Container.open(q8).close()
    _set_flags(rvq, 0)
    with pytest.raises(FormatError, match=r"parts\[0\].codec: rvq codes without header flag bit 0"
                       r" .*made by format 1.0 and must be reconverted"):
        Container.open(rvq)
    _set_flags(rvq, 3)
    with pytest.raises(FormatError, match="unknown required flag bits 0x0002"):
        Container.open(rvq)


def test_every_command_tells_to_reconvert_a_1_0_file(tmp_path: Path) -> None:
    """One message for a 1.0 file from every command that opens it: the rule, what to do
    (`moepack convert` again) and, on error lines, its stable code."""
    from hostile_snapshot import cli
    from spec_vectors import VECTORS

    old = VECTORS / "invalid" / "rvq_format_1_0.moepack"
    for args in (["info", old], ["info", "--json", old], ["plan", old], ["run", old, "w"],
                 ["run", old, "--tokens", "1", "--json"], ["chat", old],
                 ["eval", old, "--tokens", "1", "--logits", tmp_path / "l.npy"],
                 ["export", old, tmp_path / "out"],
                 ["torrent", "create", old, "-o", tmp_path / "t.torrent"], ["verify", old]):
        rc, output = cli(*args)
        lines = [ln for ln in output.splitlines() if "format 1.0" in ln]
        assert rc == (2 if args[0] == "verify" else 1) and len(lines) == 1, (args, output)
        assert "Traceback" not in output and "run `moepack convert`" in lines[0], (args, output)
        if "--json" in args:  # the error object, its code a key
            assert json.loads(output)["error"]["code"] == "needs_reconversion", output
        else:
            assert lines[0].endswith("[needs_reconversion]"), (args, output)
