"""`moepack export FILE OUTDIR`: a dequantised Hugging Face checkpoint that `transformers` loads as
is (config.json from the manifest, safetensors in native names and per-expert layout, tokenizer
files from the container's blobs). Built in `OUTDIR.partial`, renamed into place when complete.

Output folders are never deleted unless the user asked (`force`), and then only folders export
made itself: each carries the marker `.moepack-export.json` listing the files export writes
there, and a folder is removed only when it holds nothing else (no other file, folder or link).
A symbolic link at OUTDIR, OUTDIR.partial or OUTDIR.old is refused, never followed or removed.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np
from moepack.convert.adapters import EXPERT_PARTS, Adapter, adapter_for
from moepack.convert.errors import ConvertError
from moepack.convert.st_writer import DTYPES, TORCH_NAMES, tensor_nbytes, write_safetensors
from moepack.format import Container, FormatError
from moepack.format.mtp import mtp_layer_of

from moepack.durable import try_flock
from moepack.safefs import (
    UnsafePathError,
    child,
    name_problem,
    open_existing,
    plain_name,
    printable,
    read_bounded,
    write_file,
)
from moepack.untrusted_json import loads

SHARD_BYTES = 4 << 30
MARKER = ".moepack-export.json"
MARKER_FORMAT = "moepack-export/1"
MAX_MARKER_BYTES = 16 << 20  # a marker lists a few thousand names at most
SPACE_MARGIN = 1 << 20       # config.json, the marker, the index, filesystem metadata
HEADER_BYTES = 256           # a safetensors header entry, at most about this per tensor


def _entries(c: Container) -> list[tuple[str, tuple[int, ...], Callable[[], np.ndarray]]]:
    """(native name, shape, loader) for every weight, in the order transformers saves them."""
    try:
        adapter = adapter_for(c.manifest["source"]["config"])
    except ConvertError as e:  # the config inside a container, not a config.json on disk
        raise ConvertError(f"{c.path}: manifest source.config: {e}") from None
    out: list = []
    for t in adapter.trunk():
        _check_trunk(c, t.name, tuple(t.shape))
        out.append((t.sources[0], t.shape, lambda n=t.name: c.tensor(n)))
    for bank in c.banks():
        out += _bank_entries(c, adapter, bank)
    # multi-token-prediction layers (FORMAT.md §4.6), under the checkpoint's own names
    for layer in sorted({mtp_layer_of(n) for n in c.mtp_tensor_names()} - {None}):
        for t in adapter.mtp_tensors(layer):
            _check_trunk(c, t.name, tuple(t.shape))
            out.append((t.sources[0], t.shape, lambda n=t.name: c.tensor(n)))
    for bank in c.mtp_banks():
        out += _bank_entries(c, adapter, bank)
    return out


def _bank_entries(c: Container, adapter: Adapter, bank: dict) -> list:
    layer = bank["layer"]
    shapes = {p["name"]: tuple(p["shape"]) for p in bank["parts"]}
    out: list = []
    for e in range(bank["count"]):
        names = adapter.native_expert_names(layer, e)
        for part in EXPERT_PARTS:
            out.append((names[part], shapes[part],
                        lambda L=layer, e=e, p=part: c.expert_part(L, e, p)))
    return out


def _open(path: str | Path) -> Container:
    try:
        return Container.open(path)
    except FormatError as e:  # the reader's message names the field, not the file
        raise ConvertError(f"{path}: {e.with_code()}") from None


def _check_trunk(c: Container, name: str, shape: tuple[int, ...]) -> None:
    """The model the manifest describes must match the container's tensors (a hostile or damaged
    manifest would otherwise fail halfway through, after files were written)."""
    try:
        have = tuple(c.tensor_info(name)["shape"])
    except KeyError:
        raise ConvertError(f"{c.path}: the manifest's model needs tensor {printable(name)}, "
                           "which the container does not have") from None
    if have != shape:
        raise ConvertError(f"{c.path}: tensor {printable(name)} has shape {list(have)}, the "
                           f"manifest's model needs {list(shape)}")


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


def _shard_name(i: int, n: int) -> str:
    return "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _config(c: Container, dtype: str) -> dict:
    # the weights are plain floats now: no quantization_config (the adapter knows where)
    cfg = adapter_for(c.manifest["source"]["config"]).plain_config()
    cfg["dtype" if "dtype" in cfg or "torch_dtype" not in cfg else "torch_dtype"] = \
        TORCH_NAMES[dtype]
    return cfg


def _planned_files(c: Container, nshards: int) -> list[str]:
    """Every file export writes, blobs last; a blob may not take the name of export's own."""
    own = [_shard_name(i, nshards) for i in range(nshards)]
    own += ["model.safetensors.index.json"] if nshards > 1 else []
    own += ["config.json", MARKER]
    for name in c.blob_names():  # the reader allows only plain names (FORMAT.md §4.2): in depth
        plain_name(name, f"{c.path}: blob name")
        if name in own:
            raise ConvertError(f"{c.path}: blob {printable(name)} has the name of a file export "
                               "writes itself; refusing to export")
    return own + c.blob_names()


