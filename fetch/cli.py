"""Subcommands of `moepack` provided by moepack.fetch: `fetch`, `torrent create`, `seed`."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated

import typer
from moepack.fetch.errors import FetchError

from moepack.cliargs import EXIT_INTERRUPTED, fail, one_line
from moepack.safefs import file_kind
from moepack.sizes import SIZE_HELP, parse_size


def _endpoint(value: str | None) -> str | None:
    """Typer callback: HOST:PORT (port 0-65535) or a usage error."""
    from moepack.fetch.lt_session import parse_endpoint

    if value is not None:
        try:
            parse_endpoint(value, "")
        except FetchError:
            raise typer.BadParameter(f"{one_line(value)!r}: expected HOST:PORT with a port from "
                                     "0 to 65535") from None
    return value


def _endpoints(values: list[str] | None) -> list[str] | None:
    for v in values or []:
        _endpoint(v)
    return values


def _positive_seconds(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"{value} is not a positive number of seconds")
    return value


def _duration(value: float) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"{value} is not a number of seconds ≥ 0 (0 = until stopped)")
    return value


def _piece_size(value: str | None) -> str | None:
    from moepack.fetch.torrent_create import MAX_USER_PIECE, MIN_PIECE

    if value is None:
        return None
    valid = f"a power of two from {MIN_PIECE >> 10} KiB to {MAX_USER_PIECE >> 20} MiB"
    try:
        n = parse_size(value)
    except ValueError as e:
        raise typer.BadParameter(f"{e}; give {valid}") from None
    if not MIN_PIECE <= n <= MAX_USER_PIECE or n & (n - 1):
        raise typer.BadParameter(f"{one_line(value)} is {n} bytes; give {valid}")
    return value


def _source(value: str) -> str:
    """hf: sources are checked here, so a malformed one is a usage error."""
    from moepack.fetch.hub_listing import parse_hf_source

    if value.startswith("hf:"):
        try:
            parse_hf_source(value)
        except FetchError as e:
            raise typer.BadParameter(str(e)) from None
    return value

torrent_app = typer.Typer(help="Make torrents of containers.", no_args_is_help=True)

Source = Annotated[str, typer.Argument(
    callback=_source, help="hf:ORG/REPO\\[@REV], magnet:?…, FILE.torrent or https://…/FILE.torrent")]
Dest = Annotated[Path, typer.Option("--dest", help="Destination directory.")]
Include = Annotated[list[str] | None, typer.Option(
    "--include", help="hf: only files matching this glob (repeatable).")]
Jobs = Annotated[int, typer.Option("--jobs", min=1, max=64, help="hf: parallel downloads.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Sizes and free space only; 1 if short.")]
Out = Annotated[Path | None, typer.Option(
    "--out", help="hf: the FILE.moepack convert will write (its filesystem is checked too).")]
Peers = Annotated[list[str] | None, typer.Option(
    "--peer", callback=_endpoints, help="torrent: HOST:PORT to connect to (repeatable).")]
FetchListen = Annotated[str | None, typer.Option(
    "--listen", callback=_endpoint, help="torrent: HOST:PORT.")]
Stall = Annotated[float | None, typer.Option(
    "--stall-timeout", callback=_positive_seconds,
    help="Seconds without data before giving up (rerun resumes). "
    "hf: per read, 5 retries, default 120; torrent: in all, default 600.")]
Output = Annotated[Path | None, typer.Option(
    "-o", "--output", help="Default: FILE.torrent next to FILE.")]
PieceSize = Annotated[str | None, typer.Option(
    "--piece-size", callback=_piece_size,
    help="Power of two from 16KiB to 128MiB, e.g. 16MiB. Default: automatic (docs/FETCH.md). "
    f"{SIZE_HELP}")]
Trackers = Annotated[list[str] | None, typer.Option("--tracker", help="Tracker URL (repeatable).")]
WebSeeds = Annotated[list[str] | None, typer.Option(
    "--web-seed", help="HTTP(S) URL of the same file (repeatable).")]
SeedListen = Annotated[str, typer.Option(
    "--listen", callback=_endpoint, help="HOST:PORT to listen on.")]
FullVerify = Annotated[bool, typer.Option(
    "--full-verify", help="Hash every byte before seeding (default: quick verify + lazy checks).")]
Duration = Annotated[float, typer.Option(
    "--duration", callback=_duration,
    help="Stop after this many seconds (0 = until Ctrl-C or SIGTERM).")]


def _utf8(what: str, *values: str | Path | None) -> None:
    """FetchError for a path or source that is not valid UTF-8 (undecodable bytes reach Python
    as surrogates): it could be neither printed nor stored in a manifest."""
    for v in values:
        if v is None:
            continue
        try:
            str(v).encode("utf-8")
        except UnicodeEncodeError:
            raise FetchError(f"{what} {one_line(str(v))}: not valid UTF-8; use a path whose "
                             "name is valid UTF-8") from None


def _dest_problem(dest: Path) -> None:
    """FetchError when --dest cannot be a folder (a file there or above it): the dry run
    says so as the real run would, not "fits"."""
    p = dest
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    if not p.is_dir():
        what = "a file" if p.is_file() else file_kind(os.lstat(p).st_mode)
        raise FetchError(f"cannot use {one_line(str(dest))} as destination: "
                         f"{one_line(str(p))} is {what}, not a folder")


def fetch(source: Source, dest: Dest, include: Include = None, jobs: Jobs = 4,
          dry_run: DryRun = False, out: Out = None, peer: Peers = None,
          listen: FetchListen = None, stall_timeout: Stall = None) -> None:
    """Download raw weights from the Hugging Face hub, or a container over BitTorrent."""
    try:
        _utf8("source", source)
        _utf8("--dest", dest)
        _utf8("--out", out)
        _dest_problem(dest)
        if source.startswith("hf:"):
            from moepack.fetch.hub_cli import run_hub

            code = run_hub(source, dest, include or [], jobs, dry_run, out, stall_timeout or 120.0)
        else:
            from moepack.fetch.torrent_cli import run_torrent_fetch

            code = run_torrent_fetch(source, dest, dry_run, peer or [], listen,
                                     stall_timeout or 600.0)
    except FetchError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted; what was downloaded is kept and a rerun resumes", EXIT_INTERRUPTED)
    raise typer.Exit(code)


@torrent_app.command("create")
def torrent_create(file: Annotated[Path, typer.Argument(help="The container (NAME.moepack).")],
                   output: Output = None, piece_size: PieceSize = None,
                   tracker: Trackers = None, web_seed: WebSeeds = None) -> None:
    """Make a reproducible hybrid v1+v2 torrent of one container."""
    from moepack.fetch.torrent_cli import run_create

    try:
        _utf8("FILE", file)
        _utf8("--output", output)
        run_create(file, output, piece_size, tracker or [], web_seed or [])
    except FetchError as e:
        fail(str(e))


def seed(torrent: Annotated[Path, typer.Argument(help="FILE.torrent")],
         path: Annotated[Path, typer.Option("--path", help="The container the torrent describes.")],
         listen: SeedListen = "0.0.0.0:6881", full_verify: FullVerify = False,
         duration: Duration = 0.0) -> None:
    """Seed a container, showing peers and upload rate."""
    from moepack.fetch.torrent_cli import run_seed

    try:
        _utf8("FILE.torrent", torrent)
        _utf8("--path", path)
        run_seed(torrent, path, listen, full_verify, duration)
    except FetchError as e:
        fail(str(e))


def register(app: typer.Typer) -> None:
    """Add this package's subcommands to the `moepack` app."""
    app.command("fetch")(fetch)
    app.command("seed")(seed)
    app.add_typer(torrent_app, name="torrent")
