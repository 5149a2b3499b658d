"""Subcommands of `moepack` provided by moepack.format: `info`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from moepack.format.errors import FormatError
from moepack.format.info import container_info
from moepack.format.reader import Container
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from moepack.cliargs import fail, json_error, one_line
from moepack.sizes import format_size


def _mtp_line(m: dict) -> str:
    """Multi-token-prediction sections: kept for speculative decoding, not run (FORMAT.md §4.6)."""
    layers = f"{m['layers']} layer" + ("s" if m["layers"] != 1 else "")
    return f"{layers}, {m['bytes']:,} bytes (not used by the engine)"


def _file_bpw(info: dict) -> float | None:
    """Bits per weight of the whole file (index, tokenizer blobs and padding too): the figure
    `convert` prints; `overall` counts the weights' and codebooks' bytes only."""
    total = info["parameters"]["total"]
    return round(8 * info["file_size"] / total, 4) if total else None


def _show(path: Path, info: dict) -> None:
    bpw, par = info["bits_per_weight"], info["parameters"]
    rows = [
        ("container", str(path)),
        ("format", info["format_version"]),
        ("id", info["container_id"]),
        ("architecture", f"{info['architecture']} ({info['arch']})"),
        ("converter", info["converter"]),
        ("parameters", f"{par['total']:,} (trunk {par['trunk']:,}, experts {par['experts']:,})"),
        ("file size", f"{info['file_size']:,} B ({format_size(info['file_size'])})"),
        *[(f"  {k}", f"{v:,} B ({format_size(v)})") for k, v in info["bytes"].items()],
        ("bits/weight",
         f"experts {bpw['experts']}, trunk {bpw['trunk']}, overall {bpw['overall']}"),
        ("  whole file", f"{_file_bpw(info)} (index and blobs too, as convert counts)"),
        ("tensors", str(info["counts"]["tensors"])),
        ("experts", f"{info['counts']['experts']} in {info['counts']['expert_banks']} banks"),
        ("alignment", str(info["alignment"])),
        *[("MTP", _mtp_line(info["mtp"])) for _ in ("mtp",) if "mtp" in info],
        *[("not converted", note) for note in info.get("skipped", [])],
    ]
    values = [one_line(v) for _, v in rows]  # names come from the file
    # The ID (a hash users copy) and the path never wrap or get cut: the value column is at
    # least as wide as they are, the console widened for them when it is narrower (a pipe:
    # 80 columns); longer text wraps at spaces, a long word folds.
    whole = max(cell_len(values[0]), cell_len(values[2]))
    keys = max(cell_len(k) for k, _ in rows)
    console = Console()
    if console.width < keys + whole + 4:  # the table's padding: 1 + 2 between + 1
        console = Console(width=keys + whole + 4)
    t = Table(show_header=False, box=None)
    t.add_column(no_wrap=True)
    t.add_column(min_width=whole, overflow="fold")
    for (k, _), v in zip(rows, values, strict=True):
        t.add_row(f"[bold]{k}[/bold]", escape(v))
    console.print(t)


def info(
    file: Annotated[Path, typer.Argument(help="A .moepack container.")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show a container's version, ID, architecture, sizes and bits per weight."""
    try:
        with Container.open(file) as c:
            data = container_info(c)
    except FormatError as e:
        if as_json:  # the object `run --json` prints for the same file (docs/RUNTIME.md)
            json_error(f"{file}: {e}", code=e.code, field=e.field, offset=e.offset)
        fail(f"{file}: {e.with_code()}")  # one line, no terminal escapes from the file
    except OSError as e:  # the reason alone: Python's text repeats the path and errno
        why = f"{file}: {e.strerror or e}"
        if as_json:
            json_error(why)
        fail(why)
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        _show(file, data)


def register(app: typer.Typer) -> None:
    """Add this package's subcommands to the `moepack` app."""
    app.command("info")(info)