def export(path: str | Path, outdir: str | Path, *, dtype: str = "f32", force: bool = False,
           shard_bytes: int = SHARD_BYTES, on_tensor: Callable[[int], None] | None = None) -> dict:
    """Export container `path` to `outdir`; returns {outdir, files, tensors, bytes}."""
    if dtype not in DTYPES:
        raise ConvertError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    out = Path(os.path.abspath(outdir))
    if not out.name:
        raise ConvertError(f"{outdir}: cannot export to the root folder")
    tmp, old = _sibling(out, ".partial"), _sibling(out, ".old")
    _check_parents(out)
    lock = _lock_partial(tmp, out)  # first: a running export is said as such, never removed
    try:
        _check_outdir(out, force)
        for leftover in (tmp, old):
            _check_leftover(leftover, force)
        with _open(path) as c:
            entries = _entries(c)
            shards = _shards(entries, dtype, shard_bytes)
            files = _planned_files(c, len(shards))
            _check_space(out, _export_bytes(c, entries, dtype), (tmp, old))
            for leftover in (tmp, old):  # ours (checked above): only export's own files
                _remove_own(leftover)
            if lock is not None:  # the leftover it locked is gone
                os.close(lock)
                lock = None
            lock = _make_partial(tmp, files, out)
            try:
                weight_map = _write_files(c, tmp, entries, shards, dtype, on_tensor)
            except BaseException:
                _remove_own(tmp)  # this run's own folder: a failed export leaves nothing behind
                raise
        _replace_dir(tmp, out, old, force)
    finally:
        if lock is not None:
            os.close(lock)
    return {"outdir": str(outdir), "files": sorted(set(weight_map.values())),
            "tensors": len(entries), "bytes": sum(tensor_nbytes(s, dtype) for _, s, _ in entries)}


def _export_bytes(c: Container, entries: list, dtype: str) -> int:
    """Bytes the export writes: weights, their headers, blobs as stored decompressed."""
    weights = sum(tensor_nbytes(s, dtype) + HEADER_BYTES for _, s, _ in entries)
    return weights + sum(int(c.blob_info(n)["raw_length"]) for n in c.blob_names())


def _check_space(out: Path, size: int, leftovers: tuple[Path, ...]) -> None:
    """Refuse before writing when the export cannot fit (the earlier export at OUTDIR stays
    until the new one is complete, so it frees nothing; leftovers that --force removes do)."""
    where = out.parent
    while not where.is_dir() and where != where.parent:  # OUTDIR's parents are made as needed
        where = where.parent
    free = shutil.disk_usage(where).free + sum(_allocated(d) for d in leftovers)
    need = size + SPACE_MARGIN
    if free < need:
        raise ConvertError(f"not enough free space for {out}: need {need:,} bytes, {free:,} "
                           f"free on {where}; nothing was written")


def _allocated(folder: Path) -> int:
    """Bytes the regular files directly in `folder` (one export made) take on disk."""
    if _lstat(folder) is None:
        return 0
    with os.scandir(folder) as it:
        return sum(e.stat(follow_symlinks=False).st_blocks * 512 for e in it
                   if e.is_file(follow_symlinks=False))


