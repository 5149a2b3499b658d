"""The computations behind every conversion unit, from source to encoded bytes, with no container
I/O: a trunk tensor, a layer's codebook for one projection, one expert record.

Local workers (convert/worker.py) pwrite the results themselves; Ray tasks (convert/cluster.py)
return them to the driver, which writes them. Both call these functions, so both give the same
bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from moepack.convert.adapters import EXPERT_PARTS
from moepack.convert.errors import ConvertError, SourceError
from moepack.convert.quant import RvqSettings, encode, layer_seed, train_layer
from moepack.convert.rowchunks import encode_by_rows
from moepack.convert.source import Checkpoint, SourceRef
from moepack.format import BankLayout, pack_record
from moepack.format.codecs import decode

F32 = {"name": "f32"}


@dataclass(frozen=True)
class Codebook:
    """One projection's codebook as stored (`data`, `rotation` bytes) and as experts use it
    (`values`: the stored codebook decoded, f16 rounding included; `signs` or None)."""

    data: bytes
    rotation: bytes | None
    values: np.ndarray
    signs: np.ndarray | None


@contextmanager
def naming(ck: Checkpoint, ref: SourceRef) -> Iterator[None]:
    """Encoder complaints (e.g. inf/NaN weights) name the tensor and its file."""
    try:
        yield
    except ValueError as e:
        raise SourceError(f"{ck.info(ref.name).file}: tensor {ref.name!r}: {e}") from e


def encode_trunk(ck: Checkpoint, codec: dict, ref: SourceRef, threads: int) -> bytes | bytearray:
    """A trunk tensor; large 2-D tensors are read and encoded in row bands (bounded memory)."""
    base = ref.rows[0] if ref.rows else 0  # bands of a row range (a stacked conv's part)

    def band(lo: int, hi: int) -> np.ndarray:
        return ck.read(SourceRef(ref.name, ref.index, rows=(base + lo, base + hi)))

    with naming(ck, ref):
        return encode_by_rows(codec, ck.ref_shape(ref), band, threads=threads)


def train_codebook(ck: Checkpoint, bank: BankLayout, part: str, experts: Mapping[int, dict],
                   rvq: RvqSettings, seed: int, cb_codec: dict, rotated: bool,
                   threads: int) -> Codebook:
    """Train layer `bank.layer`'s codebook for `part` on a deterministic sample of its experts
    (`experts`: expert -> part -> SourceRef) and encode it as stored."""
    layer = bank.layer
    part_layout = bank.parts[EXPERT_PARTS.index(part)]
    try:
        trained, cb, signs = train_layer(lambda e: ck.read(experts[e][part]), len(experts),
                                         tuple(part_layout.shape), rvq,
                                         layer_seed(seed, layer, part), part=part,
                                         threads=threads)
    except ValueError as e:
        raise SourceError(f"layer {layer} experts ({part}): {e}") from e
    if trained != part_layout.codec:
        raise ConvertError(f"layer {layer} {part}: trained codec {trained} differs from the "
                           f"planned {part_layout.codec}")
    data = encode(cb_codec, np.asarray(cb, np.float32))
    # experts are encoded against the codebook as stored (f16: rounded), so codes and scales
    # fit what decoders use
    values = decode(cb_codec, cb.shape, data)
    if not np.isfinite(values).all():
        raise ConvertError(f"layer {layer} {part}: codebook not finite in {cb_codec['name']}")
    rotation = encode(F32, np.asarray(signs, np.float32)) if rotated else None
    return Codebook(bytes(data), None if rotation is None else bytes(rotation), values, signs)


def stored_codebook(cb_codec: dict, cb_shape: tuple[int, ...], stages: int, data: bytes,
                    rotation: bytes | None, cols: int) -> Codebook:
    """A codebook from its stored bytes (an earlier run's, or a Ray task's result): the same
    values the training run encoded its experts with."""
    values = decode(cb_codec, cb_shape, data).reshape(stages, 256, -1)
    signs = None if rotation is None else decode(F32, (cols,), rotation)
    return Codebook(data, rotation, values, signs)


def encode_expert(ck: Checkpoint, bank: BankLayout, refs: Mapping[str, SourceRef],
                  books: Mapping[str, Codebook], rvq: RvqSettings, threads: int) -> bytes:
    """One expert's record (all projections, packed as planned)."""
    codecs = {p.name: p.codec for p in bank.parts}
    parts = {}
    for part in EXPERT_PARTS:
        book, w = books[part], ck.read(refs[part])
        with naming(ck, refs[part]):
            parts[part] = encode(codecs[part], w, codebook=book.values, rotation=book.signs,
                                 settings=rvq, threads=threads)
    return pack_record(bank, parts)
