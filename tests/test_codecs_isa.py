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
    for name in ("mp_vq_assign", "mp_rvq_encode"):
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
