"""`make -C runtime asan`: the C tests (blake3, json, vectors, io, cache, memplan, fuzz) built with
AddressSanitizer + UBSan over every runtime source, run against spec/vectors (plus a fuzz pass over
resealed damaged variants of the valid vectors). Slow: a clean sanitizer build of all runtime
sources takes ~35 s on 2 shared cores."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_c_tests_under_asan_and_ubsan():
    if shutil.which("make") is None or shutil.which("gcc") is None:
        pytest.skip("needs make and gcc")
    proc = subprocess.run(["make", "-C", str(ROOT / "runtime"), "asan"], capture_output=True,
                          text=True, timeout=850)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "ERROR: AddressSanitizer" not in out and "runtime error:" not in out, out[-6000:]
    results = dict(re.findall(r"^(test_\w+): \d+ checks, (\d+) failures$", out, re.M))
    names = ("test_blake3", "test_json", "test_vectors", "test_io", "test_cache", "test_memplan",
             "test_fuzz")
    for name in names:
        assert results.get(name) == "0", f"{name}: {results.get(name)}\n{out[-3000:]}"
