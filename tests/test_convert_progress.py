"""Progress lines of `moepack convert --progress lines|json` (convert/progress_lines.py): the rate
and ETA arithmetic on a fake clock, the interval, and the content of a real tiny conversion's
lines (counts that reach the totals; never timing)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from moepack.convert.progress import RichReporter
from moepack.convert.progress_lines import RATE_WINDOW, LineReporter
from rich.console import Console
from tiny_models import make_checkpoint


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reporter(every: float = 0.0, fmt: str = "json") -> tuple[LineReporter, Clock, io.StringIO]:
    clock, out = Clock(), io.StringIO()
    return LineReporter(fmt, every, out, clock), clock, out


def lines(out: io.StringIO) -> list[dict]:
    return [json.loads(x) for x in out.getvalue().splitlines()]


def test_rate_and_eta_come_from_this_runs_measured_bytes():
    rep, clock, out = reporter()
    rep.start((1, 5), (10, 40), (400, 1400))       # resumed: 400 bytes done before this run
    assert lines(out)[-1]["bytes_per_s"] is None and lines(out)[-1]["eta_s"] is None
    clock.now += 10
    rep.advance(experts=2, nbytes=100)
    last = lines(out)[-1]
    assert last["bytes_per_s"] == 10.0               # 100 bytes in 10 s, resumed bytes not speed
    assert last["eta_s"] == 90.0                     # 900 bytes left at 10 B/s
    assert (last["experts_done"], last["bytes_done"], last["layers_done"]) == (12, 500, 1)
    rep.advance(layers=1)
    assert lines(out)[-1]["layers_done"] == 2


def test_rate_forgets_what_is_older_than_the_window():
    rep, clock, out = reporter()
    rep.start((0, 2), (0, 8), (0, 10_000))
    clock.now += 10
    rep.advance(nbytes=5000)                         # fast at first
    clock.now += RATE_WINDOW + 100
    rep.advance(nbytes=100)
    clock.now += 100
    rep.advance(nbytes=100)
    # from the last sample before the window (t=10 s, 5000 bytes) on: 200 bytes in 800 s; the
    # whole run's average (5200 bytes in 810 s) would promise 25x that
    assert lines(out)[-1]["bytes_per_s"] == pytest.approx(0.25)


def test_one_line_per_interval_and_a_final_line():
    rep, clock, out = reporter(every=60.0, fmt="lines")
    rep.start((0, 3), (0, 8), (0, 800))
    for _ in range(5):                               # 50 s: no new line
        clock.now += 10
        rep.advance(experts=1, nbytes=100)
    assert len(out.getvalue().splitlines()) == 1
    clock.now += 10
    rep.advance(experts=1, nbytes=100)
    text = out.getvalue().splitlines()
    assert len(text) == 2 and "experts 6/8" in text[-1] and "600 B of 800 B" in text[-1]
    rep.advance(layers=3, experts=2, nbytes=200)
    rep.stop()
    assert out.getvalue().splitlines()[-1].startswith("[1m00s] finished: layers 3/3")


def test_the_hashing_phase_ends_with_its_total():
    """A hashing phase shorter than the interval printed only its first line ('0 B of N'), as
    if nothing had been hashed."""
    rep, clock, out = reporter(every=60.0, fmt="lines")
    rep.hashing(2_000_000)
    rep.hashed(2_000_000)
    clock.now += 3
    rep.start((0, 2), (0, 4), (0, 100))
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["[0s] sha256: 0 B of 2.000 MB", "[3s] sha256: 2.000 MB of 2.000 MB"], lines


def test_transfers_show_downloaded_and_staged():
    rep, _, out = reporter()
    rep.start((0, 1), (0, 1), (0, 10))
    rep.transfer(5_000_000, 2_000_000)
    assert lines(out)[-1]["downloaded"] == 5_000_000 and lines(out)[-1]["staged"] == 2_000_000
    text, _, _ = reporter(fmt="lines")
    text.start((0, 1), (0, 1), (0, 10))
    text.transfer(5_000_000, 2_000_000)
    assert "downloaded 5.000 MB, staged 2.000 MB" in text.line()  # moepack.sizes.format_size


def test_bars_show_shard_downloads_too():
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    rep = RichReporter(console)
    rep.start((0, 3), (0, 8), (0, 1000))
    rep.transfer(5_000_000, 2_000_000)
    rep.stop()
    assert "downloaded 5.0 MB, on disk 2.0 MB" in console.file.getvalue()


def test_a_real_conversion_reports_every_layer_to_the_end(tmp_path):
    src = make_checkpoint("deepseek_v3", tmp_path / "src")
    r = subprocess.run([sys.executable, "-m", "moepack", "convert", str(src),
                        str(tmp_path / "o.moepack"), "--jobs", "1", "--json", "--progress", "json",
                        "--progress-every", "0", "--expert-codec", "rvq3-baseline", "--iters", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    docs = [json.loads(x) for x in r.stderr.splitlines() if x.startswith("{")]
    work = [d for d in docs if "layers_done" in d]
    assert [d["layers_done"] for d in work] == sorted(d["layers_done"] for d in work)
    assert len({d["layers_done"] for d in work}) == work[-1]["layers_total"] + 1   # each layer
    last = work[-1]
    assert last["phase"] == "finished" and last["eta_s"] == 0.0
    assert last["experts_done"] == last["experts_total"] == summary["plan"]["experts"]
    assert last["bytes_done"] == last["bytes_total"] > 0
    assert any(d.get("phase") == "sha256" for d in docs)


def test_unknown_progress_mode_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "moepack", "convert", str(tmp_path), "o.moepack",
                        "--progress", "fancy"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "'fancy' is not one of bars, lines, json" in r.stderr
    assert "Traceback" not in r.stderr
