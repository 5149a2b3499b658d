"""Stop strings matched across token boundaries: text that could still be the start of a stop
string is held back, and a stop string itself is never emitted."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        """Text that is safe to emit now; sets `stopped` when a stop string has appeared."""
        if self.stopped:
            return ""
        self.pending += piece
        if not self.stops:
            out, self.pending = self.pending, ""
            return out
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self.pending = self.pending[:min(hits)], ""
            return out
        keep = self._partial_tail()
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        """At the end of generation: the held-back text was not a stop string after all."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out

    def _partial_tail(self) -> int:
        """Length of the longest tail of pending that begins some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(s[:n]):
                    best = n
                    break
        return best
