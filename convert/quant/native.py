"""ctypes wrappers of the encoder's hot loops (convert/native/encoder.c, built by setup.py as
moepack.convert._encoder; the engine library is not involved).

Work is split into fixed chunks of vectors (the same split for any thread count) and each chunk is
independent, so results do not depend on how many threads run them. ctypes releases the GIL
during the C call, so a thread pool gives real parallelism.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

DIM = 8
MAX_BEAM = 16
CHUNK = 8192  # vectors per C call; fixed so results do not depend on the thread count

_f32p = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
_i32p = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
_u8p = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
_sz = ctypes.c_size_t
_int = ctypes.c_int


@functools.cache
def lib() -> ctypes.CDLL:
    """The encoder library with its functions' signatures set."""
    here = Path(__file__).resolve().parent.parent  # the moepack.convert package
    paths = [here / f"_encoder{s}" for s in importlib.machinery.EXTENSION_SUFFIXES]
    found = [p for p in paths if p.exists()]
    if not found:
        raise RuntimeError(f"moepack encoder library not built (looked in {here}); "
                           "run `make install`")
    so = ctypes.CDLL(str(found[0]))
    sigs = {
        "mp_vq_assign": (_int, [_f32p, _sz, _f32p, _int, _i32p, ctypes.c_void_p]),
        "mp_vq_mindist_update": (ctypes.c_double, [_f32p, _sz, _f32p, _f32p]),
        "mp_vq_pick": (_sz, [_f32p, _sz, ctypes.c_double]),
        "mp_vq_update": (_int, [_f32p, _sz, _i32p, _int, _f32p]),
        "mp_rvq_encode": (_int, [_f32p, _sz, _f32p, _int, _int, _int, _u8p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(so, name)
        fn.restype = res
        fn.argtypes = args
    return so


def _vectors(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != DIM:
        raise ValueError(f"expected vectors of shape [n, {DIM}], got {list(x.shape)}")
    return x


def _chunked(n: int, threads: int, fn) -> None:
    """Run fn(lo, hi) over fixed CHUNK-sized ranges of 0..n, on `threads` threads."""
    ranges = [(lo, min(n, lo + CHUNK)) for lo in range(0, n, CHUNK)]
    if threads <= 1 or len(ranges) <= 1:
        for lo, hi in ranges:
            fn(lo, hi)
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for f in [pool.submit(fn, lo, hi) for lo, hi in ranges]:
            f.result()


def assign(
    x: np.ndarray, cb: np.ndarray, *, threads: int = 1, with_dist: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """Nearest codeword index (ties -> lowest) and squared distance (None unless with_dist) for
    each vector."""
    x = _vectors(x)
    cb = _vectors(cb)
    n = x.shape[0]
    idx = np.empty(n, np.int32)
    dist = np.empty(n, np.float32) if with_dist else None

    def run(lo: int, hi: int) -> None:
        rc = lib().mp_vq_assign(x[lo:hi], hi - lo, cb, cb.shape[0], idx[lo:hi],
                                None if dist is None else dist[lo:hi].ctypes.data)
        if rc:
            raise ValueError(f"mp_vq_assign failed (k={cb.shape[0]})")

    _chunked(n, threads, run)
    return idx, dist


def mindist_update(x: np.ndarray, c: np.ndarray, d: np.ndarray) -> float:
    """d = min(d, |x - c|^2) in place (k-means++ seeding); returns sum(d) (f64, in order)."""
    return lib().mp_vq_mindist_update(x, x.shape[0], np.ascontiguousarray(c, np.float32), d)


def pick(d: np.ndarray, target: float) -> int:
    """First index whose running f64 sum of d exceeds target (D^2 sampling)."""
    return int(lib().mp_vq_pick(d, d.shape[0], target))


def update(x: np.ndarray, idx: np.ndarray, cb: np.ndarray) -> int:
    """Lloyd centroid update in place; returns the number of empty clusters (they keep centres)."""
    rc = lib().mp_vq_update(_vectors(x), x.shape[0], idx, cb.shape[0], cb)
    if rc < 0:
        raise ValueError("mp_vq_update failed")
    return rc


def rvq_encode(x: np.ndarray, cb: np.ndarray, *, beam: int = 1, threads: int = 1) -> np.ndarray:
    """RVQ codes [n, stages] (u8) of vectors x [n, 8] against cb [stages, k, 8]."""
    x = _vectors(x)
    cb = np.ascontiguousarray(cb, dtype=np.float32)
    stages, k = cb.shape[0], cb.shape[1]
    if not 1 <= beam <= MAX_BEAM:
        raise ValueError(f"beam must be in 1..{MAX_BEAM}, got {beam}")
    n = x.shape[0]
    codes = np.empty((n, stages), np.uint8)

    def run(lo: int, hi: int) -> None:
        if lib().mp_rvq_encode(x[lo:hi], hi - lo, cb, stages, k, beam, codes[lo:hi]):
            raise ValueError("mp_rvq_encode failed")

    _chunked(n, threads, run)
    return codes
