"""A Hugging Face checkpoint directory, read one tensor (or one expert slice) at a time."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np
from moepack.convert.errors import SourceError
from moepack.convert.fp8 import dequant_blocks, scale_grid, to_f32
from moepack.convert.mxfp4 import (
    MXFP4,
    Mxfp4Error,
    layout_from_config,
    part_names,
    virtual_tensors,
)
from moepack.convert.mxfp4 import dequantize as mxfp4_dequantize
from moepack.convert.packed_int import (
    PACKED,
    PackedIntError,
    PackedScheme,
    dequantize,
    packed_words,
    scheme_from_config,
    unpack,
)
from moepack.convert.st_header import DTYPE_SIZES, TensorInfo, parse_json, read_header
from moepack.format.model_desc import MAX_JSON_BYTES, MAX_TENSORS

from moepack.safefs import file_kind, name_problem, one_line, printable, read_bounded
from moepack.untrusted_json import loads

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
FLOAT_DTYPES = ("F32", "F16", "BF16")
FP8 = "F8_E4M3"
# Files carried into the container as blobs (FORMAT.md §4.2), when present.
BLOB_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
              "special_tokens_map.json", "chat_template.jinja")


@dataclass(frozen=True)
class SourceRef:
    """Where a canonical tensor's values live: a checkpoint tensor, optionally one expert of a
    fused `[experts, rows, cols]` tensor and a row range of it (fused gate_up)."""

    name: str
    index: int | None = None
    rows: tuple[int, int] | None = None


def load_json(path: Path, label: str | None = None) -> dict:
    """An untrusted JSON object file (config.json, index.json): size and nesting bounded.
    Messages start with `label` (default: the file's name)."""
    label = label or path.name
    data = read_small(path, MAX_JSON_BYTES, label)
    obj = parse_json(data, f"{label}: not readable JSON")
    if not isinstance(obj, dict):
        raise SourceError(f"{label}: expected a JSON object")
    return obj


def read_small(path: Path, limit: int, label: str | None = None) -> bytes:
    """A regular file of at most `limit` bytes (a FIFO or device is refused, never waited on);
    messages start with `label` (default: the file's name)."""
    label = label or path.name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError as e:
        raise SourceError(f"{label}: missing from {path.parent}") from e
    except OSError as e:
        raise SourceError(f"{label}: cannot read: {e.strerror or e}") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SourceError(f"{label}: not a regular file ({file_kind(st.st_mode)})")
        if st.st_size > limit:
            raise SourceError(f"{label}: {st.st_size:,} bytes, larger than the "
                              f"{limit:,} accepted")
        try:
            return read_bounded(f, limit)[:limit]
        except OSError as e:
            raise SourceError(f"{label}: cannot read: {e.strerror or e}") from e


def index_shards(index: Path) -> tuple[dict[str, str], list[str]]:
    """A safetensors index's weight_map (tensor -> shard) and the shards it names, sorted:
    untrusted, so a non-empty object of at most MAX_TENSORS entries naming plain file names."""
    wmap = load_json(index).get("weight_map")
    if not isinstance(wmap, dict):
        raise SourceError(f"{INDEX_NAME}: no weight_map object (tensor name -> shard file)")
    if not wmap:
        raise SourceError(f"{INDEX_NAME}: weight_map is empty: it names no tensors")
    if len(wmap) > MAX_TENSORS:
        raise SourceError(f"{INDEX_NAME}: weight_map lists {len(wmap):,} tensors (at "
                          f"most {MAX_TENSORS:,} are accepted)")
    if not all(isinstance(f, str) for f in wmap.values()):
        raise SourceError(f"{INDEX_NAME}: weight_map values must be file names")
    files = sorted(set(wmap.values()))
    for f in files:  # the rule hub listings and every other untrusted name follow (safefs)
        if problem := name_problem(f):
            raise SourceError(f"{INDEX_NAME}: {printable(f)} is not a file name in the "
                              f"checkpoint directory (it {problem})")
    return wmap, files


class Checkpoint:
    """Validated view of a checkpoint: config, tensor table, blob files; no tensor data loaded."""

    def __init__(self, directory: str | Path, *, weightless: bool = False) -> None:
        """weightless: a folder with no weight file at all (only config.json and maybe
        tokenizer files) is accepted, with no files and no tensors (`convert --dry-run` plans
        it from the config); a folder whose index names missing shards is refused either way."""
        self.dir = Path(directory)
        self._blob_sizes: dict[str, int] | None = None
        if not self.dir.is_dir():
            raise SourceError(f"{self.dir}: not a directory")
        self.config = load_json(self.dir / "config.json")
        self.files = self._weight_files(weightless)
        self.tensors: dict[str, TensorInfo] = {}
        for fname in self.files:
            for tname, info in read_header(self.dir / fname).items():
                if tname in self.tensors:
                    other = self.tensors[tname].file
                    raise SourceError(f"{fname}: tensor {tname!r} also in {other}")
                self.tensors[tname] = info
            if len(self.tensors) > MAX_TENSORS:
                raise SourceError(f"{fname}: more than {MAX_TENSORS:,} tensors in the checkpoint")
        self._check_index()
        self.fp8_block = self._block_size()
        try:
            self.packed: PackedScheme | None = scheme_from_config(self.config)
        except PackedIntError as e:
            raise SourceError(f"config.json: {e}") from None
        if self.packed is not None:
            self._add_packed()
        try:
            self.mxfp4 = layout_from_config(self.config)
        except Mxfp4Error as e:
            raise SourceError(f"config.json: {e}") from None
        if self.mxfp4 is not None:
            self._add_mxfp4()

    def _add_mxfp4(self) -> None:
        """Every MXFP4 codes + scales pair becomes a readable tensor of dtype MXFP4 whose shape
        is the dequantised one (convert/mxfp4.py); header reads only."""
        assert self.mxfp4 is not None
        self.tensors.update(virtual_tensors(self.tensors, self.mxfp4))  # Mxfp4Error names file

    def _add_packed(self) -> None:
        """Every `X.weight_packed` (+ `weight_scale`) becomes a readable `X.weight` of dtype
        PACKED whose shape is the dequantised one (convert/packed_int.py); header reads only."""
        assert self.packed is not None
        bits, group = self.packed.num_bits, self.packed.group_size
        for name in [n for n in self.tensors if n.endswith(".weight_packed")]:
            base = name.removesuffix("_packed")
            info = self.tensors[name]
            where = f"{info.file}: tensor {name!r}"
            if base in self.tensors:
                raise SourceError(f"{where}: the checkpoint also has {base!r}")
            scale = self.tensors.get(base + "_scale")
            if info.dtype != "I32" or len(info.shape) != 2 or scale is None \
                    or scale.dtype not in FLOAT_DTYPES or len(scale.shape) != 2 \
                    or scale.shape[0] != info.shape[0]:
                raise SourceError(f"{where}: a pack-quantized weight must be I32 [rows, words] "
                                  f"with a float {base + '_scale'!r} [rows, groups]")
            if base + "_g_idx" in self.tensors or base + "_zero_point" in self.tensors:
                raise SourceError(f"{where}: permuted groups or zero points are not supported")
            if group is None:
                cols = self._stored_shape(base)[1]
            else:
                cols = scale.shape[1] * group
            if scale.shape[1] != (1 if group is None else cols // group) \
                    or info.shape[1] != packed_words(cols, bits):
                raise SourceError(f"{where}: {list(info.shape)} with scales "
                                  f"{list(scale.shape)} is not {bits}-bit "
                                  f"{'per-row' if group is None else f'groups of {group}'}")
            self.tensors[base] = TensorInfo(info.file, PACKED, (info.shape[0], cols),
                                            info.start, info.end)

    def _stored_shape(self, base: str) -> tuple[int, int]:
        """`X.weight_shape` of a packed weight: its original [rows, cols]."""
        name = base + "_shape"
        info = self.info(name)
        if info.dtype not in ("I32", "I64") or info.shape != (2,):
            raise SourceError(f"{info.file}: tensor {name!r} must be two integers")
        raw = self._raw(info, SourceRef(name), (2,))
        rows, cols = (int(v) for v in np.frombuffer(raw, dtype=f"<i{DTYPE_SIZES[info.dtype]}"))
        return rows, cols

    def _block_size(self) -> tuple[int, int] | None:
        """`quantization_config.weight_block_size` (fp8 scale blocks), validated."""
        q = self.config.get("quantization_config")
        block = q.get("weight_block_size") if isinstance(q, dict) else None
        if block is None:
            return None
        if not (isinstance(block, list) and len(block) == 2
                and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise SourceError("config.json: quantization_config.weight_block_size must be two "
                              f"positive integers, got {block!r}")
        return block[0], block[1]

    # -- discovery -------------------------------------------------------------------------
    def _weight_files(self, weightless: bool) -> list[str]:
        index = self.dir / INDEX_NAME
        self._weight_map: dict[str, str] | None = None
        if index.exists():
            self._weight_map, files = index_shards(index)
            for f in files:
                if problem := self._not_a_file(f):
                    raise SourceError(f"{f}: listed in {INDEX_NAME} but {problem}")
            return files
        if os.path.lexists(self.dir / SINGLE_NAME):
            if problem := self._not_a_file(SINGLE_NAME):
                raise SourceError(f"{SINGLE_NAME}: {problem}")
            return [SINGLE_NAME]
        if weightless:
            return []
        raise SourceError(f"{self.dir}: no {SINGLE_NAME} and no {INDEX_NAME}, so no weights to "
                          "convert (--dry-run plans the container from config.json alone)")

    def _not_a_file(self, name: str) -> str | None:
        """Why weight file `name` cannot be read as one, or None. Links are followed (the hub
        cache's snapshots are links to blobs); a FIFO would block the reader, a device never
        end."""
        path = self.dir / name
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            if os.path.islink(path):
                return f"is a symbolic link to a missing file ({printable(os.readlink(path))})"
            return f"missing from {self.dir}"
        except OSError as e:
            return f"cannot be read: {e.strerror or e}"
        if stat.S_ISREG(mode):
            return None
        link = (f" (a symbolic link to {printable(os.readlink(path))})"
                if os.path.islink(path) else "")
        return f"is {file_kind(mode)}{link}, not a regular file"

    def _check_index(self) -> None:
        if self._weight_map is None:
            return
        for tname, fname in self._weight_map.items():
            info = self.tensors.get(tname)
            if info is None or info.file != fname:
                raise SourceError(f"{fname}: has no tensor {tname!r} although {INDEX_NAME} says so")

    def blob_files(self) -> list[str]:
        """The BLOB_FILES present (anything by that name: what is not a readable file is
        refused by `blob_sizes`, not silently left out)."""
        return [n for n in BLOB_FILES if os.path.lexists(self.dir / n)]

    def blob_sizes(self) -> dict[str, int]:
        """name -> size of the files carried as blobs, each checked as the runtime will read it
        (`check_blob`) before anything is written; checked once per Checkpoint."""
        if self._blob_sizes is None:
            self._blob_sizes = {n: len(check_blob(self.dir / n)) for n in self.blob_files()}
        return dict(self._blob_sizes)

    def stored(self, name: str) -> tuple[str, ...]:
        """The checkpoint tensors that `read(SourceRef(name))` reads: a pack-quantized or MXFP4
        weight is several, an fp8 weight has its scales."""
        dtype = self.info(name).dtype
        if dtype == PACKED:
            return name + "_packed", name + "_scale", name + "_shape"
        if dtype == MXFP4:
            assert self.mxfp4 is not None
            return part_names(name, self.mxfp4)
        if dtype == FP8:
            return name, name.removesuffix("weight") + "weight_scale_inv"
        return (name,)

    def stored_names(self) -> list[str]:
        """Every tensor the safetensors headers list (not the dequantised views added)."""
        return [n for n, i in self.tensors.items() if i.dtype not in (PACKED, MXFP4)]

    # -- shapes ----------------------------------------------------------------------------
    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise SourceError(
                f"tensor {name!r} missing from the checkpoint in {self.dir}") from None

    def ref_shape(self, ref: SourceRef) -> tuple[int, ...]:
        """Shape of the array `read(ref)` returns, from the header alone."""
        shape = self.info(ref.name).shape
        if ref.index is not None:
            if len(shape) < 1 or ref.index >= shape[0]:
                raise SourceError(f"{self.info(ref.name).file}: tensor {ref.name!r} {list(shape)} "
                                  f"has no expert {ref.index}")
            shape = shape[1:]
        if ref.rows is not None:
            lo, hi = ref.rows
            if not shape or hi > shape[0]:
                raise SourceError(f"{self.info(ref.name).file}: tensor {ref.name!r} has "
                                  f"{shape[0] if shape else 0} rows, need {hi}")
            shape = (hi - lo, *shape[1:])
        return shape

    def check_shape(self, ref: SourceRef, expected: tuple[int, ...], what: str) -> None:
        got = self.ref_shape(ref)
        if tuple(got) != tuple(expected):
            raise SourceError(f"{self.info(ref.name).file}: tensor {ref.name!r} has shape "
                              f"{list(got)}, but config.json implies {list(expected)} for {what}")

    def check_readable(self, ref: SourceRef) -> None:
        """Refuse, from the header alone, a tensor `read` could not decode (planning time)."""
        info = self.info(ref.name)
        if info.dtype == PACKED:
            if ref.index is not None:
                raise SourceError(f"{info.file}: tensor {ref.name!r}: pack-quantized weights "
                                  "are read per tensor only")
            return
        if info.dtype == MXFP4:
            return
        if info.dtype not in FLOAT_DTYPES + (FP8,):
            raise SourceError(f"{info.file}: tensor {ref.name!r} has unsupported dtype "
                              f"{info.dtype} (convert reads {', '.join(FLOAT_DTYPES + (FP8,))})")
        if info.dtype == FP8:
            self._fp8_scale(info, ref)

    # -- data ------------------------------------------------------------------------------
    def read(self, ref: SourceRef) -> np.ndarray:
        """The referenced values as a C-contiguous float32 array, all finite."""
        self.check_readable(ref)
        info = self.info(ref.name)
        shape = self.ref_shape(ref)
        if info.dtype in (PACKED, MXFP4):
            w = self._read_packed(info, ref) if info.dtype == PACKED else self._read_mxfp4(ref)
            check_finite(w, info.file, ref.name)
            return w
        w = to_f32(self._raw(info, ref, shape), info.dtype, shape)
        if info.dtype == FP8:
            w = self._dequant(info, ref, w)
        check_finite(w, info.file, ref.name)
        return w

    def _raw(self, info: TensorInfo, ref: SourceRef, shape: tuple[int, ...]) -> bytes:
        """The bytes of one tensor, or of one expert / row range of a fused one.

        pread at offsets from the validated header instead of an mmap (safe_open): the mapped
        pages would count in our RSS and memory must stay bounded; it also avoids importing
        torch in every worker."""
        item = DTYPE_SIZES[info.dtype]
        row = prod(shape[1:]) * item if len(shape) > 1 else item
        start = info.start
        if ref.index is not None:
            start += ref.index * prod(info.shape[1:]) * item
        if ref.rows is not None:
            start += ref.rows[0] * row
        return self._read_at(info, ref.name, start, prod(shape) * item)

    def _read_at(self, info: TensorInfo, name: str, start: int, length: int) -> bytes:
        """`length` bytes of `info.file` from `start` (a subclass reads them elsewhere: Ray
        workers of an hf: source, by checked HTTP range requests)."""
        path = self.dir / info.file
        try:
            with open(path, "rb", buffering=0) as f:
                data = os.pread(f.fileno(), length, start)
        except OSError as e:
            raise SourceError(f"{info.file}: cannot read tensor {name!r}: {e}") from e
        if len(data) != length:
            raise SourceError(f"{info.file}: truncated while reading tensor {name!r} "
                              f"({len(data)} of {length} bytes)")
        return data

    def _read_packed(self, info: TensorInfo, ref: SourceRef) -> np.ndarray:
        """Dequantised rows `ref.rows` (or all) of a pack-quantized weight."""
        assert self.packed is not None
        base, (rows, cols) = ref.name, info.shape
        stored = self._stored_shape(base)
        if stored != (rows, cols):
            raise SourceError(f"{info.file}: tensor {base + '_shape'!r} says {list(stored)}, "
                              f"the packed tensors {[rows, cols]}")
        lo, hi = ref.rows or (0, rows)
        packed, scale = self.info(base + "_packed"), self.info(base + "_scale")
        wshape, sshape = (hi - lo, packed.shape[1]), (hi - lo, scale.shape[1])
        raw = self._raw(packed, SourceRef(base + "_packed", rows=(lo, hi)), wshape)
        words = np.frombuffer(raw, dtype="<i4").reshape(wshape)
        s = to_f32(self._raw(scale, SourceRef(base + "_scale", rows=(lo, hi)), sshape),
                   scale.dtype, sshape)
        return dequantize(unpack(words, self.packed.num_bits, cols), s, self.packed.group_size)

    def _read_mxfp4(self, ref: SourceRef) -> np.ndarray:
        """Dequantised values of an MXFP4 tensor, or of one expert / row range of a fused one:
        the codes and scales tensors share the leading axes, so the same ref selects both."""
        assert self.mxfp4 is not None
        shape = self.ref_shape(ref)
        rows = prod(shape[:-1])  # value rows: each holds its own codes and scales
        codes, exps = (
            np.frombuffer(self._raw(self.info(n), SourceRef(n, ref.index, ref.rows),
                                    self.ref_shape(SourceRef(n, ref.index, ref.rows))),
                          dtype=np.uint8).reshape(rows, -1)
            for n in part_names(ref.name, self.mxfp4))
        try:
            w = mxfp4_dequantize(codes, exps, f"tensor {ref.name!r}")
        except Mxfp4Error as e:
            raise SourceError(f"{self.info(ref.name).file}: {e}") from None
        return w.reshape(shape)

    def _fp8_scale(self, info: TensorInfo, ref: SourceRef) -> tuple[str, tuple[int, int]]:
        """(scale tensor name, its grid) of an fp8 weight; SourceError when unusable."""
        where = f"{info.file}: tensor {ref.name!r}"
        if self.fp8_block is None:
            raise SourceError(f"{where} is fp8 but config.json has no "
                              "quantization_config.weight_block_size")
        b0 = self.fp8_block[0]
        lo = (ref.rows or (0, 0))[0]
        if ref.index is not None or len(info.shape) != 2 or lo % b0:
            raise SourceError(f"{where}: fp8 is supported for 2-D per-tensor weights only "
                              f"(row bands starting at multiples of {b0})")
        sname = ref.name.removesuffix("weight") + "weight_scale_inv"
        sinfo = self.info(sname)
        need = scale_grid(info.shape, self.fp8_block)
        if sinfo.shape != need or sinfo.dtype not in FLOAT_DTYPES:
            raise SourceError(f"{sinfo.file}: tensor {sname!r} is {sinfo.dtype} "
                              f"{list(sinfo.shape)}; block size {list(self.fp8_block)} needs "
                              f"a float tensor of shape {list(need)}")
        return sname, need

    def _dequant(self, info: TensorInfo, ref: SourceRef, w: np.ndarray) -> np.ndarray:
        assert self.fp8_block is not None
        sname, need = self._fp8_scale(info, ref)
        sinfo = self.info(sname)
        b0 = self.fp8_block[0]
        lo, hi = ref.rows or (0, info.shape[0])
        srows = (lo // b0, -(-hi // b0))  # the scale rows covering this band
        sshape = (srows[1] - srows[0], need[1])
        scale = to_f32(self._raw(sinfo, SourceRef(sname, rows=srows), sshape), sinfo.dtype, sshape)
        return dequant_blocks(w, scale, self.fp8_block)


def check_blob(path: Path) -> bytes:
    """The bytes of tokenizer file `path`, refused (SourceError naming it) unless the runtime
    can read it: `run`, `chat` and `serve` load tokenizer.json with the `tokenizers` library
    and the JSON files with the bounded loader, under the same limits (runtime/tokenizer.py);
    special_tokens_map.json and chat_template.jinja are what transformers reads after
    `export`. A broken one would otherwise convert and verify, then fail at the first prompt."""
    from moepack.format.limits import MAX_BLOB_RAW
    from moepack.runtime.tokenizer import (
        MAX_CONFIG_BYTES,
        MAX_GENERATION_CONFIG_BYTES,
        Tokenizer,
        TokenizerError,
    )

    name = path.name
    limits = {"tokenizer.json": MAX_BLOB_RAW, "generation_config.json": MAX_GENERATION_CONFIG_BYTES}
    data = read_small(path, limits.get(name, MAX_CONFIG_BYTES))
    if name == "tokenizer.json":
        try:
            Tokenizer(data)
        except TokenizerError as e:
            raise SourceError(f"{one_line(str(e))[:300]} (the tokenizers library cannot load "
                              "it, so run, chat and serve could not)") from None
    elif name.endswith(".json"):
        obj = loads(data, name, max_bytes=len(data), error=SourceError)
        if not isinstance(obj, dict):
            raise SourceError(f"{name}: expected a JSON object")
    else:  # a chat template: text
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SourceError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return data


def check_finite(w: np.ndarray, file: str, name: str) -> None:
    """NaN or Inf in a weight would convert, verify, then make `run` print garbage."""
    if not np.isfinite(w).all():
        first = int(np.flatnonzero(~np.isfinite(w.ravel()))[0])
        raise SourceError(f"{file}: tensor {name!r} holds non-finite values (NaN or Inf; first "
                          f"at element {first:,}); the checkpoint is damaged")
