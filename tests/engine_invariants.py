"""Engine properties every model family must keep, shared by the per-family test files:
logits independent of the thread count and prompt chunking, a sequence fed in pieces (KV cache
and recurrent state kept) ending where one pass ends, and a failed call changing nothing.

Linear-attention layers run each sub-chunk of LINEAR_CHUNK positions (aligned to multiples of it)
in the chunk form of the delta rule when one forward pass holds all of it, else token by token
(docs/RUNTIME.md, "Linear attention"): their bits depend on where calls and passes begin, never
on the thread count.  Those families pass `close`, how far a sequence split elsewhere may move
the logits; split at multiples of LINEAR_CHUNK it must give the same bits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from kernel_paths import prefill_then_decode, runnable_kernels
from moepack.runtime.engine import Engine

# (threads, chunk) runs compared with one thread at the family's chunk; chunk 1 is token by
# token, 45 splits the prompt unevenly
RUNS = ((2, None), (2, 1), (1, 45))
LINEAR_CHUNK = 16  # the engine's default sub-chunk (model.h MPM_LA_CHUNK)
# close(got, want, what) for [positions, vocab] logits of a sequence split another way
Close = Callable[[np.ndarray, np.ndarray, str], None]


def within(median: float, largest: float) -> Close:
    """Per position the largest |Δlogit| over the largest |logit| of the sequence: at most
    `median` at the median position and `largest` at every one (docs/RUNTIME.md's bound)."""
    def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
        assert got.shape == want.shape, (what, got.shape, want.shape)
        err = np.abs(got - want).max(axis=-1) / np.abs(want).max()
        assert np.median(err) <= median and err.max() <= largest, (
            f"{what}: median {np.median(err):.3g} (<= {median:g}), largest {err.max():.3g} "
            f"(<= {largest:g}) at {int(err.argmax())}")
    return check


# the linear-attention families' bound (docs/RUNTIME.md; bench/linear_bound.py measured medians
# up to 1e-6, isolated positions up to 3.7e-3 where an int8 expert table entry rounds the other
# way: a rounding-level change in the tiny models). Since the lm_head rounds its input to 16-bit
# integers per group (CODECS.md §2.4), two forms whose last hidden states differ by ~1e-6 give
# logits that differ by about that rounding's step: medians 1.0-1.8e-5 (2026-12-07).
LINEAR_CLOSE = within(median=5e-5, largest=1e-2)


def assert_greedy_agrees(got: list[int], ref_logits: np.ndarray, rel: float = 1e-4) -> None:
    """Each of the engine's greedy tokens is the reference's argmax after the same prefix
    (ref_logits [len(got), vocab]: one causal pass over prompt + got[:-1], so one near tie
    cannot send the rest of the comparison down another sequence), or a near tie with it: within
    `rel` of the largest |logit|, the tolerance of the logit comparisons against transformers."""
    ref = np.asarray(ref_logits, np.float64)
    assert ref.shape[0] == len(got), (ref.shape, len(got))
    gap = ref.max(-1) - ref[np.arange(len(got)), got]
    tol = rel * np.abs(ref).max()
    bad = np.flatnonzero(gap > tol)
    assert bad.size == 0, (f"steps {bad.tolist()}: {gap[bad].tolist()} below the argmax "
                           f"(tolerance {tol:.3g})")


def _compare(got: np.ndarray, want: np.ndarray, what: str, splits: tuple[int, ...],
             close: Close | None) -> None:
    """The same bits, unless `close` is given and a split is not a multiple of LINEAR_CHUNK"""
    if close is None or all(s % LINEAR_CHUNK == 0 for s in splits):
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        close(got, want, what)


def assert_threads_and_chunks_bit_identical(path: Path, toks: list[int], chunk: int,
                                            close: Close | None = None) -> None:
    """The prompt's logits and decode steps after it: every kernel path this CPU runs and other
    thread counts give the same bits; other chunk sizes too, or (linear attention, `close`
    given) within `close` where the size is not a multiple of LINEAR_CHUNK, then also checked
    at twice LINEAR_CHUNK (the same bits)."""
    with Engine(path, threads=1, chunk=chunk) as e1:
        base = prefill_then_decode(e1, toks)
    runs = [(threads, run_chunk, "auto")
            for threads, run_chunk in (*RUNS, *(((1, 2 * LINEAR_CHUNK),) if close else ()))]
    runs += [(2, chunk, name) for name in runnable_kernels()[:-1]]  # the last one is auto's
    for threads, run_chunk, kernels in runs:
        run_chunk = run_chunk or chunk
        with Engine(path, threads=threads, chunk=run_chunk, kernels=kernels) as e:
            _compare(prefill_then_decode(e, toks), base,
                     f"threads={threads} chunk={run_chunk} kernels={kernels}",
                     () if run_chunk == chunk else (run_chunk, chunk), close)


def assert_snapshot_continuation_equals_one_pass(path: Path, turn1: list[int],
                                                 turn2: list[int], chunk: int,
                                                 close: Close | None = None) -> None:
    """Chat: a snapshot after turn 1, a reply generated past it, the snapshot restored; turn 2
    fed from there gives the logits of one pass over both turns (`close`: as
    assert_pieces_equal_one_pass)."""
    with Engine(path, threads=1, chunk=chunk) as e:
        full = e.logits(turn1 + turn2)
        e.reset()
        e.feed(turn1)
        snap = e.snapshot()
        list(e.generate([turn2[0]], 5, reset=False))
        e.restore(snap)
        got = e.logits(turn2, reset=False)
    _compare(got, full[len(turn1):], "turn 2", (len(turn1),), close)


def assert_pieces_equal_one_pass(path: Path, toks: list[int], cuts: tuple[int, ...],
                                 chunk: int | None = None, close: Close | None = None) -> None:
    """Feeding `toks` split at `cuts` gives the logits of one pass over all of them; with
    `close` (linear attention) within it where a cut is not a multiple of LINEAR_CHUNK."""
    opts = {"chunk": chunk} if chunk else {}
    with Engine(path, threads=1, **opts) as e:
        full = e.logits(toks)
        e.reset()
        got = np.concatenate([e.logits(toks[start:end], reset=False)
                              for start, end in zip((0, *cuts), (*cuts, len(toks)), strict=True)])
        assert e.position == len(toks)
    _compare(got, full, f"cuts {cuts}", cuts, close)


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
    with Engine(path, threads=1, chunk=chunk) as ok:  # the same calls, none failing
        ok.feed(head)
        want = ok.logits(rest, reset=False)
    # no warm-up: the damaged records must still be unread when the call needs them
    with Engine(bad, verify_reads=True, threads=1, chunk=chunk, warm=False) as e:
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
    np.testing.assert_array_equal(got, want)
