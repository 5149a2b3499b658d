"""One request on the engine: reuse the cached prefix, feed the rest, sample token by token
(constraints, stop tokens and strings, logprobs), checking for cancellation every token."""

from __future__ import annotations

import ctypes as C
import functools
import threading
import time

import numpy as np
from moepack.runtime.engine import (
    MP_ECTX,
    Cancelled,
    Engine,
    EngineError,
    LogitAdjust,
    with_rates,
)
from moepack.runtime.prefix import PrefixReuse
from moepack.runtime.tokenizer import StreamDecoder
from moepack.serve.job import Done, Job, Piece, TokenLogprob
from moepack.serve.stops import StopMatcher
from moepack.serve.vocab import Vocab

_MASKED = np.float32(-1e30)  # finite: softmax of a row with -inf max would be NaN
_DELTA_KEYS = ("prompt_tokens", "decode_tokens", "prompt_seconds", "decode_seconds",
               "cache_hits", "cache_misses", "bytes_read", "io_wait_seconds")


def stats_delta(before: dict, after: dict) -> dict:
    """Engine stats of the work between two snapshots, with the derived rates."""
    d = {k: after[k] - before[k] for k in _DELTA_KEYS}
    d["o_direct"] = after["o_direct"]
    return with_rates(d)


def _masked(row: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    out = np.full_like(row, _MASKED)
    out[allowed] = row[allowed]
    return out


def _logprob(vocab: Vocab, logits: np.ndarray, tid: int, top: int) -> TokenLogprob:
    x = logits.astype(np.float64)
    m = x.max()
    lse = m + np.log(np.exp(x - m).sum())
    tops: list[tuple[str, float]] = []
    if top:
        idx = np.argpartition(-x, top - 1)[:top]
        idx = idx[np.argsort(-x[idx])]
        tops = [(vocab.piece(int(i)), float(x[i] - lse)) for i in idx]
    return TokenLogprob(vocab.piece(tid), float(x[tid] - lse), tops)


class Generator:
    """Owns the engine's sequence: `cached` mirrors the tokens in its KV cache."""

    def __init__(self, engine: Engine, vocab: Vocab) -> None:
        self.engine, self.vocab = engine, vocab
        self.cached: list[int] = []
        self.prefix = PrefixReuse(engine)  # KV truncation, or a linear-attention snapshot
        self._running: Job | None = None  # the job whose calls the engine runs (_cancel)
        self._running_lock = threading.Lock()

    def _feed(self, ids: list[int], job: Job) -> np.ndarray:
        # all or nothing: on error (a cancel included) the cache is as it was; a cancel set
        # before the call starts is seen as it starts
        logits = self.engine.feed(ids, cancelled=job.cancel.is_set)
        self.cached.extend(ids)
        return logits

    def _continue(self, job: Job) -> list[int]:
        """A chat turn that extends the cached conversation as text keeps the cached tokens:
        re-encoding the previous reply may split it differently from how it was generated,
        and the token prefix would then end inside it."""
        if not job.prompt_text or not self.cached:
            return job.prompt
        head = self.vocab.tok.decode(self.cached)
        if len(job.prompt_text) <= len(head) or not job.prompt_text.startswith(head):
            return job.prompt
        rest = self.vocab.tok.encode(job.prompt_text[len(head):], add_special_tokens=False)
        return self.cached + rest if rest else job.prompt

    def run(self, job: Job) -> Done:
        with self._running_lock:
            self._running = job
        job.cancel.hook = functools.partial(self._cancel, job)  # a long prompt stops too
        try:
            return self._run(job)
        finally:
            with self._running_lock:
                self._running = None

    def _cancel(self, job: Job) -> None:
        """Stop the engine's call if it is `job`'s: a cancel that comes as the job ends must
        not stop the next job's."""
        with self._running_lock:
            if self._running is job:
                self.engine.cancel()

    def _run(self, job: Job) -> Done:
        t0 = time.monotonic()
        eng, vocab = self.engine, self.vocab
        before = eng.stats()
        job.prompt = self._continue(job)
        if len(job.prompt) >= eng.ctx:
            raise EngineError(f"prompt of {len(job.prompt)} tokens does not fit ctx {eng.ctx}",
                              MP_ECTX)
        # feed at least two prompt tokens (PrefixReuse.rewind); the last one's logits start
        # the reply
        reuse = self.prefix.rewind(job.prompt)
        del self.cached[reuse:]
        try:
            logits = self._feed(job.prompt[reuse:], job)
        except Cancelled:  # the engine's sequence is as before the prompt; so is `cached`
            # of the prompt only the reused tokens are in: the rest was never evaluated
            return Done("cancelled", reuse, reuse, 0, "",
                        stats_delta(before, eng.stats()), time.monotonic() - t0, None)
        self.prefix.mark()  # the prompt is in, the reply not yet: a turn boundary
        # the engine's own sampler and RNG, so a seed gives what `moepack run --seed` gives
        rng = C.c_uint64(eng._lib.mp_rng_seed(int(job.seed) & (2**64 - 1)))
        limit = min(job.max_tokens, eng.ctx - len(job.prompt))
        # special tokens (a BOS sampled mid-reply) give no text; a stop token ends the reply
        dec = StreamDecoder(vocab.tok, vocab.special_ids - job.show_special)
        stop = StopMatcher(job.stops)
        out, n, finish, first = [], 0, "length", None
        con = job.constraint
        adjust = job.adjust or LogitAdjust(vocab.size)
        while n < limit:
            if job.cancel.is_set():
                finish = "cancelled"
                break
            tid = con.forced() if con is not None else None
            if tid is None:
                # bias and penalties first, the constraint's mask last: it wins over a bias
                row = adjust.apply(logits)
                allowed = con.allowed() if con is not None else None
                if allowed is not None:
                    if allowed.size == 0:
                        finish = "stop"
                        break
                    row = _masked(row, allowed)
                tid = eng.sample(row, job.temperature, 0, job.top_p, rng)
            adjust.record(tid)
            n += 1
            if first is None:
                first = time.monotonic() - t0
            lp = (_logprob(vocab, logits, tid, job.top_logprobs)
                  if job.top_logprobs is not None else None)
            if tid in vocab.stop_ids and con is None:
                finish = "stop"
                job.emit(Piece("", tid, lp))
                break
            if con is not None:
                con.advance(tid)
            text = stop.push(dec.push(tid))
            out.append(text)
            job.emit(Piece(text, tid, lp))
            if stop.stopped or (con is not None and con.done):
                finish = "stop"
                break
            if n < limit:
                try:
                    logits = self._feed([tid], job)
                except Cancelled:
                    finish = "cancelled"
                    break
        if not stop.stopped:  # held-back text that never became a stop string
            tail = stop.flush()
            if tail:
                out.append(tail)
                job.emit(Piece(tail, -1, None))
        return Done(finish, len(job.prompt), reuse, n, "".join(out),
                    stats_delta(before, eng.stats()), time.monotonic() - t0, first)
