"""Cross-ISA bit identity.

1. The AVX2 clone and the baseline (SSE2) build of the encoder loops give identical bytes: the
   encoder library dispatches encoder.c's hot loops to an AVX2 clone on CPUs that have it. This
   test compiles convert/native/encoder.c a second time without clones (baseline x86-64 only)
   and compares encoder outputs, which stands in for "the same bytes on any x86-64 machine".
2. The routed-expert kernels (runtime/src/kernels*.c: scalar, AVX2, AVX-512 VBMI) give the bits
   of the numpy references of CODECS.md §3.5 and §3.6 (moepack.format.rvq_matvec), and the
   trunk's prefill product those of §2.4 (moepack.format.group_gemm), for every path this CPU
   runs and every thread count.
"""

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from moepack.convert.quant import native
from moepack.format.codecs import encoded_nbytes, rvq_tile_codes
from moepack.format.group_gemm import group_gemm
from moepack.format.rvq_matvec import rvq_gemm, rvq_matvec

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ["-std=c11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared",
         "-march=x86-64", "-DMP_NO_CLONES"]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> ctypes.CDLL:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("isa") / "encoder_baseline.so"
    subprocess.run([cc, *FLAGS, str(ROOT / "convert/native/encoder.c"), "-o", str(out), "-lm"],
                   check=True)
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


# ---------------------------------------------------------------- expert kernels vs §3.5 reference

KERNEL_WRAPPER = r"""
#include <stdlib.h>
#include "kernels.h"
/* one §3.5 product through the public kernel API: path `which` (MPK_*), `threads` workers */
__attribute__((visibility("default")))
int mpk_test_rvq_matvec(int which, int threads, const uint8_t *part, long long rows, long long cols,
                        int stages, const float *cb, const float *x, float *y) {
    const mpk_impl *k = mpk_select(which);
    if (!k) return -1;
    float *cbt = malloc((size_t)stages * 2048 * 4);
    void *mem = malloc(mpk_rvq_tab_bytes(cols, stages));
    mpk_pool *pool = threads > 1 ? mpk_pool_create(threads) : NULL;
    mpk_rvq_transpose_cb(cb, stages, cbt);
    mpk_rvq_tab t;
    mpk_rvq_tab_init(&t, mem, cols, stages);
    mpk_rvq_tables(k, pool, cbt, x, &t);
    mpk_rvq w;
    mpk_rvq_init(&w, rows, cols, stages, part);
    mpk_rvq_matvec(k, pool, &w, &t, y);
    mpk_pool_destroy(pool);
    free(mem);
    free(cbt);
    return 0;
}
/* the §3.6 product of n inputs x[n][cols] */
__attribute__((visibility("default")))
int mpk_test_rvq_gemm(int which, int threads, const uint8_t *part, long long rows, long long cols,
                      int stages, const float *cb, const float *x, long long n, float *y) {
    const mpk_impl *k = mpk_select(which);
    if (!k) return -1;
    const size_t xs = mpk_rvq_xq_bytes(cols);
    uint8_t *xq = aligned_alloc(32, (size_t)n * xs);
    for (long long i = 0; i < n; i++) mpk_rvq_xq(x + i * cols, cols, xq + i * xs);
    mpk_rvq_icb *icb = malloc(sizeof *icb);
    mpk_rvq_icb_init(icb, cb, stages);
    mpk_pool *pool = threads > 1 ? mpk_pool_create(threads) : NULL;
    mpk_rvq w;
    mpk_rvq_init(&w, rows, cols, stages, part);
    mpk_rvq_gemm(k, pool, &w, icb, xq, xs, n, NULL, y);
    mpk_pool_destroy(pool);
    free(icb);
    free(xq);
    return 0;
}
/* the trunk's product (§2.4 for q8 / q6 / q4: kind 0 / 1 / 2) of n inputs x[n][cols] */
__attribute__((visibility("default")))
int mpk_test_group_gemm(int which, int threads, int kind, int zero_point, long long group,
                        const uint8_t *data, long long rows, long long cols, const float *x,
                        long long n, float *y) {
    const mpk_impl *k = mpk_select(which);
    static const int kinds[] = {MP_CODEC_Q8, MP_CODEC_Q6, MP_CODEC_Q4};
    mpk_mat w;
    if (!k || mpk_mat_init(&w, kinds[kind], rows, cols, group, zero_point, data)) return -1;
    mpk_pool *pool = threads > 1 ? mpk_pool_create(threads) : NULL;
    mpk_gemm(k, pool, &w, x, n, y);
    mpk_pool_destroy(pool);
    return 0;
}
"""
PATHS = {"scalar": 1, "avx2": 2, "avx512vbmi": 3, "avx512amx": 4}  # kernels.h MPK_*


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> ctypes.CDLL:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("kernels")
    (d / "wrap.c").write_text(KERNEL_WRAPPER)
    src = ROOT / "runtime/src"
    # every kernel table (kernels*.c), alloc.c for the pool's buffers, codecs.c for the size rule
    srcs = [*sorted(src.glob("kernels*.c")), src / "alloc.c", src / "codecs.c", src / "json.c"]
    out = d / "kernels.so"
    subprocess.run([cc, "-std=c11", "-O2", "-ffp-contract=off", "-fno-fast-math", "-pthread",
                    "-fPIC", "-shared", "-fvisibility=hidden", "-I", str(ROOT / "runtime/include"),
                    "-I", str(src), str(d / "wrap.c"), *map(str, srcs), "-o", str(out), "-lm"],
                   check=True)
    lib = ctypes.CDLL(str(out))
    f = lib.mpk_test_rvq_matvec
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong,
                  ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                  ctypes.c_void_p]
    g = lib.mpk_test_rvq_gemm
    g.restype = ctypes.c_int
    g.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong,
                  ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                  ctypes.c_longlong, ctypes.c_void_p]
    h = lib.mpk_test_group_gemm
    h.restype = ctypes.c_int
    h.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                  ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_void_p,
                  ctypes.c_longlong, ctypes.c_void_p]
    return lib


