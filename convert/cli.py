"""Subcommands of `moepack` provided by moepack.convert: `convert` and `export`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from moepack.cliargs import error_line
from moepack.sizes import SIZE_HELP, format_size

QUANTISED_CLASSES = ("attn", "shared_expert", "dense_ffn", "embed", "lm_head")


def _fail(msg: str) -> typer.Exit:
    """The shared one error line (escaped: messages quote names from the checkpoint and text
    like moepack[cluster]); the caller raises the exit, so `raise _fail(...) from None` reads."""
    error_line(msg)
    return typer.Exit(code=1)


def _settings(expert_codec: str | None, trunk_codec: str | None, codec: list[str], seed: int,
              alignment: int, sample: int | None, iters: int | None, mtp: str = "keep"):
    from moepack.convert.settings import Settings

    trunk = [(cls, trunk_codec) for cls in QUANTISED_CLASSES] if trunk_codec else []
    for item in codec:
        cls, sep, name = item.partition("=")
        if not sep:
            raise _fail(f"--codec expects CLASS=CODEC, got {item!r}")
        trunk = [t for t in trunk if t[0] != cls] + [(cls, name)]
    preset = {} if expert_codec is None else {"expert_preset": expert_codec}  # None: the default
    return Settings(**preset, trunk=tuple(sorted(trunk)), seed=seed, alignment=alignment,
                    sample=sample, iters=iters, mtp=mtp)


# Module-level option objects (ruff B008); Optional[...] because typer parses annotations at
# runtime and `X | None` is not understood on Python 3.10.
_SRC = typer.Argument(..., show_default=False,
                      help="Hugging Face checkpoint directory, or hf:ORG/REPO[@REV] to convert "
                      "straight from the hub (with --staging).")
_OUT = typer.Argument(..., help="Output container, e.g. model.moepack.", show_default=False)
_JOBS = typer.Option(None, "--jobs", "-j", min=1, show_default=False,
                     help="Worker processes (one layer at a time each); default: usable cores "
                     "(cgroup-aware), bounded by the memory estimate.")
_RAY = typer.Option(None, "--ray", show_default=False, metavar="ADDRESS",
                    help="Run the work as tasks on this Ray cluster (host:port; auto: the local "
                    "cluster, started if there is none). SRC must be the same path on every "
                    "node, or hf:ORG/REPO (read from the hub by every node). Needs pip install "
                    "'moepack[cluster]'.")
_STAGING = typer.Option(None, "--staging", show_default=False, metavar="SIZE",
                        help="hf: sources: most bytes of source shards on disk at once "
                        "(e.g. 40G); shards are downloaded as needed and deleted when done. "
                        f"{SIZE_HELP} "
                        "Not needed with --ray: tasks read checked byte ranges from the hub.")
_EXPERT = typer.Option(None, "--expert-codec", show_default=False,
                       help="Expert codec preset: rvq3-l (default), rvq3-m, rvq3, rvq4, rvq2...")
_TRUNK = typer.Option(None, "--trunk-codec",
                      help="Codec of all quantised trunk classes (q8, q6, q4...).")
_CODEC = typer.Option(None, "--codec", help="Trunk codec of one class, CLASS=CODEC (repeatable).")
_SEED = typer.Option(0, "--seed", help="Seed of codebook sampling and training.")
_ALIGN = typer.Option(4096, "--alignment", help="Expert record alignment in bytes.")
_SAMPLE = typer.Option(None, "--sample", help="Training vectors per projection (preset default).")
_ITERS = typer.Option(None, "--iters", help="Lloyd iterations (preset default).")
_MTP = typer.Option("keep", "--mtp", help="Multi-token-prediction layers (DeepSeek-V3, "
                    "GLM-4.5): keep (when the checkpoint has them; not run by the engine, "
                    "kept for speculative decoding) or drop. See docs/CONVERT.md for the cost.")
_DRY = typer.Option(False, "--dry-run", help="Print the plan and stop.")
_FORCE = typer.Option(False, "--force", help="Replace an existing finished output.")
_EXPORT_FORCE = typer.Option(False, "--force", help="Replace OUTDIR and remove OUTDIR.partial / "
                             "OUTDIR.old, only if an earlier export made them.")
_RESTART = typer.Option(False, "--restart", help="Discard an unfinished conversion of OUT.")
_QUIET = typer.Option(False, "--quiet", "-q", help="No progress display.")
_JSON = typer.Option(False, "--json", help="Print a JSON summary on stdout.")
_PROGRESS = typer.Option(None, "--progress", show_default=False, metavar="bars|lines|json",
                         help="Progress on stderr: bars, or one line per --progress-every "
                         "seconds as text (lines) or JSON (json); default: bars on a terminal, "
                         "lines otherwise, none with --json.")
_EVERY = typer.Option(60.0, "--progress-every", min=0.0, help="Seconds between progress lines.")
_PAUSE = typer.Option(0.0, "--pause-per-unit", hidden=True, min=0.0,
                      help="Journal every unit and pause this many seconds (tests).")
_FILE = typer.Argument(..., help="A .moepack container.", show_default=False)
_OUTDIR = typer.Argument(..., help="Directory for the Hugging Face checkpoint.",
                         show_default=False)
_DTYPE = typer.Option("f32", "--dtype", help="Weight dtype of the export: f32, bf16 or f16.")
_SHARD = typer.Option(4.0, "--shard-gb", help="Maximum safetensors shard size in GB.")


def convert_cmd(
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
    from moepack.convert.progress_lines import MODES, choose_reporter
    from moepack.format import FormatError

    from moepack.safefs import UnsafePathError

    if ray is not None and jobs is not None:
        raise _fail("--jobs and --ray exclude each other (with --ray the cluster's CPUs work)")
    if ray is not None and not ray.strip():
        raise _fail("--ray expects an address (host:port) or auto")
    hub = str(src).startswith("hf:")
    if hub and staging is None and ray is None:
        raise _fail("hf: sources need --staging SIZE (the most source bytes kept on disk, e.g. "
                    "40G; at least the largest shard)")
    if staging is not None and not hub:
        raise _fail("--staging is for hf:ORG/REPO sources (a local SRC is read in place)")
    if progress is not None and progress not in MODES:
        raise _fail(f"--progress must be one of {', '.join(MODES)}, got {progress!r}")
    reporter = choose_reporter(progress, progress_every, quiet or dry_run, as_json)
    try:
        settings = _settings(expert_codec, trunk_codec, codec or [], seed, alignment, sample, iters,
                             mtp)
        if hub:
            return _convert_hub(str(src), out, settings, staging or "0", jobs, force, restart,
                                dry_run, reporter, pause_per_unit, as_json, quiet, ray)
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
        typer.echo(f"bits per weight: {summary.bits_per_weight} overall, "
                   f"{summary.expert_bits_per_weight} experts")
        typer.echo("codecs: " + ", ".join(f"{k}={v['name']}" for k, v in p["codecs"].items()))
        if p["output_exists"]:
            typer.echo(f"note: {out} exists; converting needs --force")
    elif not quiet:
        typer.echo(f"{out}: {format_size(summary.file_size)}, container {summary.container_id}, "
                   f"{summary.seconds:.1f} s, {summary.bits_per_weight} bits/weight")


def _convert_hub(source: str, out: Path, settings, staging: str, jobs: int | None,
                 force: bool, restart: bool, dry_run: bool, reporter, pause: float,
                 as_json: bool, quiet: bool, ray: str | None = None) -> None:
    from moepack.convert.stream import convert_from_hub

    from moepack.sizes import parse_size

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