def _write_files(c: Container, tmp: Path, entries: list, shards: list[list], dtype: str,
                 on_tensor: Callable[[int], None] | None) -> dict[str, str]:
    """Every planned file into tmp; returns the weight map (tensor name -> shard file)."""
    weight_map = _write_weights(tmp, shards, dtype, on_tensor)
    if len(shards) > 1:
        total = sum(tensor_nbytes(s, dtype) for _, s, _ in entries)
        _write_new(tmp, "model.safetensors.index.json", json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode())
    _write_new(tmp, "config.json", json.dumps(_config(c, dtype), indent=2).encode())
    for name in c.blob_names():
        _write_new(tmp, name, c.blob(name))
    return weight_map


def _write_weights(tmp: Path, shards: list[list], dtype: str,
                   on_tensor: Callable[[int], None] | None) -> dict[str, str]:
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        fname = _shard_name(i, len(shards))
        loaders = {name: load for name, _, load in shard}
        # tmp is a folder this run created (exclusive mkdir): nothing can be planted inside it
        write_safetensors(tmp / fname, [(n, s) for n, s, _ in shard], dtype,
                          lambda n, ld=loaders: _report(ld[n](), on_tensor))
        weight_map.update(dict.fromkeys(loaders, fname))
    return weight_map


def _write_new(folder: Path, name: str, data: bytes) -> None:
    """A new file folder/name: a plain name, created exclusively, never through a link."""
    write_file(child(folder, name, "blob name"), data, replace=False)


def _report(w: np.ndarray, on_tensor: Callable[[int], None] | None) -> np.ndarray:
    if on_tensor:
        on_tensor(w.nbytes)
    return w


# --- output folders: refuse what is not ours, remove only what we made --------------------------

def _sibling(out: Path, suffix: str) -> Path:
    return out.with_name(out.name + suffix)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _is_empty(folder: Path) -> bool:
    with os.scandir(folder) as it:
        return next(it, None) is None


def _check_parents(out: Path) -> None:
    """The folders above OUTDIR are made as needed; one that exists as something else (a file)
    is said as such, not as an OS error about OUTDIR."""
    for parent in out.parents:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            continue
        except NotADirectoryError:  # a file further up: found on a later step
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise ConvertError(f"{parent} is not a directory, so OUTDIR {out} cannot be made in "
                               "it")
        return


def _check_outdir(out: Path, force: bool) -> None:
    """OUTDIR may be missing or empty; a non-empty one is replaced only with force and only when
    an earlier export made it."""
    st = _lstat(out)
    if st is None:
        return
    if stat.S_ISLNK(st.st_mode):
        raise ConvertError(f"{out} is a symbolic link; refusing to write through or replace it")
    if not stat.S_ISDIR(st.st_mode):
        raise ConvertError(f"{out} exists and is not a folder; refusing to replace it")
    if _is_empty(out):
        return
    why = _not_ours(out)
    if why:
        raise ConvertError(f"{out} exists and was not made by moepack export ({why}); refusing "
                           "to replace it, even with --force: choose another OUTDIR")
    if not force:
        raise ConvertError(f"{out} exists and is not empty; pass --force to replace it")


def _check_leftover(path: Path, force: bool) -> None:
    """OUTDIR.partial / OUTDIR.old: removed only with force and only when export made it."""
    st = _lstat(path)
    if st is None:
        return
    if stat.S_ISLNK(st.st_mode):
        raise ConvertError(f"{path} is a symbolic link; refusing to follow or remove it: "
                           "move it away yourself")
    why = _not_ours(path) if stat.S_ISDIR(st.st_mode) else "not a folder"
    if why:
        raise ConvertError(f"{path} exists and was not made by moepack export ({why}); refusing "
                           "to remove it, even with --force: move it away yourself")
    if not force:
        raise ConvertError(f"{path} exists, left by an earlier export; pass --force to remove "
                           "it")


