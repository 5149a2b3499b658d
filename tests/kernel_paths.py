"""The engine's kernel paths (runtime/src/kernels.h) and which this CPU runs, for the tests that
force each path (tests/test_runtime_engine.py, tests/test_runtime_models_dsa.py)."""

from __future__ import annotations

# each needs all the features the one before needs
KERNELS = ("scalar", "avx2", "avx512vbmi", "avx512amx")


def cpu_flags() -> list[str]:
    try:
        return open("/proc/cpuinfo").read().split()
    except OSError:
        return []


def cpu_has_avx2() -> bool:
    return all(f in cpu_flags() for f in ("avx2", "fma", "f16c", "bmi2"))


def best_kernels() -> str:
    """What kernels="auto" picks on this CPU."""
    vbmi = ("avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512_vnni")
    if cpu_has_avx2() and all(f in cpu_flags() for f in vbmi):
        # Linux lists amx_* only when it saves the tile state; the engine also asks for the
        # tile-data permission, which a kernel that lists them grants
        amx = all(f in cpu_flags() for f in ("amx_tile", "amx_int8"))
        return "avx512amx" if amx else "avx512vbmi"
    return "avx2" if cpu_has_avx2() else "scalar"


def runnable_kernels() -> tuple[str, ...]:
    """The paths this CPU runs, scalar first."""
    return KERNELS[:KERNELS.index(best_kernels()) + 1]


def prefill_then_decode(engine, toks: list[int], steps: int = 8):
    """The prompt's logits (the prefill products), then those of `steps` tokens (the prompt's
    first ones again) fed one at a time (the decode products: their own kernels and tables), as
    one [len(toks) + steps, vocab] array to compare across paths, thread counts and chunks."""
    import numpy as np

    rows = [engine.logits(toks)]
    rows += [engine.feed([t])[None] for t in toks[:steps]]
    return np.concatenate(rows)
