"""`moepack convert`: plan, check space, (re)start the journal, run the tasks, finalize.

Crash safety: the output is built in `OUT.moepack.partial` (header all zero until the very end, so
it never looks finished) and journaled in `OUT.moepack.journal`; rerunning the same command after
any interruption skips journaled units and produces byte-identical output.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from math import prod
from pathlib import Path

from moepack.convert.errors import ConvertError
from moepack.convert.fingerprint import FETCH_MANIFEST, fingerprint, manifest_files, stat_key
from moepack.convert.jobs import JobsChoice, choose_jobs
from moepack.convert.journal import Journal, journal_path
from moepack.convert.mapping import SourceMap
from moepack.convert.packed_int import PACKED
from moepack.convert.plan import Plan, checkpoint_plan, config_plan, weight_counts
from moepack.convert.progress import Reporter
from moepack.convert.resume import (
    check_same,
    damaged_units,
    journal_header,
    known_hashes,
    unit_lengths,
)
from moepack.convert.rowchunks import BAND_BYTES
from moepack.convert.runner import run_tasks, threads_per_worker
from moepack.convert.settings import Settings
from moepack.convert.source import INDEX_NAME, Checkpoint, SourceRef
from moepack.convert.tasks import (
    Task,
    blob_unit,
    codebook_names,
    expert_unit,
    make_tasks,
    tensor_unit,
)
from moepack.convert.worker import WorkerConfig
from moepack.format import ContainerWriter
from moepack.format.codecs import encoded_nbytes
from moepack.format.writer import partial_path

from moepack.durable import fsync_path
from moepack.sysinfo import usable_memory

SPACE_MARGIN = 64 << 20           # journal, filesystem metadata
BASE_RSS = 120 << 20              # interpreter + numpy + code: ~90 MB measured (bench/convert.py)


@dataclass
class Summary:
    container_id: str | None
    path: str
    file_size: int
    seconds: float
    weights: int
    expert_weights: int
    bits_per_weight: float
    expert_bits_per_weight: float
    resumed_units: int = 0
    peak_rss_worker: int = 0      # bytes; the largest of the workers (this process if --jobs 1)
    ray_nodes: int = 0            # --ray: nodes that ran at least one task
    plan: dict = field(default_factory=dict)


def peak_memory(plan: Plan, jobs: int) -> int:
    """Estimated peak RSS of the whole conversion (all workers), in bytes.

    Per worker: the base process, plus the larger of (a) the largest trunk tensor's encoded bytes
    plus one row band in f32 with the encoder's scratch (~5 copies, measured for q8) and (b) the
    layer's training sample (8-dim f32 vectors, ~4 copies in k-means) plus a few experts in f32.
    """
    trunk = max((encoded_nbytes(t.codec, t.shape) for t in plan.spec.tensors), default=0)
    band = BAND_BYTES * 6
    expert = sum(prod(p.shape) for p in plan.spec.banks[0].parts) * 4 if plan.spec.banks else 0
    sample = int(plan.spec.manifest["converter"]["settings"]["expert"]["sample"]) * 8 * 4 * 4
    per_worker = BASE_RSS + max(trunk + band, sample + 4 * expert)
    return per_worker * max(1, jobs)


def _plan_summary(plan: Plan, out: Path, choice: JobsChoice, free: int, done: int,
                  total: int, ray: str | None, weightless: bool = False,
                  resumes: Path | None = None) -> dict:
    weights, _ = weight_counts(plan)
    jobs = choice.jobs
    return {"output": str(out), "file_size": plan.layout.file_size, "ray": ray,
            "weightless": weightless, "mtp_layers": plan.adapter.mtp_layers,
            "free_space": free, "peak_memory_estimate": peak_memory(plan, jobs),
            "jobs": jobs, "jobs_choice": choice.describe(),
            "threads_per_worker": threads_per_worker(jobs),
            "tensors": len(plan.spec.tensors), "expert_banks": len(plan.spec.banks),
            "experts": sum(b.count for b in plan.spec.banks), "weights": weights,
            "units_done": done, "units_total": total, "output_exists": os.path.lexists(out),
            "resumes": None if resumes is None else str(resumes),
            "available_memory": usable_memory(),
            "codecs": plan.spec.manifest["codecs"]}


def _weightless_dry_run(ck: Checkpoint, out: Path, settings: Settings, jobs: int | None,
                        ray: str | None, t0: float) -> Summary:
    """The plan of a folder without weights, from its config.json (what `plan --config`
    sizes, with the folder's tokenizer files as blobs); the weight files a real checkpoint
    lists in the manifest are not in it."""
    plan = config_plan(ck.config, settings, blobs=ck.blob_sizes())
    choice = choose_jobs(jobs, peak_memory(plan, 1))
    info = _plan_summary(plan, out, choice, shutil.disk_usage(out.parent).free, 0,
                         len(unit_lengths(plan)), ray, weightless=True)
    return _summary(plan, out, None, t0, 0, info)


def _refuse_odd_entries(*paths: Path) -> None:
    """OUT.partial and OUT.journal are convert's own names: a link or a non-file planted there
    is refused before anything is written, never followed, truncated or removed."""
    for p in paths:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise ConvertError(f"{p} is a symbolic link; refusing to write through it or remove "
                               "it: move it away yourself")
        if not stat.S_ISREG(st.st_mode):
            raise ConvertError(f"{p} exists and is not a regular file; refusing to use it: move "
                               "it away yourself")


def convert(src: str | Path, out: str | Path, settings: Settings, *, jobs: int | None = 1,
            force: bool = False, restart: bool = False, dry_run: bool = False,
            reporter: Reporter | None = None, pause_per_unit: float = 0.0,
            ray: str | None = None,
            known_files: Mapping[str, tuple[int, int, str]] | None = None,
            execute: Execute | None = None, plan_only: bool = False) -> Summary:
    """Convert checkpoint `src` into container `out` (see the module docstring).

    jobs=None: usable cores bounded by memory (`convert.jobs.choose_jobs`), said in a message.
    ray: a Ray cluster address (`auto`: the local one) to run the units on instead of local
    workers (convert/cluster.py); the bytes are the same.
    known_files: name -> (size, mtime_ns, sha256) of weight files whose hash is known (streaming
    from the hub: the hub's, checked by every download); they are neither hashed nor scanned
    here (the encoders still check every value they read). execute: runs the tasks instead of
    the local workers (convert/stream.py's waves).
    dry_run: stop before writing anything, after every refusal the real run would give up to
    there (free space, a partial started with other settings or source); `plan.units_done`
    counts the journaled units a resume would start from. plan_only (with dry_run): the plan
    alone, for weight files that are stand-ins (convert/stream.py plans from their headers).
    pause_per_unit > 0 journals every unit and pauses that long after it (for tests that
    interrupt a conversion at a chosen point); it does not change the bytes."""
    rep = reporter or Reporter()
    t0 = time.monotonic()
    out = Path(out)
    partial, jpath = partial_path(out), journal_path(out)
    refuse_directory(out)
    if os.path.lexists(out) and not force and not dry_run:  # a dangling link is taken too
        raise ConvertError(f"{out} already exists; pass --force to replace it")
    if not out.parent.is_dir():  # a file there is not "missing": say what it is
        raise ConvertError(f"{out.parent}: " + ("not a directory" if os.path.lexists(out.parent)
                                               else "no such directory"))
    ck = Checkpoint(src, weightless=dry_run)
    _refuse_source_files(ck, (out, partial, jpath))
    if not ck.files:  # a dry run of config.json alone: its shapes, declared MTP layers assumed
        return _weightless_dry_run(ck, out, settings, jobs, ray, t0)
    # Validate every tensor and size the output before the (long) SHA-256 pass; hashes have a
    # fixed width, so the placeholder plan has the final size.
    plan, smap = checkpoint_plan(ck, settings)
    _refuse_odd_entries(partial, jpath)
    if not dry_run:  # before comparing its settings or source with ours
        Journal.refuse_if_running(jpath)
    if not plan_only:
        _check_packed_shapes(ck, smap, known_files or {})
    # --restart simply starts fresh: Journal.create locks before truncating anything.
    resuming = not restart and partial.exists() and Journal.read_header(jpath) is not None
    free = shutil.disk_usage(out.parent).free
    # A partial we are about to replace frees its blocks (lstat: a link never counts).
    reusable = partial.lstat().st_blocks * 512 if partial.exists() else 0
    need = 0 if resuming else max(0, plan.layout.file_size + SPACE_MARGIN - reusable)
    choice = choose_jobs(jobs, peak_memory(plan, 1))
    jobs = choice.jobs
    total = len(unit_lengths(plan))
    if dry_run:
        if plan_only:
            return _summary(plan, out, None, t0, 0,
                            _plan_summary(plan, out, choice, free, 0, total, ray))
        _refuse_short_space(out, need, free)
        done = _resumable(ck, settings, partial, jpath, known_files, plan) if resuming else 0
        info = _plan_summary(plan, out, choice, free, done, total, ray,
                             resumes=partial if resuming else None)
        return _summary(plan, out, None, t0, 0, info)
    summary_plan = _plan_summary(plan, out, choice, free, 0, total, ray)
    if choice.auto and not ray:
        rep.message(choice.describe())
    available = summary_plan["available_memory"]
    if available and not ray and summary_plan["peak_memory_estimate"] > available:
        rep.message(f"warning: estimated peak memory {summary_plan['peak_memory_estimate']:,} "
                    f"bytes exceeds the {available:,} available; consider fewer --jobs")
    _refuse_short_space(out, need, free)
    with _executor(ray, jobs, rep, execute) as run:  # Ray: connected before the hash pass
        known = {**(known_hashes(jpath) if resuming else {}), **(known_files or {})}
        rep.hashing(sum((ck.dir / f).stat().st_size for f in ck.files if f not in known))
        fp = fingerprint(ck.dir, ck.files, known, rep.hashed)
        plan, smap = checkpoint_plan(ck, settings, manifest_files(fp))
        header = journal_header(plan, fp)
        lengths = unit_lengths(plan)
        if resuming:
            check_same(Journal.read_header(jpath) or {}, header, partial)
            journal = Journal.resume(jpath)
            bad = damaged_units(partial, plan, journal.done, rep)
            journal.forget(bad)
            stale = _encoded_with_missing_codebooks(plan, journal.done)
            journal.forget(stale)
            redo = ([f"{len(bad)} damaged"] if bad else []) + \
                ([f"the {len(stale)} experts encoded with their codebooks"] if stale else [])
            rep.message(f"resuming {partial.name}: {len(journal.done)} of {len(lengths)} units done"
                        + (f"; {' and '.join(redo)}, redoing them" if redo else ""))
        else:  # journal first: its lock keeps a second run from truncating our partial
            journal = Journal.create(jpath, header)
            try:
                ContainerWriter(out, plan.layout, create=True, overwrite=force).close()
            except BaseException:  # e.g. the disk filled up while allocating: leave nothing
                journal.remove()
                partial.unlink(missing_ok=True)
                raise
        resumed = len(journal.done)
        stats: dict[str, int] = {}
        # Files hashed here are read in place all along; the hub's are checked as downloaded.
        watched = [f for f in fp if f["name"] not in (known_files or {})]
        try:
            cid = _run(ck, out, plan, make_tasks(plan, smap), journal, settings, run,
                       1 if ray else threads_per_worker(jobs), force, lengths, rep, stats,
                       _SourceWatch(ck.dir, watched), pause_per_unit)
            journal.remove()  # still locked: a run starting now never takes a removed journal
        except SourceChanged:
            # Units read before and after the change are mixed in the partial, and the journal
            # cannot tell which: nothing of it may be resumed.
            journal.remove()
            partial.unlink(missing_ok=True)
            raise
        finally:
            journal.close()
            rep.stop()
        return _summary(plan, out, cid, t0, resumed, summary_plan,
                        stats.get("peak_rss_worker", 0), stats.get("ray_nodes", 0))


def refuse_directory(out: Path) -> None:
    """OUT names the file to make: a directory there (or a link to one) would only fail at the
    final rename, after the whole conversion."""
    if out.is_dir():
        raise ConvertError(f"{out} is a directory; OUT must be a file path, e.g. "
                           f"{out / 'model.moepack'}")


def _refuse_source_files(ck: Checkpoint, paths: tuple[Path, ...]) -> None:
    """OUT, OUT.partial and OUT.journal must not be (by name, link or hard link) a file the
    conversion reads: --force would have it replaced, the source destroyed."""
    names = [*ck.files, "config.json", INDEX_NAME, FETCH_MANIFEST, *ck.blob_files()]
    ours: dict[tuple[int, int], str] = {}
    for name in names:
        try:
            st = (ck.dir / name).stat()
        except OSError:
            continue
        ours.setdefault((st.st_dev, st.st_ino), name)
    for p in paths:
        try:
            st = p.stat()
        except OSError:  # absent (or a dangling link): nothing of the source's there
            continue
        name = ours.get((st.st_dev, st.st_ino))
        if name is not None:
            raise ConvertError(f"{p} is the source's {name} ({ck.dir}); refusing to write "
                               "over a file the conversion reads: choose another OUT")


def _check_packed_shapes(ck: Checkpoint, smap: SourceMap,
                         skip: Mapping[str, object]) -> None:
    """A pack-quantized weight's `weight_shape` is data, not header: read it (with the first
    row) for every such weight now, so a wrong one is refused before anything is written.
    `skip`: files not on disk yet (hub shards, checked when they arrive)."""
    refs = [r for _, r in smap.trunk] + [r for parts in smap.experts.values()
                                         for r in parts.values()]
    seen: set[str] = set()
    for ref in refs:
        info = ck.tensors.get(ref.name)
        if info is None or info.dtype != PACKED or info.file in skip or ref.name in seen:
            continue
        seen.add(ref.name)
        if info.shape[0]:
            ck.read(SourceRef(ref.name, rows=(0, 1)))


def _refuse_short_space(out: Path, need: int, free: int) -> None:
    if free < need:
        raise ConvertError(f"not enough free space for {out}: need {need:,} bytes, "
                           f"{free:,} free on {out.parent}; nothing was written")


def _resumable(ck: Checkpoint, settings: Settings, partial: Path, jpath: Path,
               known_files: Mapping[str, tuple[int, int, str]] | None, plan: Plan) -> int:
    """A dry run's view of the resume: refused as the real run would refuse it (the source
    fingerprinted the same way: only files changed since the journal are hashed), else the
    number of journaled units (the real run checks their bytes before trusting them)."""
    known = {**known_hashes(jpath), **(known_files or {})}
    fp = fingerprint(ck.dir, ck.files, known)
    full, _ = checkpoint_plan(ck, settings, manifest_files(fp))
    check_same(Journal.read_header(jpath) or {}, journal_header(full, fp), partial)
    lengths = unit_lengths(plan)
    return sum(1 for u in Journal.read_done(jpath) if u in lengths)


def _encoded_with_missing_codebooks(plan: Plan, done: Mapping[str, str]) -> list[str]:
    """Journaled experts of layers whose codebook (or rotation) is to be redone: their codes
    index those codebooks, so they are redone with them."""
    out = []
    for b in plan.layout.banks():
        books = [tensor_unit(n) for cb, rot in codebook_names(plan, b.layer).values()
                 for n in (cb, rot) if n is not None]
        if any(u not in done for u in books):
            out += [u for e in range(b.count) if (u := expert_unit(b.layer, e)) in done]
    return out


class SourceChanged(ConvertError):
    """A source file read in place changed while the conversion was reading it."""


class _SourceWatch:
    """Size and mtime of the source files as fingerprinted, compared again while units arrive
    (at most once a second: a change stops the run early) and before finalizing."""

    INTERVAL = 1.0

    def __init__(self, directory: Path, files: list[dict]) -> None:
        self.dir, self.files, self._last = directory, files, -self.INTERVAL

    def check(self, out: Path, force: bool = True) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.INTERVAL:
            return
        self._last = now
        for f in self.files:
            try:
                same = stat_key(self.dir / f["name"]) == (f["size"], f["mtime_ns"])
            except OSError:
                same = False
            if not same:
                raise SourceChanged(
                    f"{self.dir / f['name']}: changed while it was converted (size or "
                    f"modification time); {out} was not written and the partial output was "
                    "removed: rerun to convert the source as it is now")


def _run(ck: Checkpoint, out: Path, plan: Plan, tasks: list[Task], journal: Journal,
         settings: Settings, execute: Execute, threads: int, force: bool,
         lengths: dict[str, int], rep: Reporter, stats: dict[str, int],
         watch: _SourceWatch, pause_per_unit: float = 0.0) -> str:
    _write_blobs(ck, out, plan, journal, force)
    todo = [t for t in tasks if any(u not in journal.done for u in t.units())]
    n_exp = sum(b.count for b in plan.layout.banks())
    done_exp = sum(1 for u in journal.done if u.startswith("expert:"))
    done_bytes = sum(lengths.get(u, 0) for u in journal.done)
    rep.start((len(tasks) - len(todo), len(tasks)), (done_exp, n_exp),
              (done_bytes, sum(lengths.values())))

    def on_message(msg: tuple) -> None:
        if msg[0] == "units":
            watch.check(out, force=False)  # units read from a changed file are not journaled
            journal.record(msg[1])
            rep.advance(experts=msg[3], nbytes=msg[2])
        elif msg[0] == "task_done":
            stats["peak_rss_worker"] = max(stats.get("peak_rss_worker", 0), msg[2])
            rep.advance(layers=1)
        elif msg[0] == "node":
            nodes.add(msg[1])
            stats["ray_nodes"] = len(nodes)

    nodes: set[str] = set()
    cfg = WorkerConfig(ck.dir, out, plan.layout, settings.rvq, settings.seed,
                       threads, force,
                       {b.layer: codebook_names(plan, b.layer) for b in plan.layout.banks()},
                       pause_per_unit)
    execute(cfg, todo, dict(journal.done), on_message)
    missing = [u for u in lengths if u not in journal.done]
    if missing:  # not ConvertError: nothing the user did, so the CLI reports it as a bug
        raise RuntimeError(f"{len(missing)} units never written ({missing[:3]})")
    watch.check(out)
    hashes: dict = {}
    for unit, hexd in journal.done.items():
        kind, _, rest = unit.partition(":")
        key = (int(rest.split(":")[0]), int(rest.split(":")[1])) if kind == "expert" else rest
        hashes[key] = bytes.fromhex(hexd)
    writer = ContainerWriter(out, plan.layout, create=False, overwrite=force)
    try:
        return writer.finalize(hashes)
    finally:
        writer.close()


Execute = Callable[[WorkerConfig, list[Task], dict[str, str], Callable[[tuple], None]], None]


@contextmanager
def _executor(ray: str | None, jobs: int, rep: Reporter,
              given: Execute | None = None) -> Iterator[Execute]:
    """`given`, local worker processes, or the Ray cluster at `ray` (connected here, so a
    missing Ray or an unreachable cluster is reported before hours of hashing)."""
    if given is not None:
        yield given
        return
    if ray is None:
        yield lambda cfg, tasks, done, on_message: run_tasks(cfg, tasks, done, jobs, on_message)
        return
    from moepack.convert.cluster import connect, run_on_ray

    with connect(ray) as cluster:
        rep.message(cluster.describe())
        yield lambda cfg, tasks, done, on_message: run_on_ray(cfg, tasks, done, cluster,
                                                              on_message)


def _write_blobs(ck: Checkpoint, out: Path, plan: Plan, journal: Journal, force: bool) -> None:
    blobs = [e.name for e in plan.layout.sections
             if e.type == "blob" and blob_unit(e.name) not in journal.done]
    if not blobs:
        return
    writer = ContainerWriter(out, plan.layout, create=False, overwrite=force)
    try:
        units = [(blob_unit(n), writer.write_blob(n, (ck.dir / n).read_bytes()).hex())
                 for n in blobs]
    finally:
        writer.close()
    fsync_path(partial_path(out))  # durable before journaled
    journal.record(units)


def _summary(plan: Plan, out: Path, cid: str | None, t0: float, resumed: int,
             plan_info: dict, rss: int = 0, ray_nodes: int = 0) -> Summary:
    weights, experts = weight_counts(plan)
    bank_bytes = sum(b.count * b.stride for b in plan.layout.banks())
    return Summary(cid, str(out), plan.layout.file_size, round(time.monotonic() - t0, 3),
                   weights, experts, round(plan.layout.file_size * 8 / max(1, weights), 4),
                   round(bank_bytes * 8 / max(1, experts), 4), resumed, rss, ray_nodes, plan_info)