def _part(rng, rows: int, cols: int, stages: int) -> tuple[dict, bytes]:
    nv = -(-cols // 8)
    codes = rng.integers(0, 256, (rows, nv, stages), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, rows).astype(np.float16)
    codec = {"name": "rvq", "stages": stages, "dim": 8, "entries": 256, "rotation": "none"}
    return codec, rvq_tile_codes(codes).tobytes() + scales.astype("<f2").tobytes()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical, NaN compared as NaN (the kernels canonicalise NaN payloads)."""
    na, nb = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(na, nb) and np.array_equal(a[~na].view(np.uint32),
                                                           b[~nb].view(np.uint32)))


# stages 5 and 7 split into passes of 4 + 1 and 4 + 3 on AVX-512; 1030 rows = 17 tiles: blocks
# of 4, 2 and 1 tiles for each thread count
@pytest.mark.parametrize("rows,cols,stages", [(1, 7, 1), (100, 20, 2), (130, 300, 4),
                                              (64, 1100, 3), (257, 520, 8), (700, 1536, 4),
                                              (1030, 264, 5), (520, 72, 7)])
def test_expert_kernels_match_reference(kernels: ctypes.CDLL, rows: int, cols: int,
                                        stages: int) -> None:
    rng = np.random.default_rng(rows * 7 + cols * 3 + stages)
    codec, data = _part(rng, rows, cols, stages)
    cb = (rng.standard_normal((stages, 256, 8)) / 2.0 ** np.arange(stages)[:, None, None])
    cb = np.ascontiguousarray(cb.astype(np.float32))
    xs = [rng.standard_normal(cols).astype(np.float32), np.zeros(cols, np.float32)]
    huge = rng.standard_normal(cols).astype(np.float32)
    huge[cols // 2] = 1e30  # its group's other entries round to 0
    tiny = (rng.standard_normal(cols) * 1e-31).astype(np.float32)  # tables below 2^-96: zeros
    nan = rng.standard_normal(cols).astype(np.float32)
    nan[-1] = np.nan  # the whole product is NaN
    xs += [huge, tiny, nan]
    buf = np.frombuffer(data, np.uint8).copy()
    ran = []
    for x in xs:
        ref = rvq_matvec(codec, (rows, cols), data, cb, x)
        for name, which in PATHS.items():
            for threads in (1, 2, 3):
                y = np.full(rows, 7.0, np.float32)
                rc = kernels.mpk_test_rvq_matvec(which, threads, buf.ctypes.data, rows, cols,
                                                 stages, cb.ctypes.data, x.ctypes.data,
                                                 y.ctypes.data)
                if rc:  # this CPU cannot run that path
                    continue
                ran.append(name)
                assert _same(y, ref), (name, threads, np.flatnonzero(y != ref)[:5])
    assert "scalar" in ran


@pytest.mark.parametrize("rows,cols,stages", [(1, 7, 1), (100, 20, 2), (130, 300, 4),
                                              (64, 1100, 3), (257, 520, 8), (520, 72, 7)])
def test_prefill_kernels_match_reference(kernels: ctypes.CDLL, rows: int, cols: int,
                                         stages: int) -> None:
    """§3.6 on every path and thread count: the reference's bits for a batch of 67 inputs (an
    odd count past one call's 64), among them a zero, a huge, a tiny and a NaN input."""
    rng = np.random.default_rng(rows * 5 + cols + stages)
    codec, data = _part(rng, rows, cols, stages)
    cb = (rng.standard_normal((stages, 256, 8)) / 2.0 ** np.arange(stages)[:, None, None])
    cb = np.ascontiguousarray(cb.astype(np.float32))
    x = rng.standard_normal((67, cols)).astype(np.float32)
    x[3] = 0
    x[4, cols // 2] = 1e30
    x[5] *= np.float32(1e-31)
    x[6, -1] = np.nan
    ref = rvq_gemm(codec, (rows, cols), data, cb, x)
    assert np.isnan(ref[6]).all() and not np.isnan(ref[7]).any()
    buf = np.frombuffer(data, np.uint8).copy()
    ran = []
    for name, which in PATHS.items():
        for threads in (1, 2, 3):
            y = np.full((67, rows), 7.0, np.float32)
            rc = kernels.mpk_test_rvq_gemm(which, threads, buf.ctypes.data, rows, cols, stages,
                                           cb.ctypes.data, x.ctypes.data, 67, y.ctypes.data)
            if rc:  # this CPU cannot run that path
                continue
            ran.append(name)
            assert _same(y, ref), (name, threads, np.argwhere(y != ref)[:5])
    assert "scalar" in ran


@pytest.mark.parametrize("case", ["inf entry", "nan entry", "all zero", "tiny"])
def test_prefill_codebook_edge_cases(kernels: ctypes.CDLL, case: str) -> None:
    """§3.6 step 1 at its edges: a non-finite codebook entry makes every row NaN, a zero codebook
    (p = 0) every row 0, a tiny one (p capped at 100) still the reference's bits, on every path."""
    rows, cols, stages = 70, 300, 3
    rng = np.random.default_rng(11)
    codec, data = _part(rng, rows, cols, stages)
    cb = rng.standard_normal((stages, 256, 8)).astype(np.float32)
    if case == "inf entry":
        cb[2, 255, 7] = np.inf
    elif case == "nan entry":
        cb[1, 3, 0] = np.nan
    elif case == "all zero":
        cb[:] = 0
    else:
        cb *= np.float32(1e-28)  # p would be 106
    cb = np.ascontiguousarray(cb)
    x = rng.standard_normal((5, cols)).astype(np.float32)
    ref = rvq_gemm(codec, (rows, cols), data, cb, x)
    if case.endswith("entry"):
        assert (ref.view(np.uint32) == 0x7FC00000).all()
    elif case == "all zero":
        assert (ref == 0).all()
    else:
        assert np.isfinite(ref).all() and (ref != 0).any()
    buf = np.frombuffer(data, np.uint8).copy()
    ran = []
    for name, which in PATHS.items():
        y = np.full((5, rows), 7.0, np.float32)
        if kernels.mpk_test_rvq_gemm(which, 1, buf.ctypes.data, rows, cols, stages,
                                     cb.ctypes.data, x.ctypes.data, 5, y.ctypes.data):
            continue
        ran.append(name)
        assert _same(y, ref), (name, np.argwhere(y != ref)[:5])
    assert "scalar" in ran


# ---------------------------------------------------------------- trunk prefill product vs §2.4

GROUP_CODECS = {"q8": 0, "q6": 1, "q4": 2}  # mpk_test_group_gemm's kinds


def _group_matrix(rng, codec: dict, rows: int, cols: int) -> bytes:
    """Random codes, finite f16 scales (some negative, a zero) and minimums."""
    n = encoded_nbytes(codec, (rows, cols))
    data = rng.integers(0, 256, n, dtype=np.uint8)
    ng = -(-cols // codec["group_size"])
    planes = 2 if codec.get("zero_point") else 1
    sc = rng.uniform(-0.05, 0.05, planes * rows * ng).astype("<f2")
    sc[1] = 0
    data[: sc.nbytes] = np.frombuffer(sc.tobytes(), np.uint8)
    return data.tobytes()


@pytest.mark.parametrize("codec", [
    {"name": "q8", "group_size": 32}, {"name": "q6", "group_size": 32},
    {"name": "q6", "group_size": 16}, {"name": "q4", "group_size": 32, "zero_point": False},
    {"name": "q4", "group_size": 64, "zero_point": True}, {"name": "q8", "group_size": 256},
], ids=lambda c: f"{c['name']}{'z' if c.get('zero_point') else ''}-g{c['group_size']}")
@pytest.mark.parametrize("rows,cols", [(37, 100), (20, 1031)])
def test_trunk_product_matches_reference(kernels: ctypes.CDLL, codec: dict, rows: int,
                                         cols: int) -> None:
    """§2.4 on every path and thread count: the reference's bits for 35 inputs in one call (the
    prompt's panels, past one micro-kernel step of 8 and one of 3), among them a zero, a huge, a
    tiny and a NaN input, and for one input a call (decode's kernel: rows read as stored, the
    last block of rows overlapping the one before)."""
    rng = np.random.default_rng(rows * 7 + cols + codec["group_size"])
    data = _group_matrix(rng, codec, rows, cols)
    x = rng.standard_normal((35, cols)).astype(np.float32)
    x[3] = 0
    x[4, cols // 2] = 1e30
    x[5] *= np.float32(1e-31)
    x[6, -1] = np.nan
    ref = group_gemm(codec, (rows, cols), data, x)
    assert np.isnan(ref[6]).all() and not np.isnan(ref[7]).any() and (ref[3] == 0).all()
    buf = np.frombuffer(data, np.uint8).copy()
    ran = []
    for name, which in PATHS.items():
        for threads in (1, 3):
            y = np.full((35, rows), 7.0, np.float32)
            if kernels.mpk_test_group_gemm(which, threads, GROUP_CODECS[codec["name"]],
                                           int(bool(codec.get("zero_point"))), codec["group_size"],
                                           buf.ctypes.data, rows, cols, x.ctypes.data, 35,
                                           y.ctypes.data):
                continue  # this CPU cannot run that path
            ran.append(name)
            bad = np.argwhere(y.view(np.uint32) != ref.view(np.uint32))[:5]
            assert _same(y, ref), (name, threads, bad)
            for t in (0, 3, 4, 5, 6, 7):
                one = np.full(rows, 7.0, np.float32)
                assert kernels.mpk_test_group_gemm(which, threads, GROUP_CODECS[codec["name"]],
                                                   int(bool(codec.get("zero_point"))),
                                                   codec["group_size"], buf.ctypes.data, rows, cols,
                                                   x[t].ctypes.data, 1, one.ctypes.data) == 0
                assert _same(one, ref[t]), (name, threads, t)
    assert "scalar" in ran
