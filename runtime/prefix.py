"""Going back to the part of the engine's sequence that a new prompt shares: the KV cache is
simply truncated; a linear-attention state cannot be, so it comes back from a snapshot taken at
a turn boundary (the end of an earlier prompt) and only the rest is fed again."""

from __future__ import annotations

from collections.abc import Sequence

from moepack.runtime.engine import Engine, Snapshot


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixReuse:
    """`rewind(ids)` before feeding a prompt, `mark()` once its tokens are in (before the reply).

    Snapshots are kept for models with a linear-attention state only, `keep` at most (each is
    plan's state_bytes: a few MB to a few hundred MB). Open the engine with `snapshots=keep`
    (chat and serve: 1) so that its memory plan counts them (snapshot_bytes, in the floor);
    otherwise they take memory the budget gave the expert cache."""

    def __init__(self, engine: Engine, keep: int = 1) -> None:
        self.engine, self.keep = engine, keep
        self._snaps: list[Snapshot] = []

    def mark(self) -> None:
        """Remember the state after the tokens fed so far."""
        if self.engine.state_bytes and self.keep > 0:
            # drop the oldest first: never more than `keep` held at once
            self._snaps = self._snaps[len(self._snaps) - self.keep + 1:]
            self._snaps.append(self.engine.snapshot())

    def rewind(self, ids: Sequence[int]) -> int:
        """Leaves the engine holding the longest prefix of `ids` it can reuse, at most
        len(ids) - 2 tokens, and returns its length. The last one's logits start the reply, and
        at least two are fed: a call of two or more tokens takes the prompt products, so the
        reply starts from the logits one pass over `ids` gives (one token alone would take the
        decode products, docs/RUNTIME.md)."""
        e = self.engine
        seq = e.sequence
        n = min(common_prefix(seq, ids), max(len(ids) - 2, 0))
        if n == len(seq) or not e.state_bytes:  # nothing to drop, or a KV cache only
            e.truncate(n)
            return n
        best = max((s for s in self._snaps if len(s.tokens) <= n
                    and tuple(seq[:len(s.tokens)]) == s.tokens),
                   key=lambda s: len(s.tokens), default=None)
        if best is None:
            e.reset()
            return 0
        e.restore(best)
        return len(best.tokens)
