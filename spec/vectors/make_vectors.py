"""Generate spec/vectors/: valid containers with their expected `moepack info --json`, and invalid
ones each with the stable substring of the error every reader must give.

Deterministic (no clocks, no RNG state: payloads are BLAKE3 XOF of fixed seeds); rerunning gives
identical bytes (tests/test_vectors.py checks it). Zstd output is pinned to the compression
level; a zstandard library that compresses differently changes only valid/blobs.moepack.

    python spec/vectors/make_vectors.py [OUTDIR]      # default: this file's folder
"""

from __future__ import annotations

import json
import struct
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import blake3
import zstandard
from moepack.format import BankSpec, TensorSpec
from moepack.format.canonical import canonical_json
from moepack.format.info import container_info
from moepack.format.limits import align_up
from moepack.format.mtp import MTP_BANK, MTP_TENSOR
from moepack.format.reader import Container
from moepack.format.synthetic import F16, F32, RVQ3, mixtral_spec, write_synthetic, xof

HEADER = struct.Struct("<8sHHIIIQQQ32s16s")
FIELDS = ("magic", "major", "minor", "flags", "alignment", "header_size", "file_size",
          "index_offset", "index_length", "root_hash", "reserved")
Q8_16 = {"name": "q8", "group_size": 16}
Q6_16, Q6_32 = {"name": "q6", "group_size": 16}, {"name": "q6", "group_size": 32}


# --- low-level forging helpers (also used by tests/test_fuzz.py) ----------------------------

def header_fields(data: bytes) -> dict[str, Any]:
    return dict(zip(FIELDS, HEADER.unpack(data[:96]), strict=True))


def patch_header(data: bytes, *, fix_hash: bool = True, **fields: Any) -> bytes:
    """Rewrite header fields; recompute header_hash unless told not to."""
    h = header_fields(data)
    h.update(fields)
    body = HEADER.pack(*(h[f] for f in FIELDS))
    tail = blake3.blake3(body).digest() if fix_hash else data[96:128]
    return body + tail + data[128:]


def index_doc(data: bytes) -> dict[str, Any]:
    h = header_fields(data)
    return json.loads(data[h["index_offset"] : h["index_offset"] + h["index_length"]])


def reseal(data: bytes, index: dict[str, Any] | bytes, *, index_offset: int | None = None,
           **fields: Any) -> bytes:
    """Replace the index (a document or raw bytes) and make header and root hash agree with it."""
    off = header_fields(data)["index_offset"] if index_offset is None else index_offset
    raw = index if isinstance(index, bytes) else canonical_json(index)
    body = data[:off].ljust(off, b"\0")
    out = body + raw
    return patch_header(out, file_size=len(out), index_offset=off, index_length=len(raw),
                        root_hash=blake3.blake3(raw).digest(), **fields)


def section(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in doc["sections"] if s["name"] == name)


def edit(fn: Callable[[dict[str, Any]], Any]) -> Callable[[bytes], bytes]:
    """A mutation that edits the index document in place and reseals."""
    def run(data: bytes) -> bytes:
        doc = index_doc(data)
        fn(doc)
        return reseal(data, doc)
    return run


# --- content ----------------------------------------------------------------------------

