"""Seeded k-means++ / Lloyd codebook training and residual (RVQ) codebook training.

Deterministic: the only randomness is a numpy Generator seeded by the caller, distances come from
the C loops (fixed order, ties to the lowest index), centroid sums are f64 in index order.
"""

from __future__ import annotations

import numpy as np
from moepack.convert.quant import native


def kmeans_pp_init(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding: each next centre drawn with probability proportional to D(x)^2."""
    n = x.shape[0]
    cb = np.empty((k, native.DIM), np.float32)
    cb[0] = x[rng.integers(n)]
    d = np.full(n, np.inf, np.float32)
    for j in range(1, k):
        total = native.mindist_update(x, cb[j - 1], d)
        if total > 0:
            cb[j] = x[native.pick(d, rng.random() * total)]
        else:  # fewer distinct vectors than entries: any choice is as good
            cb[j] = x[rng.integers(n)]
    return cb


def kmeans(
    x: np.ndarray, k: int, *, iters: int, rng: np.random.Generator, threads: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Codebook [k, 8] and final assignment of x [n, 8]; Lloyd stops early at a fixed point."""
    cb = kmeans_pp_init(x, k, rng)
    idx, _ = native.assign(x, cb, threads=threads, with_dist=False)
    for _ in range(iters):
        native.update(x, idx, cb)
        new, _ = native.assign(x, cb, threads=threads, with_dist=False)
        if np.array_equal(new, idx):
            break
        idx = new
    return cb, idx


def train_codebooks(
    sample: np.ndarray,
    stages: int,
    *,
    seed: int,
    iters: int = 10,
    entries: int = 256,
    refine: int = 0,
    beam: int = 1,
    threads: int = 1,
) -> np.ndarray:
    """RVQ codebooks [stages, entries, 8] trained on sample vectors [n, 8].

    Stage s is k-means on the residual left by stages 0..s-1. With refine > 0, that many rounds
    of joint refinement follow: encode the sample (beam search), then re-fit each stage's
    codebook to what the other stages leave of the vectors that chose each entry.
    """
    rng = np.random.default_rng(seed)
    x = np.ascontiguousarray(sample, dtype=np.float32)
    res = x.copy()
    cbs = np.empty((stages, entries, native.DIM), np.float32)
    for s in range(stages):
        cbs[s], idx = kmeans(res, entries, iters=iters, rng=rng, threads=threads)
        res = res - cbs[s][idx]
    for _ in range(refine):
        codes = native.rvq_encode(x, cbs, beam=beam, threads=threads)
        parts = [cbs[s][codes[:, s]] for s in range(stages)]
        for s in range(stages):
            others = np.zeros_like(x)
            for t in range(stages):  # fixed order keeps the f32 sums reproducible
                if t != s:
                    others = others + parts[t]
            native.update(np.ascontiguousarray(x - others), codes[:, s].astype(np.int32), cbs[s])
            parts[s] = cbs[s][codes[:, s]]
    return cbs