def _marker_files(folder: Path) -> set[str] | None:
    """The file names folder's export marker lists, or None without a readable marker."""
    try:  # never through a link, never blocking on a FIFO planted as the marker
        with os.fdopen(open_existing(folder / MARKER, os.O_RDONLY), "rb") as f:
            doc = loads(read_bounded(f, MAX_MARKER_BYTES), MARKER, max_bytes=MAX_MARKER_BYTES,
                        max_depth=4)
    except (OSError, ValueError, UnsafePathError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != MARKER_FORMAT:
        return None
    files = doc.get("files")
    if not isinstance(files, list) or any(name_problem(f) for f in files):
        return None
    return set(files) | {MARKER}


def _not_ours(folder: Path) -> str | None:
    """Why `folder` is not exactly what export made there (None when it is)."""
    listed = _marker_files(folder)
    if listed is None:
        return f"no {MARKER} marker"
    with os.scandir(folder) as it:
        for entry in it:
            if entry.name not in listed:
                return f"{printable(entry.name)} is not one of its files"
            if not entry.is_file(follow_symlinks=False):
                return f"{printable(entry.name)} is not a regular file"
    return None


def _remove_own(folder: Path) -> None:
    """Remove a folder export made (checked by _not_ours just before): its listed files only,
    then the folder itself, which fails if anything else appeared meanwhile."""
    if _lstat(folder) is None:
        return
    why = _not_ours(folder)
    if why:  # changed since the check: still never remove what is not ours
        raise ConvertError(f"{folder} was not made by moepack export ({why}); refusing to "
                           "remove it")
    listed = _marker_files(folder) or set()
    for name in sorted(listed - {MARKER}) + [MARKER]:
        try:
            os.unlink(folder / name)
        except FileNotFoundError:
            pass
    os.rmdir(folder)


def _busy(out: Path, tmp: Path, holder: str) -> str:
    return (f"{out}: another moepack export into this folder is running ({holder} holds "
            f"{tmp.name}); wait for it to finish, or stop it and rerun with --force")


def _lock_partial(tmp: Path, out: Path) -> int | None:
    """A descriptor holding an exclusive flock on an existing OUTDIR.partial (None when there
    is no real folder there: _check_leftover says what it is). The export building it holds
    that lock from creation to rename, so a second export is refused here, before it could
    take that folder for an earlier run's leftover and remove it under the first one."""
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    holder = try_flock(fd)
    if holder is not None:
        os.close(fd)
        raise ConvertError(_busy(out, tmp, holder))
    return fd


def _make_partial(tmp: Path, files: list[str], out: Path) -> int:
    """Create OUTDIR.partial exclusively (never an existing folder or link), lock it, mark it;
    returns the descriptor that holds the lock (see _lock_partial)."""
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(tmp, 0o755)
    except FileExistsError:
        raise ConvertError(f"{tmp} appeared while exporting (another export running?); rerun "
                           "once it is done") from None
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    holder = try_flock(fd)
    if holder is not None:  # another export looked at it in the instant before our lock
        os.close(fd)
        os.rmdir(tmp)  # still empty: nothing of anyone's is lost
        raise ConvertError(_busy(out, tmp, holder))
    try:
        marker = {"format": MARKER_FORMAT, "files": sorted(set(files) - {MARKER})}
        write_file(tmp / MARKER, json.dumps(marker, indent=2).encode() + b"\n", replace=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _replace_dir(tmp: Path, out: Path, old: Path, force: bool) -> None:
    """Move the finished export into place. An empty OUTDIR is removed (nothing is lost); an
    earlier export is parked at OUTDIR.old and removed only once the new one is in place."""
    _check_outdir(out, force)  # again: OUTDIR may have changed while exporting
    st = _lstat(out)
    parked = False
    if st is not None and _is_empty(out):
        os.rmdir(out)
    elif st is not None:
        os.rename(out, old)  # fails onto anything but a missing or empty folder
        parked = True
    try:
        os.rename(tmp, out)
    except BaseException:  # e.g. no room for the new entry: the earlier export back in place,
        if parked:         # never left at OUTDIR.old for a --force rerun to remove
            os.rename(old, out)
        _remove_own(tmp)
        raise
    if parked:
        _remove_own(old)