def synthetic_tokenizer() -> bytes:
    """A small tokenizer.json-shaped document (BPE vocab + merges) with realistic redundancy."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2}
    for i, a in enumerate(letters):
        vocab[a] = 3 + i
    merges = []
    for a in letters:
        for b in "aeioulnrst":
            vocab[a + b] = len(vocab)
            merges.append(f"{a} {b}")
    doc = {"version": "1.0", "added_tokens": [
        {"id": i, "content": t, "special": True, "normalized": False, "lstrip": False,
         "rstrip": False, "single_word": False} for t, i in list(vocab.items())[:3]],
        "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "vocab": vocab,
                  "merges": merges}}
    return json.dumps(doc, indent=2).encode()


TOKENIZER_CONFIG = json.dumps({
    "bos_token": "<s>", "eos_token": "</s>",
    "chat_template": "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}"
                     "{% if add_generation_prompt %}<|assistant|>{% endif %}",
}, indent=2).encode()
GENERATION_CONFIG = b'{"bos_token_id": 1, "eos_token_id": 2, "temperature": 0.7}'


def _write(spec: Any, blobs: dict[str, bytes] | None = None, seed: str = "vectors") -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "v.moepack"
        write_synthetic(path, spec, blobs or {}, seed=seed)
        return path.read_bytes()


def valid_mixtral2() -> bytes:
    """2 MoE layers, trunk in f32 (norms, router), f16 (embed, lm_head), q8 (attention); rvq
    experts with codebooks; default alignment 4096."""
    return _write(mixtral_spec(layers=2, experts=4, hidden=32, inter=16, vocab=64, heads=4,
                               kv_heads=2, alignment=4096, attn=Q8_16, embed=F16))


def valid_blobs() -> bytes:
    """Tokenizer (zstd), tokenizer_config and generation_config (stored), alignment 512."""
    tok = synthetic_tokenizer()
    ztok = zstandard.ZstdCompressor(level=19).compress(tok)
    blobs = {"tokenizer.json": ztok, "tokenizer_config.json": TOKENIZER_CONFIG,
             "generation_config.json": GENERATION_CONFIG}
    meta = {"tokenizer.json": (len(ztok), "zstd", len(tok)),
            "tokenizer_config.json": (len(TOKENIZER_CONFIG), "none", len(TOKENIZER_CONFIG)),
            "generation_config.json": (len(GENERATION_CONFIG), "none", len(GENERATION_CONFIG))}
    spec = mixtral_spec(layers=1, experts=2, hidden=16, inter=16, vocab=32, heads=2,
                        kv_heads=1, alignment=512, attn=F16, embed=F16, expert=Q8_16, blobs=meta)
    return _write(spec, blobs)


def valid_q6() -> bytes:
    """1 layer, alignment 512: q6 attention (group 16), embed and lm_head (group 32), rows of 40
    columns (padding columns in the last group), q8 experts."""
    return _write(mixtral_spec(layers=1, experts=2, hidden=40, inter=16, vocab=32, heads=2,
                               kv_heads=1, alignment=512, attn=Q6_16, embed=Q6_32,
                               expert=Q8_16))


def valid_codebook_f16() -> bytes:
    """1 MoE layer, alignment 512: rvq experts (2 stages) whose codebooks are stored as f16."""
    return _write(mixtral_spec(layers=1, experts=2, hidden=16, inter=16, vocab=32, heads=2,
                               kv_heads=1, alignment=512, attn=F16, embed=F16,
                               expert=dict(RVQ3, stages=2), codebook=F16))


def valid_rvq_tiles() -> bytes:
    """1 MoE layer, alignment 512: rvq experts (2 stages) whose code tiles have padding rows
    (gate/up 20 rows, one tile) and span two tiles (down: 72 rows), with a partial 8-vector
    (20 columns)."""
    return _write(mixtral_spec(layers=1, experts=2, hidden=72, inter=20, vocab=32, heads=2,
                               kv_heads=1, alignment=512, attn=F16, embed=F16,
                               expert=dict(RVQ3, stages=2)))


def valid_mtp() -> bytes:
    """1 MoE layer plus one multi-token-prediction layer (FORMAT.md §4.6), alignment 512: two
    mtp_tensor sections (an f32 norm, an f16 projection) after an mtp_expert_bank (q8 experts,
    one section hash) that starts where the expert bank ends. Readers that do not know the
    types check them as unknown sections."""
    spec = mixtral_spec(layers=1, experts=2, hidden=16, inter=16, vocab=32, heads=2,
                        kv_heads=1, alignment=512, attn=F16, embed=F16, expert=Q8_16)
    mtp = (TensorSpec("layers.1.mtp.enorm", "norm", (16,), F32, MTP_TENSOR),
           TensorSpec("layers.1.mtp.eh_proj", "attn", (16, 32), F16, MTP_TENSOR))
    bank = BankSpec(1, 2, spec.banks[0].parts, MTP_BANK)
    return _write(replace(spec, tensors=spec.tensors + mtp, banks=spec.banks + (bank,)))


def _rvq_1_0_size(shape: list[int], codec: dict[str, Any]) -> int:
    """Encoded size of an rvq part under format 1.0 ([rows][nv][S] codes, padded to 64)."""
    rows, cols = shape
    return align_up(rows * -(-cols // 8) * codec["stages"], 64) + 2 * rows


def _format_1_0(data: bytes) -> bytes:
    """valid/mixtral2 as a 1.0 writer labelled it: minor 0, no flag bit 0, rvq part lengths by
    the 1.0 size rule (so a reader that checked lengths first would give another message)."""
    doc = index_doc(data)
    for s in doc["sections"]:
        for p in s.get("parts", ()):
            p["length"] = _rvq_1_0_size(p["shape"], p["codec"])
    return reseal(data, doc, minor=0, flags=0)


def _codebook_bf16(data: bytes) -> bytes:
    """The f16-codebook vector with one codebook relabelled bf16 (same length: only the class
    rule fails)."""
    return edit(_set("layers.0.experts.up.codebook", codec={"name": "bf16"}))(valid_codebook_f16())


def mini() -> bytes:
    """The base of the invalid vectors: 1 layer, 2 q8 experts, alignment 512, one blob."""
    blob = b'{"eos_token_id": 2}'
    spec = mixtral_spec(layers=1, experts=2, hidden=16, inter=16, vocab=32, heads=2, kv_heads=1,
                        alignment=512, attn=F16, embed=F16, expert=Q8_16,
                        blobs={"generation_config.json": (len(blob), "none", len(blob))})
    return _write(spec, {"generation_config.json": blob})


def valid_future_minor() -> bytes:
    """Minor 2 with an optional flag, an unknown top-level key and an unknown section type,
    which a 1.1 reader must check (common keys, extent, hash) and otherwise skip."""
    data = mini()
    doc = index_doc(data)
    last = doc["sections"][-1]
    extra = xof("future-section", 100)
    off = align_up(last["offset"] + last["length"], 64)
    doc["sections"].append({"type": "attention_sinks", "name": "layers.0.sinks", "offset": off,
                            "length": len(extra), "hash": blake3.blake3(extra).hexdigest(),
                            "dtype": "f32"})
    doc["future_key"] = {"anything": [1, 2, 3]}
    body = data[: header_fields(data)["index_offset"]].ljust(off, b"\0") + extra
    return reseal(body, doc, index_offset=align_up(len(body), 64), minor=2, flags=1 << 16)


# --- invalid vectors: name -> (mutation of mini(), expected error substring) ----------------

def _deep(doc: dict[str, Any]) -> None:
    nest: Any = 0
    for _ in range(80):
        nest = [nest]
    doc["manifest"]["source"]["config"]["deep"] = nest


def _bank(doc: dict[str, Any]) -> dict[str, Any]:
    return section(doc, "experts.0")


def _set(target: str, /, **kv: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: section(doc, target).update(kv)


def _raw_index(fn: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    def run(data: bytes) -> bytes:
        h = header_fields(data)
        return reseal(data, fn(data[h["index_offset"] :]))
    return run


def _sub(old: bytes, new: bytes) -> Callable[[bytes], bytes]:
    """Replace the first `old` in the index text (which then stays sealed by a fresh root hash)."""
    return _raw_index(lambda i: i.replace(old, new, 1))


def _bank_add(key: str, delta: int) -> Callable[[bytes], bytes]:
    return edit(lambda doc: _bank(doc).update({key: _bank(doc)[key] + delta}))


def _move_index(delta: int, **fields: Any) -> Callable[[bytes], bytes]:
    def run(d: bytes) -> bytes:
        return patch_header(d, index_offset=header_fields(d)["index_offset"] + delta, **fields)
    return run


def _shift_next(doc: dict[str, Any]) -> None:
    doc["sections"][1]["offset"] = doc["sections"][0]["offset"] + 64


def _swap_parts(doc: dict[str, Any]) -> None:
    p = _bank(doc)["parts"]
    p[0]["name"], p[1]["name"] = p[1]["name"], p[0]["name"]


def _dup_name(doc: dict[str, Any]) -> None:
    doc["sections"][2]["name"] = doc["sections"][1]["name"]


def _stride(doc: dict[str, Any]) -> None:
    b = _bank(doc)
    b["stride"], b["length"] = 520, 1040


INVALID: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "empty": (lambda d: b"", "truncated"),
    "truncated_header": (lambda d: d[:100], "truncated"),
    "zero_header": (lambda d: bytes(128) + d[128:], "unfinished conversion"),
    "bad_magic": (lambda d: b"MOEPACX\0" + d[8:], "bad magic"),
    "future_major": (lambda d: patch_header(d, major=2), "unsupported major version 2"),
    "bad_header_hash": (lambda d: d[:100] + bytes([d[100] ^ 1]) + d[101:], "header hash mismatch"),
    "header_size": (lambda d: patch_header(d, header_size=256), "header_size 256 != 128"),
    "unknown_required_flag": (lambda d: patch_header(d, flags=4), "unknown required flag"),
    "nonzero_reserved": (lambda d: patch_header(d, reserved=b"\1" + bytes(15)),
                         "reserved bytes are not zero"),
    "alignment_not_power_of_two": (lambda d: patch_header(d, alignment=1000),
                                   "not a power of two"),
    "alignment_too_small": (lambda d: patch_header(d, alignment=256), "not a power of two"),
    "truncated_file": (lambda d: d[:-10], "!= actual file size"),
    "trailing_bytes": (lambda d: d + bytes(64), "!= actual file size"),
    "index_too_large": (lambda d: patch_header(d, index_length=(64 << 20) + 1),
                        "index length 67108865 outside"),
    "index_extent": (_move_index(64), "does not end at file size"),
    "index_in_header_region": (lambda d: patch_header(d, index_offset=256,
                                                      index_length=len(d) - 256),
                               "must be >= alignment"),
    "header_padding": (lambda d: d[:200] + b"\1" + d[201:], "header padding"),
    "wrong_root_hash": (lambda d: patch_header(d, root_hash=bytes(32)), "index hash mismatch"),
    "bad_json": (_raw_index(lambda i: i[:-1]), "bad JSON"),
    "duplicate_key": (_sub(b'{"manifest":', b'{"manifest":0,"manifest":'),
                      "duplicate key 'manifest'"),
    "non_canonical_json": (_sub(b'{"manifest":', b'{"manifest": '), "not canonical JSON"),
    "too_deep_json": (edit(_deep), "nesting depth"),
    "invalid_utf8": (_sub(b'"mixtral"', b'"mixtr\xc3\x28l"'), "invalid UTF-8"),
    "nan_in_json": (_sub(b'"rope_scaling":null', b'"rope_scaling":NaN'),
                    "forbidden constant NaN"),
    "index_not_object": (_raw_index(lambda i: b"[]"), "index: expected an object"),
    "missing_manifest_key": (edit(lambda doc: doc["manifest"].pop("codecs")),
                             "missing key 'codecs'"),
    # an absent required key at any depth is missing_key naming its object; null is a value
    "missing_section_key": (edit(lambda doc: section(doc, "embed").pop("hash")),
                            "('embed'): missing key 'hash'"),
    "null_section_key": (edit(_set("embed", hash=None)), "('embed').hash: expected a string"),
    "skipped_not_array": (edit(lambda doc: doc["manifest"]["source"].update(skipped="x")),
                          "index.manifest.source.skipped: expected an array"),
    "float_overflow": (_sub(b'"rope_scaling":null', b'"rope_scaling":1e999'),
                       "not canonical JSON"),
    "overlapping_extents": (edit(_shift_next), "overlaps the previous extent"),
    "gap_before_index": (lambda d: reseal(d, index_doc(d),
                                          index_offset=header_fields(d)["index_offset"] + 64),
                         "before the index"),
    "offset_past_eof": (edit(_set("embed", offset=1 << 40)), "runs past the index"),
    "huge_length": (edit(_set("embed", length=(1 << 62) + 5)), "runs past the index"),
    "int64_overflow": (edit(_set("embed", length=(1 << 64) + 5)), "integer out of range"),
    "negative_offset": (edit(_set("embed", offset=-512)), "outside 0..9223372036854775807"),
    "float_offset": (edit(_set("embed", offset=512.0)), "expected an integer"),
    "misaligned_section": (edit(_set("embed", offset=520)), "is not a multiple of 64"),
    "misaligned_bank": (_bank_add("offset", -64), "is not a multiple of 512"),
    "stride_not_multiple": (edit(_stride), "is not a multiple of the alignment"),
    "bank_length": (edit(lambda doc: _bank(doc).update(length=512)), "!= count 2 × stride"),
    "shape_codec_mismatch": (edit(_set("embed", shape=[32, 15])), "for shape × codec"),
    "zero_dim": (edit(_set("embed", shape=[32, 0])), "outside 1..2147483647"),
    "too_many_dims": (edit(_set("embed", shape=[1, 1, 1, 32, 16])), "1..4 dimensions"),
    "unknown_codec": (edit(_set("embed", codec={"name": "q3"})), "unknown codec"),
    "q6_group_size": (edit(_set("embed", codec={"name": "q6", "group_size": 48})),
                      "codec 'q6': group_size 48 not in"),
    "bad_hash_string": (edit(lambda doc: section(doc, "embed").update(
        hash=section(doc, "embed")["hash"].upper())), "bad hash string"),
    "duplicate_name": (edit(_dup_name), "duplicate section name"),
    "bad_name": (edit(_set("embed", name="embed weights")), "printable ASCII"),
    "hash_table_length": (edit(_set("expert_hashes.0", length=32)), "expected count × 32"),
    "missing_hash_table": (edit(lambda doc: _bank(doc).update(hashes="nope")),
                           "no expert_hashes section named 'nope'"),
    "part_offset": (edit(lambda doc: _bank(doc)["parts"][1].update(offset=576)), "parts[1].offset"),
    "part_names": (edit(_swap_parts), "names must be ['gate', 'up', 'down']"),
    "record_length": (_bank_add("record_length", 1), "!= end of last part"),
    "blob_raw_length": (edit(_set("generation_config.json", raw_length=5)),
                        "for compression 'none'"),
    "blob_compression": (edit(_set("generation_config.json", compression="lz4")),
                         "is not 'none' or 'zstd'"),
    # blob names become file names on export: only a plain file name (FORMAT.md §4.2)
    "blob_name_parent": (edit(_set("generation_config.json", name="../x")),
                         "contains a path separator; a blob name must be a plain file name"),
    "blob_name_absolute": (edit(_set("generation_config.json", name="/etc/x")),
                           "contains a path separator; a blob name must be a plain file name"),
    "blob_name_backslash": (edit(_set("generation_config.json", name="..\\x")),
                            "contains a path separator; a blob name must be a plain file name"),
    "blob_name_dot": (edit(_set("generation_config.json", name=".")),
                      "is empty, '.' or '..'; a blob name must be a plain file name"),
    "blob_name_dotdot": (edit(_set("generation_config.json", name="..")),
                         "is empty, '.' or '..'; a blob name must be a plain file name"),
    "blob_name_long": (edit(_set("generation_config.json", name="a" * 256)),
                       "is longer than 255 bytes; a blob name must be a plain file name"),
    # built from valid/codebook_f16 (mini() has no codebooks)
    "codebook_codec": (_codebook_bf16, "codec 'bf16' not allowed for class 'codebook'"),
    # built from valid/mixtral2: rvq codes in the 1.0 layout are refused, not misread
    "rvq_format_1_0": (lambda d: _format_1_0(valid_mixtral2()),
                       "was made by format 1.0 and must be reconverted"),
}


# name -> the stable code (moepack.format.errors.CODES, FORMAT.md §11) both readers must give
EXPECTED_CODE: dict[str, str] = {
    "empty": "truncated", "truncated_header": "truncated", "zero_header": "unfinished",
    "bad_magic": "bad_magic", "future_major": "unsupported_major",
    "bad_header_hash": "header_hash_mismatch", "header_size": "header_size",
    "unknown_required_flag": "unknown_required_flag", "nonzero_reserved": "reserved_nonzero",
    "alignment_not_power_of_two": "bad_alignment", "alignment_too_small": "bad_alignment",
    "truncated_file": "file_size_mismatch", "trailing_bytes": "file_size_mismatch",
    "index_too_large": "index_length", "index_extent": "index_extent",
    "index_in_header_region": "index_offset", "header_padding": "header_padding",
    "wrong_root_hash": "index_hash_mismatch", "bad_json": "json_syntax",
    "duplicate_key": "duplicate_key", "non_canonical_json": "not_canonical",
    "too_deep_json": "json_depth", "invalid_utf8": "invalid_utf8",
    "nan_in_json": "forbidden_constant", "index_not_object": "wrong_type",
    "missing_manifest_key": "missing_key", "missing_section_key": "missing_key",
    "null_section_key": "wrong_type", "skipped_not_array": "wrong_type",
    "float_overflow": "not_canonical", "overlapping_extents": "extent_overlap",
    "gap_before_index": "extent_gap", "offset_past_eof": "past_index", "huge_length": "past_index",
    "int64_overflow": "integer_range", "negative_offset": "out_of_range",
    "float_offset": "wrong_type", "misaligned_section": "misaligned",
    "misaligned_bank": "misaligned", "stride_not_multiple": "stride", "bank_length": "bank_length",
    "shape_codec_mismatch": "length_mismatch", "zero_dim": "out_of_range",
    "too_many_dims": "bad_shape", "unknown_codec": "unknown_codec", "q6_group_size": "bad_codec",
    "bad_hash_string": "bad_hash_string", "duplicate_name": "duplicate_name",
    "bad_name": "bad_name", "hash_table_length": "hash_table_length",
    "missing_hash_table": "missing_hash_table", "part_offset": "part_offset",
    "part_names": "part_names", "record_length": "record_length",
    "blob_raw_length": "blob_raw_length", "blob_compression": "blob_compression",
    "blob_name_parent": "blob_name", "blob_name_absolute": "blob_name",
    "blob_name_backslash": "blob_name", "blob_name_dot": "blob_name",
    "blob_name_dotdot": "blob_name", "blob_name_long": "blob_name",
    "codebook_codec": "class_codec", "rvq_format_1_0": "needs_reconversion",
}


def generate(out: Path) -> list[Path]:
    """Write every vector under `out`; returns the files written."""
    written = []
    valid = {"mixtral2": valid_mixtral2(), "blobs": valid_blobs(),
             "future_minor": valid_future_minor(), "q6": valid_q6(),
             "codebook_f16": valid_codebook_f16(), "rvq_tiles": valid_rvq_tiles(),
             "mtp": valid_mtp()}
    base = mini()
    for sub in ("valid", "invalid"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for name, data in valid.items():
        path = out / "valid" / f"{name}.moepack"
        path.write_bytes(data)
        with Container.open(path) as c:
            info = json.dumps(container_info(c), indent=2, sort_keys=True) + "\n"
        (out / "valid" / f"{name}.info.json").write_text(info)
        written += [path, out / "valid" / f"{name}.info.json"]
    for name, (mutate, error) in INVALID.items():
        path = out / "invalid" / f"{name}.moepack"
        path.write_bytes(mutate(base))
        expected = {"code": EXPECTED_CODE[name], "error": error}
        (out / "invalid" / f"{name}.expected.json").write_text(
            json.dumps(expected, indent=2) + "\n")
        written += [path, out / "invalid" / f"{name}.expected.json"]
    return written


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
