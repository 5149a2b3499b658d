"""`moepack export FILE OUTDIR`: a dequantised Hugging Face checkpoint that `transformers` loads as
is (config.json from the manifest, safetensors in native names and per-expert layout, tokenizer
files from the container's blobs). Built in `OUTDIR.partial`, renamed into place when complete."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from moepack.convert.adapters import EXPERT_PARTS, adapter_for
from moepack.convert.errors import ConvertError
from moepack.convert.st_writer import DTYPES, TORCH_NAMES, tensor_nbytes, write_safetensors
from moepack.format import Container

SHARD_BYTES = 4 << 30


def _entries(c: Container) -> list[tuple[str, tuple[int, ...], Callable[[], np.ndarray]]]:
    """(native name, shape, loader) for every weight, in the order transformers saves them."""
    adapter = adapter_for(c.manifest["source"]["config"])
    out: list = []
    for t in adapter.trunk():
        out.append((t.sources[0], t.shape, lambda n=t.name: c.tensor(n)))
    for bank in c.banks():
        layer = bank["layer"]
        shapes = {p["name"]: tuple(p["shape"]) for p in bank["parts"]}
        for e in range(bank["count"]):
            names = adapter.native_expert_names(layer, e)
            for part in EXPERT_PARTS:
                out.append((names[part], shapes[part],
                            lambda L=layer, e=e, p=part: c.expert_part(L, e, p)))
    return out


def _shards(entries: list, dtype: str, limit: int) -> list[list]:
    shards: list[list] = [[]]
    used = 0
    for ent in entries:
        n = tensor_nbytes(ent[1], dtype)
        if shards[-1] and used + n > limit:
            shards.append([])
            used = 0
        shards[-1].append(ent)
        used += n
    return shards


def _config(c: Container, dtype: str) -> dict:
    cfg = dict(c.manifest["source"]["config"])
    cfg.pop("quantization_config", None)  # the weights are plain floats now
    cfg["dtype" if "dtype" in cfg or "torch_dtype" not in cfg else "torch_dtype"] = \
        TORCH_NAMES[dtype]
    return cfg


def export(path: str | Path, outdir: str | Path, *, dtype: str = "f32", force: bool = False,
           shard_bytes: int = SHARD_BYTES, on_tensor: Callable[[int], None] | None = None) -> dict:
    """Export container `path` to `outdir`; returns {files, tensors, bytes}."""
    if dtype not in DTYPES:
        raise ConvertError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    out = Path(outdir)
    if out.exists() and any(out.iterdir()) and not force:
        raise ConvertError(f"{out} exists and is not empty; pass --force to replace it")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with Container.open(path) as c:
        entries = _entries(c)
        shards = _shards(entries, dtype, shard_bytes)
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards):
            fname = ("model.safetensors" if len(shards) == 1
                     else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
            loaders = {name: load for name, _, load in shard}
            write_safetensors(tmp / fname, [(n, s) for n, s, _ in shard], dtype,
                              lambda n, ld=loaders: _report(ld[n](), on_tensor))
            weight_map.update(dict.fromkeys(loaders, fname))
        if len(shards) > 1:
            total = sum(tensor_nbytes(s, dtype) for _, s, _ in entries)
            (tmp / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        (tmp / "config.json").write_text(json.dumps(_config(c, dtype), indent=2))
        for name in c.blob_names():
            (tmp / name).write_bytes(c.blob(name))
    _replace_dir(tmp, out)
    return {"outdir": str(out), "files": sorted(set(weight_map.values())),
            "tensors": len(entries), "bytes": sum(tensor_nbytes(s, dtype) for _, s, _ in entries)}


def _report(w: np.ndarray, on_tensor: Callable[[int], None] | None) -> np.ndarray:
    if on_tensor:
        on_tensor(w.nbytes)
    return w


def _replace_dir(tmp: Path, out: Path) -> None:
    """Move the finished export into place; an old directory is removed only afterwards."""
    old = out.with_name(out.name + ".old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
