"""Subcommands of `moepack` provided by moepack.convert: `convert` and `export`."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from moepack.cliargs import (
    INT32_MAX,
    choice,
    error_line,
    finite_range,
    printable,
    size_option,
    usage,
)
from moepack.sizes import SIZE_HELP, format_size, parse_size

QUANTISED_CLASSES = ("attn", "shared_expert", "dense_ffn", "embed", "lm_head")
INT63_MAX = 2**63 - 1   # the manifest's JSON integers are int64 (FORMAT.md §3)
DTYPES = ("f32", "bf16", "f16")  # export's; convert/st_writer.py's DTYPES
SHARD_GB = (0.001, 1e6)  # export --shard-gb: 1 MB (tests) up to 1 PB


_PROGRESS_MODES = choice("bars", "lines", "json")  # convert/progress_lines.py MODES


def _bad(option: str, message: str) -> typer.BadParameter:
    """A usage error (exit 2) naming `option`, raised outside its own callback."""
    return typer.BadParameter(message, param_hint=f"'{option}'")


def expert_codec_option(value: str | None) -> str | None:
    """Typer callback of --expert-codec: a preset name."""
    from moepack.convert.quant import EXPERT_PRESETS

    if value is not None and value not in EXPERT_PRESETS:
        raise typer.BadParameter(f"{printable(value, 40)} is not an expert codec preset; choose "
                                 f"one of {', '.join(sorted(EXPERT_PRESETS))}")
    return value


def trunk_codec_option(value: str | None) -> str | None:
    """Typer callback of --trunk-codec: a trunk codec name (every quantised class takes each)."""
    from moepack.convert.quant import TRUNK_CODECS

    if value is not None and value not in TRUNK_CODECS:
        raise typer.BadParameter(f"{printable(value, 40)} is not a trunk codec; choose one of "
                                 f"{', '.join(sorted(TRUNK_CODECS))}")
    return value


def codec_option(values: list[str] | None) -> list[str] | None:
    """Typer callback of --codec: each item CLASS=CODEC, a codec that CLASS takes."""
    from moepack.convert.quant import TRUNK_CODECS, TRUNK_DEFAULTS
    from moepack.format.rules import CLASS_CODECS

    for item in values or []:
        cls, sep, name = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"{printable(item, 40)} is not CLASS=CODEC (e.g. attn=q8)")
        if cls not in TRUNK_DEFAULTS:
            raise typer.BadParameter(f"{printable(cls, 40)} is not a tensor class; classes: "
                                     f"{', '.join(sorted(TRUNK_DEFAULTS))}")
        allowed = CLASS_CODECS.get(cls, tuple(sorted(TRUNK_CODECS)))
        if name not in allowed:
            raise typer.BadParameter(f"{printable(name, 40)} is not a codec of class {cls}; "
                                     f"choose one of {', '.join(allowed)}")
    return values


def _between(lo: float, hi: float, unit: str = ""):
    """Typer callback: a number from `lo` to `hi` (NaN refused), the range said in full."""
    def check(value: float | None) -> float | None:
        if value is not None and not lo <= value <= hi:  # NaN compares false: refused too
            raise typer.BadParameter(f"{value} is not from {lo:g}{unit} to {hi:g}{unit}"
                                     if isinstance(lo, float) else
                                     f"{value} is not an integer from {lo} to {hi}")
        return value
    return check


def _alignment_option(value: int) -> int:
    """Typer callback of --alignment: what the format accepts (FORMAT.md §2)."""
    from moepack.format.limits import MAX_ALIGNMENT, MIN_ALIGNMENT

    if not MIN_ALIGNMENT <= value <= MAX_ALIGNMENT or value & (value - 1):
        raise typer.BadParameter(f"{value} is not a power of two from {MIN_ALIGNMENT} to "
                                 f"{MAX_ALIGNMENT}")
    return value


def _named(example: str):
    """Typer callback of OUT or OUTDIR: a path that names something (`""` arrives as `.`)."""
    def check(value: Path) -> Path:
        if value.name in ("", ".", ".."):
            raise typer.BadParameter(f"{printable(str(value), 80)} is empty or ends in . or ..; "
                                     f"give a path such as {example}")
        return value
    return check


def _fail(msg: str) -> typer.Exit:
    """The shared one error line (escaped: messages quote names from the checkpoint and text
    like moepack[cluster]); the caller raises the exit, so `raise _fail(...) from None` reads."""
    error_line(msg)
    return typer.Exit(code=1)


def _settings(expert_codec: str | None, trunk_codec: str | None, codec: list[str], seed: int,
              alignment: int, sample: int | None, iters: int | None, mtp: str = "keep"):
    from moepack.convert.settings import Settings

    trunk = [(cls, trunk_codec) for cls in QUANTISED_CLASSES] if trunk_codec else []
    for item in codec_option(codec) or []:
        cls, _, name = item.partition("=")
        trunk = [t for t in trunk if t[0] != cls] + [(cls, name)]
    preset = {} if expert_codec is None else {"expert_preset": expert_codec}  # None: the default
    return Settings(**preset, trunk=tuple(sorted(trunk)), seed=seed, alignment=alignment,
                    sample=sample, iters=iters, mtp=mtp)


# Module-level option objects (ruff B008); Optional[...] because typer parses annotations at
# runtime and `X | None` is not understood on Python 3.10.
_SRC = typer.Argument(..., show_default=False,
                      help="Hugging Face checkpoint directory, or hf:ORG/REPO\\[@REV] to convert "
                      "straight from the hub (with --staging).")
_OUT = typer.Argument(..., help="Output container, e.g. model.moepack.", show_default=False,
                      callback=_named("model.moepack"))
_JOBS = typer.Option(None, "--jobs", "-j", min=1, show_default=False,
                     help="Worker processes (one layer at a time each); default: usable cores "
                     "(cgroup-aware), bounded by the memory estimate.")
_RAY = typer.Option(None, "--ray", show_default=False, metavar="ADDRESS",
                    help="Run the work as tasks on this Ray cluster (host:port; auto: the local "
                    "cluster, started if there is none). SRC must be the same path on every "
                    "node, or hf:ORG/REPO (read from the hub by every node). Needs pip install "
                    "'moepack\\[cluster]'.")
_STAGING = typer.Option(None, "--staging", show_default=False, metavar="SIZE",
                        callback=size_option,
                        help="hf: sources: most bytes of source shards on disk at once "
                        "(e.g. 40G); shards are downloaded as needed and deleted when done. "
                        f"{SIZE_HELP} "
                        "Not needed with --ray: tasks read checked byte ranges from the hub.")
_EXPERT = typer.Option(None, "--expert-codec", show_default=False, callback=expert_codec_option,
                       help="Expert codec preset: rvq3-l (default), rvq3-m, rvq3, rvq4, rvq2...")
_TRUNK = typer.Option(None, "--trunk-codec", callback=trunk_codec_option,
                      help="Codec of all quantised trunk classes (q8, q6, q4...).")
_CODEC = typer.Option(None, "--codec", callback=codec_option,
                      help="Trunk codec of one class, CLASS=CODEC (repeatable).")
_SEED = typer.Option(0, "--seed", callback=_between(0, INT63_MAX),
                     help="Seed of codebook sampling and training (0 to 2^63-1).")
_ALIGN = typer.Option(4096, "--alignment", callback=_alignment_option,
                      help="Expert record alignment in bytes (a power of two, 512 to 2^24).")
_SAMPLE = typer.Option(None, "--sample", callback=_between(1, INT32_MAX),
                       help="Training vectors per projection (preset default; at least 1).")
_ITERS = typer.Option(None, "--iters", callback=_between(1, INT32_MAX),
                      help="Lloyd iterations (preset default; at least 1).")
_MTP = typer.Option("keep", "--mtp", callback=choice("keep", "drop"),
                    help="Multi-token-prediction layers (DeepSeek-V3, GLM-4.5): keep (when the "
                    "checkpoint has them; not run by the engine, kept for speculative decoding) "
                    "or drop. See docs/CONVERT.md for the cost.")
_DRY = typer.Option(False, "--dry-run", help="Print the plan and stop.")
_FORCE = typer.Option(False, "--force", help="Replace an existing finished output.")
_EXPORT_FORCE = typer.Option(False, "--force", help="Replace OUTDIR and remove OUTDIR.partial / "
                             "OUTDIR.old, only if an earlier export made them.")
_RESTART = typer.Option(False, "--restart", help="Discard an unfinished conversion of OUT.")
_QUIET = typer.Option(False, "--quiet", "-q", help="No progress display.")
_JSON = typer.Option(False, "--json", help="Print a JSON summary on stdout.")
_PROGRESS = typer.Option(None, "--progress", show_default=False, metavar="bars|lines|json",
                         callback=lambda v: None if v is None else _PROGRESS_MODES(v),
                         help="Progress on stderr: bars, or one line per --progress-every "
                         "seconds as text (lines) or JSON (json); default: bars on a terminal, "
                         "lines otherwise, none with --json.")
_EVERY = typer.Option(60.0, "--progress-every", callback=finite_range(0.0),
                      help="Seconds between progress lines.")
_PAUSE = typer.Option(0.0, "--pause-per-unit", hidden=True, callback=finite_range(0.0),
                      help="Journal every unit and pause this many seconds (tests).")
_FILE = typer.Argument(..., help="A .moepack container.", show_default=False)
_OUTDIR = typer.Argument(..., help="Directory for the Hugging Face checkpoint.",
                         show_default=False, callback=_named("hf-model"))
_DTYPE = typer.Option("f32", "--dtype", callback=choice(*DTYPES),
                      help="Weight dtype of the export: f32, bf16 or f16.")
_SHARD = typer.Option(4.0, "--shard-gb", callback=_between(*SHARD_GB, " GB"),
                      help="Maximum safetensors shard size in GB (0.001 to 10^6).")


@contextmanager
def _warning_lines() -> Iterator[None]:
    """The converter's warnings about the source (plan.UnusedTensorsWarning) as one
    `warning: ...` line each on stderr, once, even with --quiet or --json: they say what the
    container leaves out, not how far the work is."""
    from moepack.convert.plan import UnusedTensorsWarning

    shown: set[str] = set()

    def show(message, category, *_args, **_kwargs) -> None:
        text = str(message)
        if text not in shown:
            shown.add(text)
            error_line(text, "warning")

    with warnings.catch_warnings():
        warnings.simplefilter("always", UnusedTensorsWarning)
        warnings.showwarning = show
        yield


def convert_cmd(
    cli: typer.Context,
    src: Path = _SRC,
    out: Path = _OUT,
    jobs: Optional[int] = _JOBS,  # noqa: UP045
    ray: Optional[str] = _RAY,  # noqa: UP045
    staging: Optional[str] = _STAGING,  # noqa: UP045
    expert_codec: Optional[str] = _EXPERT,  # noqa: UP045
    trunk_codec: Optional[str] = _TRUNK,  # noqa: UP045
    codec: Optional[list[str]] = _CODEC,  # noqa: UP045
    seed: int = _SEED,
    alignment: int = _ALIGN,
    sample: Optional[int] = _SAMPLE,  # noqa: UP045
    iters: Optional[int] = _ITERS,  # noqa: UP045
    mtp: str = _MTP,
    dry_run: bool = _DRY,
    force: bool = _FORCE,
    restart: bool = _RESTART,
    quiet: bool = _QUIET,
    as_json: bool = _JSON,
    progress: Optional[str] = _PROGRESS,  # noqa: UP045
    progress_every: float = _EVERY,
    pause_per_unit: float = _PAUSE,
) -> None:
    """Convert a Hugging Face MoE checkpoint into a .moepack container (resumable)."""
    from moepack.convert.errors import ConvertError
    from moepack.convert.pipeline import convert
    from moepack.convert.progress_lines import choose_reporter
    from moepack.format import FormatError

    from moepack.safefs import UnsafePathError

    if ray is not None and jobs is not None:
        usage("--jobs and --ray exclude each other (with --ray the cluster's CPUs work)", cli)
    if ray is not None and not ray.strip():
        raise _bad("--ray", "expects an address (host:port) or auto")
    hub = str(src).startswith("hf:")
    if hub and staging is None and ray is None:
        usage("hf: sources need --staging SIZE (the most source bytes kept on disk, e.g. 40G; at "
              "least the largest shard)", cli)
    if staging is not None and not hub:
        usage("--staging is for hf:ORG/REPO sources (a local SRC is read in place)", cli)
    reporter = choose_reporter(progress, progress_every, quiet or dry_run, as_json)
    try:
        settings = _settings(expert_codec, trunk_codec, codec or [], seed, alignment, sample, iters,
                             mtp)
        with _warning_lines():
            if hub:
                return _convert_hub(str(src), out, settings, staging or "0", jobs, force,
                                    restart, dry_run, reporter, pause_per_unit, as_json, quiet,
                                    ray)
            summary = convert(src, out, settings, jobs=jobs, force=force, restart=restart,
                              dry_run=dry_run, reporter=reporter, pause_per_unit=pause_per_unit,
                              ray=ray)
    except (ConvertError, FormatError, UnsafePathError, OSError) as e:
        raise _fail(str(e)) from None
    except KeyboardInterrupt:
        raise _fail("interrupted; rerun the same command to continue") from None
    if as_json:
        typer.echo(json.dumps(asdict(summary), sort_keys=True))
        return
    p = summary.plan
    if dry_run:
        if p["weightless"]:
            mtp = p["mtp_layers"]
            typer.echo(f"no weights in {src} (no model.safetensors or model.safetensors.index"
                       ".json): planned from config.json alone")
            typer.echo("  the size assumes the config's shapes"
                       + (f" ({mtp} multi-token-prediction layer(s) kept)" if mtp else "")
                       + f" and the codecs below (expert preset {settings.expert_preset}); each "
                       "weight file of the real checkpoint adds its manifest entry (~140 bytes)")
        typer.echo(f"plan for {out}: {format_size(p['file_size'])} ({p['file_size']:,} bytes), "
                   f"{p['tensors']} tensors, {p['experts']} experts in {p['expert_banks']} banks")
        avail = p["available_memory"]
        typer.echo(f"ray: {p['ray']} (each node reads SRC at the same path)" if p["ray"]
                   else p["jobs_choice"])
        typer.echo(f"free space: {format_size(p['free_space'])}; peak memory estimate: "
                   f"{format_size(p['peak_memory_estimate'])} with {p['jobs']} worker(s) x "
                   f"{p['threads_per_worker']} thread(s)"
                   + (f" ({format_size(avail)} available)" if avail else ""))
        typer.echo(f"bits per weight: {summary.bits_per_weight} whole file, "
                   f"{summary.expert_bits_per_weight} experts")
        typer.echo("codecs: " + ", ".join(f"{k}={v['name']}" for k, v in p["codecs"].items()))
        if p.get("resumes"):
            typer.echo(f"note: converting resumes {p['resumes']}: {p['units_done']} of "
                       f"{p['units_total']} units journaled (checked first; --restart "
                       "discards it)")
        if p["output_exists"]:
            typer.echo(f"note: {out} exists; converting needs --force")
    elif not quiet:
        typer.echo(f"{out}: {format_size(summary.file_size)}, container {summary.container_id}, "
                   f"{summary.seconds:.1f} s, {summary.bits_per_weight} bits/weight (whole "
                   "file)")


def _convert_hub(source: str, out: Path, settings, staging: str, jobs: int | None,
                 force: bool, restart: bool, dry_run: bool, reporter, pause: float,
                 as_json: bool, quiet: bool, ray: str | None = None) -> None:
    from moepack.convert.stream import convert_from_hub

    try:
        bound = parse_size(staging)
    except ValueError as e:
        raise _fail(f"--staging: {e}") from None
    summary, facts = convert_from_hub(source, out, settings, staging=bound, jobs=jobs,
                                      force=force, restart=restart, dry_run=dry_run,
                                      reporter=reporter, pause_per_unit=pause, ray=ray)
    if as_json:
        doc = {"stream": facts, **(asdict(summary) if summary else {})}
        typer.echo(json.dumps(doc, sort_keys=True))
    elif dry_run:
        typer.echo(f"{source} ({facts['revision'][:12]}): {format_size(facts['source_bytes'])} of "
                   f"shards (largest {format_size(facts['largest_shard'])}) -> {out}: "
                   f"{format_size(facts['container_bytes'])}")
        typer.echo(f"peak disk: {format_size(facts['peak_disk'])} = container "
                   f"{format_size(facts['container_bytes'])} + staging {format_size(bound)} + "
                   "small files "
                   f"{format_size(facts['small_files'])}; free: {format_size(facts['free_space'])}")
    elif not quiet and summary is not None:
        typer.echo(f"{out}: {format_size(summary.file_size)}, container {summary.container_id}, "
                   f"{summary.seconds:.1f} s; downloaded {format_size(facts['downloaded'])}, "
                   "at most "
                   f"{format_size(facts['peak_staged'])} of shards on disk")


def export_cmd(
    file: Path = _FILE,
    outdir: Path = _OUTDIR,
    dtype: str = _DTYPE,
    shard_gb: float = _SHARD,
    force: bool = _EXPORT_FORCE,
    as_json: bool = _JSON,
) -> None:
    """Write a dequantised Hugging Face checkpoint that transformers loads as is."""
    from moepack.convert.errors import ConvertError
    from moepack.convert.export import export
    from moepack.format import FormatError

    from moepack.safefs import UnsafePathError

    try:
        res = export(file, outdir, dtype=dtype, force=force, shard_bytes=int(shard_gb * 1e9))
    except (ConvertError, FormatError, UnsafePathError, OSError) as e:
        raise _fail(str(e)) from None
    except KeyboardInterrupt:
        raise _fail("export interrupted") from None
    if as_json:
        typer.echo(json.dumps(res, sort_keys=True))
    else:
        typer.echo(f"{outdir}: {res['tensors']} tensors, {format_size(res['bytes'])} "
                   f"in {len(res['files'])} file(s)")


def register(app: typer.Typer) -> None:
    """Add this package's subcommands to the `moepack` app."""
    app.command("convert")(convert_cmd)
    app.command("export")(export_cmd)
