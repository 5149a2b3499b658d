"""Progress of a long conversion as one line per interval on stderr, plain text or JSON, for
logs of a job that runs for a day (`--progress lines|json`; rich bars need a terminal).

Each line: layers and experts done of all, bytes of the container written, the rate measured
over the last RATE_WINDOW seconds of this run (resumed work is not counted as speed), the ETA it
gives for the remaining bytes, and for hub sources the shard bytes downloaded and on disk now.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

from moepack.convert.progress import Reporter

from moepack.sizes import format_size

RATE_WINDOW = 600.0      # seconds of history behind the rate (recent speed, not the average)


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class LineReporter(Reporter):
    def __init__(self, fmt: str = "lines", every: float = 60.0, out: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.json, self.every, self.out, self.clock = fmt == "json", every, out, clock
        self.t0 = clock()
        self.phase = ""
        self.done = {"layers": 0, "experts": 0, "bytes": 0, "hashed": 0}
        self.total = {"layers": 0, "experts": 0, "bytes": 0, "hashed": 0}
        self.transfers: dict[str, int] | None = None
        self.samples: deque[tuple[float, int]] = deque()   # (time, bytes done) in this run
        self.last = float("-inf")

    # -- Reporter hooks ------------------------------------------------------------------
    def message(self, text: str) -> None:
        self._write({"message": text} if self.json else text)

    def hashing(self, total: int, label: str = "sha256") -> None:
        self.phase = label
        self.done["hashed"], self.total["hashed"] = 0, total
        self._tick(force=True)

    def hashed(self, nbytes: int) -> None:
        self.done["hashed"] += nbytes
        self._tick()

    def start(self, layers: tuple[int, int], experts: tuple[int, int],
              nbytes: tuple[int, int]) -> None:
        if self.phase and self.phase != "converting":  # the hashing phase's end, as the bar's
            self._tick(force=True)
        self.phase = "converting"
        for key, (done, total) in (("layers", layers), ("experts", experts), ("bytes", nbytes)):
            self.done[key], self.total[key] = done, total
        self.samples.append((self.clock(), nbytes[0]))
        self._tick(force=True)

    def advance(self, layers: int = 0, experts: int = 0, nbytes: int = 0) -> None:
        self.done["layers"] += layers
        self.done["experts"] += experts
        self.done["bytes"] += nbytes
        if nbytes:
            self.samples.append((self.clock(), self.done["bytes"]))
        self._tick()

    def transfer(self, downloaded: int, staged: int) -> None:
        self.transfers = {"downloaded": downloaded, "staged": staged}
        self._tick()

    def stop(self) -> None:
        if self.phase == "converting":
            finished = all(self.done[k] >= self.total[k] for k in ("layers", "experts", "bytes"))
            self.phase = "finished" if finished else "stopped"
            self._tick(force=True)

    # -- the line ------------------------------------------------------------------------
    def rate(self) -> float | None:
        """Container bytes per second over the last RATE_WINDOW seconds of this run."""
        now = self.clock()
        while len(self.samples) > 2 and self.samples[1][0] < now - RATE_WINDOW:
            self.samples.popleft()
        if len(self.samples) < 2:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 and b1 > b0 else None

    def state(self) -> dict:
        doc: dict = {"phase": self.phase, "elapsed_s": round(self.clock() - self.t0, 1)}
        if self.phase in ("converting", "finished", "stopped"):
            for key in ("layers", "experts", "bytes"):
                doc[f"{key}_done"], doc[f"{key}_total"] = self.done[key], self.total[key]
            rate = self.rate()
            doc["bytes_per_s"] = None if rate is None else round(rate, 3)
            left = self.total["bytes"] - self.done["bytes"]
            doc["eta_s"] = 0.0 if left <= 0 else None if rate is None else round(left / rate, 1)
        else:
            doc["hashed"], doc["hash_total"] = self.done["hashed"], self.total["hashed"]
        if self.transfers is not None:
            doc.update(self.transfers)
        return doc

    def line(self) -> str:
        d = self.state()
        if "layers_done" not in d:
            text = f"{d['phase']}: {format_size(d['hashed'])} of {format_size(d['hash_total'])}"
        else:
            pct = 100 * d["bytes_done"] / max(1, d["bytes_total"])
            rate = "rate not measured yet" if d["bytes_per_s"] is None else \
                f"{format_size(d['bytes_per_s'])}/s"
            eta = "ETA unknown" if d["eta_s"] is None else f"ETA {_duration(d['eta_s'])}"
            text = (f"{d['phase']}: layers {d['layers_done']}/{d['layers_total']}, experts "
                    f"{d['experts_done']}/{d['experts_total']}, {format_size(d['bytes_done'])} of "
                    f"{format_size(d['bytes_total'])} written ({pct:.1f}%), {rate}, {eta}")
        if "downloaded" in d:
            text += (f"; downloaded {format_size(d['downloaded'])}, "
                     f"staged {format_size(d['staged'])}")
        return f"[{_duration(d['elapsed_s'])}] {text}"

    def _tick(self, force: bool = False) -> None:
        now = self.clock()
        if force or now - self.last >= self.every:
            self.last = now
            self._write(self.state() if self.json else self.line())

    def _write(self, item: dict | str) -> None:
        out = self.out or sys.stderr
        out.write((json.dumps(item, sort_keys=True) if isinstance(item, dict) else item) + "\n")
        out.flush()


MODES = ("bars", "lines", "json")


def choose_reporter(mode: str | None, every: float, silent: bool, as_json: bool) -> Reporter:
    """--progress MODE; by default bars on a terminal, lines otherwise, nothing with --json
    (its summary is the output). `silent` (--quiet, --dry-run) wins."""
    from moepack.convert.progress import RichReporter

    if silent or (as_json and mode is None):
        return Reporter()
    if mode is None:
        mode = "bars" if sys.stderr.isatty() else "lines"
    return RichReporter() if mode == "bars" else LineReporter(mode, every)
