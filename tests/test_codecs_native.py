"""The encoder library's loops (convert/native/encoder.c) keep the search semantics they state."""

import numpy as np
import pytest
from moepack.convert.quant import native

RNG = np.random.default_rng(5)


def test_assign_ties_go_to_lowest_index() -> None:
    cb = np.zeros((256, 8), np.float32)
    cb[10] = 1.0
    cb[20] = 1.0  # duplicate of entry 10
    x = np.ones((3, 8), np.float32)
    idx, dist = native.assign(x, cb)
    assert idx.tolist() == [10, 10, 10] and dist.tolist() == [0.0, 0.0, 0.0]
    idx, _ = native.assign(np.full((1, 8), 0.5, np.float32), cb)
    assert idx[0] == 0  # equidistant from 0 and 10: lowest index


@pytest.mark.parametrize("k", [256, 100, 3])
def test_assign_matches_reference_scores(k: int) -> None:
    """Nearest = least |c|^2 - 2 x.c, each summed in dimension order in f32 (codec.h)."""
    x = RNG.standard_normal((501, 8)).astype(np.float32)
    cb = RNG.standard_normal((k, 8)).astype(np.float32)
    dot = x[:, None, 0] * cb[None, :, 0]
    cn = cb[:, 0] * cb[:, 0]
    for d in range(1, 8):
        dot = dot + x[:, None, d] * cb[None, :, d]
        cn = cn + cb[:, d] * cb[:, d]
    score = cn[None] - (dot + dot)
    idx, dist = native.assign(x, cb)
    assert np.array_equal(idx, score.argmin(1))
    exact = np.sum((x - cb[idx]) ** 2, axis=1)
    assert np.allclose(dist, exact, atol=1e-4)


def test_beam_search_beats_greedy() -> None:
    """Not per vector (a pruned greedy path can win at the last stage), but on average."""
    x = RNG.standard_normal((2000, 8)).astype(np.float32)
    cb = (RNG.standard_normal((3, 256, 8)) * [[[1.0]], [[0.5]], [[0.25]]]).astype(np.float32)

    def err(codes: np.ndarray) -> np.ndarray:
        rec = cb[0][codes[:, 0]] + cb[1][codes[:, 1]] + cb[2][codes[:, 2]]
        return np.sum((x - rec) ** 2, axis=1)

    greedy = err(native.rvq_encode(x, cb, beam=1))
    beam = err(native.rvq_encode(x, cb, beam=8))
    assert np.mean(beam <= greedy + 1e-6) > 0.9 and beam.mean() < 0.95 * greedy.mean()


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="beam"):
        native.rvq_encode(np.zeros((1, 8), np.float32), np.zeros((3, 256, 8), np.float32), beam=17)
    with pytest.raises(ValueError, match="shape"):
        native.assign(np.zeros((4, 4), np.float32), np.zeros((256, 8), np.float32))
