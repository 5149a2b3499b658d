"""Engine properties every model family must keep, shared by the per-family test files:
logits independent of the thread count and prompt chunking, a sequence fed in pieces (KV cache
and recurrent state kept) ending where one pass ends, and a failed call changing nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from moepack.runtime.engine import Engine

# (threads, chunk) runs compared with one thread at the family's chunk; chunk 1 is token by
# token, 45 splits the prompt unevenly
RUNS = ((2, None), (2, 1), (1, 45))


def assert_threads_and_chunks_bit_identical(path: Path, toks: list[int], chunk: int) -> None:
    with Engine(path, threads=1, chunk=chunk) as e1:
        base = e1.logits(toks)
    for threads, run_chunk in RUNS:
        run_chunk = run_chunk or chunk
        with Engine(path, threads=threads, chunk=run_chunk) as e:
            np.testing.assert_array_equal(e.logits(toks), base,
                                          err_msg=f"threads={threads} chunk={run_chunk}")


def assert_snapshot_continuation_equals_one_pass(path: Path, turn1: list[int],
                                                 turn2: list[int], chunk: int) -> None:
    """Chat: a snapshot after turn 1, a reply generated past it, the snapshot restored; turn 2
    fed from there gives the last logits of one pass over both turns."""
    with Engine(path, threads=1, chunk=chunk) as e:
        full = e.logits(turn1 + turn2)
        e.reset()
        e.feed(turn1)
        snap = e.snapshot()
        list(e.generate([turn2[0]], 5, reset=False))
        e.restore(snap)
        np.testing.assert_array_equal(e.feed(turn2), full[-1])


def assert_pieces_equal_one_pass(path: Path, toks: list[int], cuts: tuple[int, ...],
                                 chunk: int | None = None) -> None:
    """Feeding `toks` split at `cuts` gives the last logits of one pass over all of them."""
    opts = {"chunk": chunk} if chunk else {}
    with Engine(path, threads=1, **opts) as e:
        full = e.logits(toks)
        e.reset()
        last = None
        for start, end in zip((0, *cuts), (*cuts, len(toks)), strict=True):
            last = e.feed(toks[start:end])
        assert e.position == len(toks)
    np.testing.assert_array_equal(last, full[-1])


def assert_failed_call_changes_nothing(path: Path, tmp: Path, layer: int, head: list[int],
                                       rest: list[int], chunk: int) -> None:
    """A call that fails after the attention layers have run (every expert record of MoE layer
    `layer` damaged on disk after open, verify_reads; `head` has cached the experts it routes
    to) leaves position and state as before the call, and the sequence goes on exactly as if
    the failed call had never been made."""
    from damage import flip
    from moepack.format.reader import Container
    from moepack.runtime.engine import CorruptError

    bad = tmp / "bad.moepack"
    bad.write_bytes(path.read_bytes())
    with Container.open(bad) as c:
        offsets = [c.expert_range(layer, x)[0] + 5 for x in range(c.bank(layer)["count"])]
    with Engine(path, threads=1, chunk=chunk) as ok:
        want = ok.logits(head + rest)
    with Engine(bad, verify_reads=True, threads=1, chunk=chunk) as e:
        e.feed(head)
        before = e.snapshot()
        for off in offsets:
            flip(bad, off)
        with pytest.raises(CorruptError):
            e.feed(rest)  # routes to an expert not yet cached: read, damaged
        assert e.position == len(head) and e.snapshot() == before
        for off in offsets:
            flip(bad, off)  # repaired: the same call now succeeds
        got = e.logits(rest, reset=False)
    np.testing.assert_array_equal(got, want[len(head):])
