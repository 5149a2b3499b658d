"""What `moepack fetch hf:…` prints; the work is in hub.py."""

from __future__ import annotations

import threading
from pathlib import Path

from moepack.fetch.display import console, transfer_bar, verdict_table
from moepack.fetch.errors import FetchError
from moepack.fetch.hub import HubPlan, fetch_hub, plan_hub
from moepack.fetch.hub_download import DownloadPolicy
from rich.markup import escape
from rich.table import Table

from moepack.cliargs import one_line
from moepack.safefs import printable
from moepack.sizes import format_size


def files_table(plan: HubPlan) -> Table:
    lst = plan.listing
    t = Table(title=escape(f"{lst.repo} @ {lst.revision} → {plan.dest}"))
    for col, just in (("file", "left"), ("size", "right"), ("on disk", "left"),
                      ("to fetch", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for s in plan.files:
        on_disk = {"complete": "[green]complete[/]", "unverified": "present, hashed at fetch",
                   "blocked": "[red]a folder[/]",
                   "partial": f"partial ({format_size(s.present)})", "missing": "—"}[s.status]
        fetch = format_size(s.to_fetch) if s.to_fetch else "0"
        if s.status == "unverified":   # its hash decides: 0, or the whole file again
            fetch = f"≤ {format_size(s.file.size)}"
        t.add_row(escape(printable(s.file.name)), format_size(s.file.size), on_disk, fetch)
    t.add_section()
    t.add_row(f"{len(plan.files)} files", format_size(lst.total), "", format_size(plan.to_fetch))
    return t


def print_plan(plan: HubPlan) -> None:
    console.print(files_table(plan))
    if plan.unverified:
        console.print(f"≤: {len(plan.unverified)} file(s) present but not verified yet, "
                      "hashed at fetch and downloaded again if they differ; the space check "
                      f"counts {format_size(plan.redownload)} for that (--jobs at once)",
                      highlight=False, markup=False)
    if plan.conversion is not None:
        console.print(f"conversion output: {format_size(plan.conversion)} "
                      f"({plan.conversion} bytes; "
                      f"{one_line(plan.conversion_note)})", highlight=False, markup=False)
    else:   # the note can quote the hub's config.json: escaped, one line
        console.print(f"conversion output: unknown — {one_line(plan.conversion_note)}",
                      highlight=False, markup=False)
    console.print(verdict_table(list(plan.verdicts)))


def run_hub(source: str, dest: Path, includes: list[str], jobs: int, dry_run: bool,
            out: Path | None, stall_timeout: float) -> int:
    plan = plan_hub(source, dest, includes, out, jobs=jobs)
    print_plan(plan)
    if plan.blocked:
        more = f" (and {len(plan.blocked) - 1} more)" if len(plan.blocked) > 1 else ""
        raise FetchError(f"{plan.blocked[0]} is a folder where the hub has a file{more}; move "
                         "it away (nothing downloaded)")
    if dry_run:
        return 0 if plan.ok else 1
    if not plan.ok:
        raise FetchError("not enough free space (see the table above); nothing downloaded")
    lock = threading.Lock()
    with transfer_bar("fetch", plan.listing.total) as (bar, task):
        def on_bytes(n: int) -> None:
            with lock:
                bar.advance(task, n)

        def on_hashing(n: int) -> None:
            with lock:
                bar.update(task, info=f"hashing {n} file(s) already on disk" if n else "")

        def say(line: str) -> None:   # above the bar, one line each (names are printable)
            with lock:
                bar.console.print(line, markup=False, highlight=False, soft_wrap=True)

        result = fetch_hub(plan, jobs=jobs, policy=DownloadPolicy(read_timeout=stall_timeout),
                           on_bytes=on_bytes, on_hashing=on_hashing, say=say)
    console.print(f"{result.files} files verified by size and hash; wrote {result.manifest}",
                  highlight=False, markup=False)
    return 0
