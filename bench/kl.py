"""Statistics of a quantised model's next-token distributions against a reference model's.

The methodology of llama.cpp's `llama-perplexity --kl-divergence`: both models are run
teacher-forced over the same token ids; at every scored position the reference distribution P
and the quantised one Q (softmax of the logits) are compared by

- KL(P ‖ Q) = Σ_v P(v) (ln P(v) − ln Q(v))            (nats; mean, median, p99, max)
- top-1 agreement: argmax P == argmax Q                (llama.cpp: "Same top p")
- perplexity of each, exp(mean −ln p(next token)), and their ratio PPL(Q)/PPL(P)
- RMS Δp: root mean square of Q(next) − P(next)        (llama.cpp: "RMS Δp")

All arithmetic is float64 with a max-shifted log-softmax, so float32 logits of 8k-entry
vocabularies give KL values accurate well below 1e-9. Pure numpy; no model code here.

Use `position_stats` per window (it returns per-position arrays), concatenate the windows with
`concat`, then `summarize`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

FIELDS = ("kl", "nll_ref", "nll_q", "top1", "dp")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of [n, vocab] (or [vocab]) logits in float64."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def position_stats(ref_logits: np.ndarray, q_logits: np.ndarray,
                   targets: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
    """Per-position statistics of [n, vocab] logits; targets[i] is the token that follows
    position i (the one both models should predict).

    Returns float64 arrays of length n: kl = KL(ref ‖ q), nll_ref / nll_q = −ln p(target),
    top1 (1.0 where the argmaxes agree), dp = q(target) − ref(target).
    """
    ref = np.asarray(ref_logits)
    q = np.asarray(q_logits)
    t = np.asarray(targets, dtype=np.int64)
    if ref.shape != q.shape or ref.ndim != 2:
        raise ValueError(f"logit arrays must both be [n, vocab]: {ref.shape} vs {q.shape}")
    if t.shape != (ref.shape[0],):
        raise ValueError(f"need one target per position: {t.shape} for {ref.shape[0]} positions")
    if not (np.all(np.isfinite(ref)) and np.all(np.isfinite(q))):
        raise ValueError("logits contain inf or NaN")
    lp = log_softmax(ref)
    lq = log_softmax(q)
    p = np.exp(lp)
    kl = np.sum(p * (lp - lq), axis=-1)
    kl = np.maximum(kl, 0.0)  # exact value is ≥ 0; rounding can give −1e-17
    rows = np.arange(t.size)
    return {
        "kl": kl,
        "nll_ref": -lp[rows, t],
        "nll_q": -lq[rows, t],
        "top1": (np.argmax(ref, axis=-1) == np.argmax(q, axis=-1)).astype(np.float64),
        "dp": np.exp(lq[rows, t]) - p[rows, t],
    }


def concat(parts: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate per-window results of position_stats."""
    parts = list(parts)
    if not parts:
        return {f: np.zeros(0) for f in FIELDS}
    return {f: np.concatenate([p[f] for p in parts]) for f in FIELDS}


def _stderr(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")


def summarize(s: dict[str, np.ndarray]) -> dict[str, float]:
    """Summary of per-position arrays (all positions weigh equally).

    kl_p99 is numpy's default (linear-interpolated) 99th percentile; *_se are standard errors of
    the mean (the ppl ratio's is that of the mean of nll_q − nll_ref, in ln units).
    """
    kl, top1 = s["kl"], s["top1"]
    n = int(kl.size)
    if n == 0:
        raise ValueError("no positions to summarise")
    mean_ref, mean_q = float(np.mean(s["nll_ref"])), float(np.mean(s["nll_q"]))
    return {
        "positions": n,
        "kl_mean": float(np.mean(kl)),
        "kl_mean_se": _stderr(kl),
        "kl_median": float(np.median(kl)),
        "kl_p99": float(np.percentile(kl, 99)),
        "kl_max": float(np.max(kl)),
        "top1": float(np.mean(top1)),
        "top1_se": _stderr(top1),
        "ppl_ref": math.exp(mean_ref),
        "ppl_q": math.exp(mean_q),
        "ppl_ratio": math.exp(mean_q - mean_ref),
        "ln_ppl_ratio_se": _stderr(s["nll_q"] - s["nll_ref"]),
        "rms_dp": float(np.sqrt(np.mean(s["dp"] ** 2))),
    }


def compare(ref_logits: np.ndarray, q_logits: np.ndarray,
            targets: Sequence[int] | np.ndarray) -> dict[str, float]:
    """summarize(position_stats(...)) for one pair of [n, vocab] arrays."""
    return summarize(position_stats(ref_logits, q_logits, targets))
