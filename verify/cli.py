"""Subcommands of `moepack` provided by moepack.verify: `moepack verify`."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from moepack.cliargs import MAX_THREADS, choice, error_line, file_problem

# Typer needs Optional[...] at runtime on Python 3.10 (X | None annotations are not parsed there).
_FILE = typer.Argument(None, metavar="FILE", help="Container to verify (NAME.moepack).",
                       show_default=False)
_SOURCE = typer.Option(None, "--source", metavar="DIR",
                       help="Verify a Hugging Face checkpoint directory instead.")
_EXPECT = typer.Option(None, "--expect", metavar="FILE",
                       help="With --source: expected files (fetch manifest or hub file list); "
                            "default DIR/moepack-source.json.")
_QUICK = typer.Option(False, "--quick", help="Header, index and root hash only (seconds).")
_JSON = typer.Option(False, "--json", help="Print the report as JSON on stdout.")
_THREADS = typer.Option(None, "--threads", min=1, max=MAX_THREADS,
                        help="Hashing threads (default: all cores).")
_IO = typer.Option("auto", "--io", metavar="auto|direct|buffered",
                   callback=choice("auto", "direct", "buffered"),
                   help="O_DIRECT or page-cache reads (auto: page cache if the file is "
                        "mostly cached, else O_DIRECT).")


def _usage(message: str) -> typer.Exit:
    error_line(message, "usage")
    return typer.Exit(2)


def _unreadable_expect(source: Path, expect: Path | None):
    """A not-verifiable SourceReport when the expectations file exists but is not a regular file
    (a FIFO there, even DIR/moepack-source.json in a downloaded folder, would block the reader
    forever); None otherwise. The container path needs no such check: the verifier stats it
    before opening."""
    from moepack.verify.expect import MANIFEST_NAME
    from moepack.verify.source import SourceReport

    path = expect if expect is not None else source / MANIFEST_NAME
    if not path.exists():
        return None
    problem = file_problem(path, "expectations file")
    return SourceReport(str(source), str(path), error=problem) if problem else None


def verify_command(
    file: Optional[Path] = _FILE,  # noqa: UP045
    source: Optional[Path] = _SOURCE,  # noqa: UP045
    expect: Optional[Path] = _EXPECT,  # noqa: UP045
    quick: bool = _QUICK,
    as_json: bool = _JSON,
    threads: Optional[int] = _THREADS,  # noqa: UP045
    io: str = _IO,  # an IoMode, checked below
) -> None:
    """Check every hash of a container (exit 0 intact, 1 damaged, 2 not verifiable)."""
    # Imported here so `moepack --help` stays fast.
    from moepack.verify.container import verify
    from moepack.verify.render import LazyProgress, print_report, print_source_report
    from moepack.verify.report import Report
    from moepack.verify.source import SourceReport, verify_source

    if (file is None) == (source is None):
        raise _usage("give either FILE or --source DIR")
    assert file is not None or source is not None
    if expect is not None and source is None:
        raise _usage("--expect only goes with --source")
    if quick and source is not None:
        raise _usage("--quick applies to containers only")
    label = "verify source" if source is not None else "verify"
    bar = LazyProgress(Console(stderr=True), label) if not as_json and not quick else None
    with bar or nullcontext():
        if source is not None:
            report: Report | SourceReport = (
                _unreadable_expect(source, expect)
                or verify_source(source, expect, threads=threads, progress=bar))
        else:
            report = verify(file, quick=quick, threads=threads, progress=bar,
                            io=io)  # type: ignore[arg-type]  # checked above
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        # Results go to stdout; "not verifiable" is an error message, so stderr.
        console = Console(stderr=report.error is not None, highlight=False, soft_wrap=True)
        if isinstance(report, SourceReport):
            print_source_report(report, console)
        else:
            print_report(report, console)
    raise typer.Exit(report.exit_code)


def register(app: typer.Typer) -> None:
    """Add this package's subcommands to the `moepack` app."""
    app.command("verify")(verify_command)
