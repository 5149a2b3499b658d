"""The AVX2 clone and the baseline (SSE2) build of the codec loops give identical bytes.

The engine dispatches codec.c's hot loops to an AVX2 clone on CPUs that have it. This test
compiles codec.c a second time without clones (baseline x86-64 only) and compares encoder
outputs, which stands in for "the same bytes on any x86-64 machine".
"""

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from moepack.convert.quant import native

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["-std=c11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared",
         "-march=x86-64", "-DMP_NO_CLONES"]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> ctypes.CDLL:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("isa") / "codec_baseline.so"
    subprocess.run([cc, *FLAGS, "-I", str(ROOT / "runtime/include"), "-I",
                    str(ROOT / "runtime/src"), str(ROOT / "runtime/src/codec.c"), "-o", str(out),
                    "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    main = native.lib()
    for name in ("mp_vq_assign", "mp_rvq_encode", "mp_vq_mindist_update"):
        fn = getattr(lib, name)
        fn.restype = getattr(main, name).restype
        fn.argtypes = getattr(main, name).argtypes
    return lib


def test_assign_and_encode_identical(baseline: ctypes.CDLL) -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_t(3, (3001, 8)) * 0.3).astype(np.float32)
    cb = (rng.standard_normal((3, 256, 8)) * [[[0.3]], [[0.15]], [[0.07]]]).astype(np.float32)
    for k in (256, 37):
        ia, ib = np.empty(3001, np.int32), np.empty(3001, np.int32)
        da, db = np.empty(3001, np.float32), np.empty(3001, np.float32)
        native.lib().mp_vq_assign(x, 3001, np.ascontiguousarray(cb[0, :k]), k, ia,
                                  da.ctypes.data)
        baseline.mp_vq_assign(x, 3001, np.ascontiguousarray(cb[0, :k]), k, ib, db.ctypes.data)
        assert np.array_equal(ia, ib) and da.tobytes() == db.tobytes()
    for beam in (1, 4):
        ca, cbb = np.empty((3001, 3), np.uint8), np.empty((3001, 3), np.uint8)
        native.lib().mp_rvq_encode(x, 3001, cb, 3, 256, beam, ca)
        baseline.mp_rvq_encode(x, 3001, cb, 3, 256, beam, cbb)
        assert np.array_equal(ca, cbb)


def _tie_heavy(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Vectors and codebooks with exact ties: repeated entries, repeated and zero vectors, and
    values on a coarse grid (many equal scores)."""
    x = (np.round(rng.standard_t(3, (n, 8)) * 4) / 8).astype(np.float32)
    x[::7] = x[3]
    x[::11] = 0.0
    cb = (np.round(rng.standard_normal((4, 256, 8)) * 4) / [[[8]], [[16]], [[32]], [[64]]])
    cb = cb.astype(np.float32)
    cb[:, 100:110] = cb[:, 5:15]  # duplicate entries: ties -> lower index
    return x, cb


@pytest.mark.parametrize("k", [256, 250, 48, 37, 8, 3])
def test_assign_fast_paths_identical(baseline: ctypes.CDLL, k: int) -> None:
    """The fused AVX2 / AVX-512 assignment (and its fallbacks) equals the baseline loop."""
    rng = np.random.default_rng(k)
    x, cb = _tie_heavy(rng, 2053)
    xs = [x, (rng.standard_normal((1001, 8)) * 0.3).astype(np.float32)]
    big = xs[1].copy()
    big[5, 2] = 3e38  # scores overflow: the guarded paths must still agree
    big[9, 0] = np.inf
    xs.append(big)
    for xv in xs:
        n = xv.shape[0]
        c = np.ascontiguousarray(cb[0, :k])
        ia, ib = np.empty(n, np.int32), np.empty(n, np.int32)
        da, db = np.empty(n, np.float32), np.empty(n, np.float32)
        native.lib().mp_vq_assign(xv, n, c, k, ia, da.ctypes.data)
        baseline.mp_vq_assign(xv, n, c, k, ib, db.ctypes.data)
        assert np.array_equal(ia, ib) and da.tobytes() == db.tobytes()


@pytest.mark.parametrize("stages,k", [(1, 256), (2, 256), (3, 256), (4, 256), (3, 37), (3, 48)])
def test_beam_fast_paths_identical(baseline: ctypes.CDLL, stages: int, k: int) -> None:
    """Beam search with the AVX2 candidate filter, 1-wide last stage and AVX-512 scoring equals
    the baseline search for every width, with exact ties and with non-finite inputs."""
    rng = np.random.default_rng(stages * 1000 + k)
    x, cb4 = _tie_heavy(rng, 1503)
    cb = np.ascontiguousarray(cb4[:stages, :k])
    bad = x.copy()
    bad[17, 3] = np.nan
    bad[18, 0] = 2e30
    for xv in (x, bad):
        n = xv.shape[0]
        for beam in (1, 2, 3, 4, 5, 8, 9, 16):
            ca, cbb = np.empty((n, stages), np.uint8), np.empty((n, stages), np.uint8)
            native.lib().mp_rvq_encode(xv, n, cb, stages, k, beam, ca)
            baseline.mp_rvq_encode(xv, n, cb, stages, k, beam, cbb)
            assert np.array_equal(ca, cbb), (beam, stages, k)


def test_mindist_update_identical(baseline: ctypes.CDLL) -> None:
    """The vectorised k-means++ distance update equals the scalar loop (tail, NaN, ties)."""
    rng = np.random.default_rng(9)
    x = (rng.standard_t(3, (1027, 8)) * 0.3).astype(np.float32)
    x[4] = np.nan
    x[::5] = x[1]
    da = np.full(1027, np.inf, np.float32)
    db = da.copy()
    for c in x[[0, 1, 2, 4, 10]]:
        c = np.ascontiguousarray(c)
        ta = native.lib().mp_vq_mindist_update(x, 1027, c, da)
        tb = baseline.mp_vq_mindist_update(x, 1027, c, db)
        assert da.tobytes() == db.tobytes() and (ta == tb or (np.isnan(ta) and np.isnan(tb)))
