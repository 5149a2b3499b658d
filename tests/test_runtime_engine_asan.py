"""The whole engine (container -> cache -> forward pass -> sampling) under AddressSanitizer and
UBSan, on converted tiny models of every architecture plus a wide synthetic one, with cache
large / off / one record and scalar kernels. Slow: it compiles runtime/src with sanitizers."""

from __future__ import annotations

import glob
import shutil
import subprocess

import pytest
from tiny_models import ARCHS, make_checkpoint

DRIVER = r"""
#include "moepack.h"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int bad = 0;
    for (int a = 1; a < argc; a++) {
        for (int variant = 0; variant < 3; variant++) {
            mp_config cfg; mp_config_default(&cfg); cfg.threads = 2; cfg.ctx = 64;
            cfg.cache_experts = variant == 0 ? -1 : variant == 1 ? 0 : 1;
            cfg.kernels = variant == 2 ? MP_KERNELS_SCALAR : MP_KERNELS_AUTO;
            mp_engine *e; char err[512];
            if (mp_open(argv[a], &cfg, &e, err, sizeof err)) {
                printf("open %s: %s\n", argv[a], err);
                bad = 1;
                continue;
            }
            int V = mp_vocab_size(e);
            int32_t toks[40]; for (int i = 0; i < 40; i++) toks[i] = (i * 7 + 3) % V;
            float *lg = malloc(sizeof(float) * (size_t)V * 40);
            if (mp_eval(e, toks, 40, lg, 1)) { printf("eval: %s\n", mp_error(e)); bad = 1; }
            mp_sampler s = {0.8f, 10, 0.9f, 1};
            if (mp_generate(e, toks, 3, 8, &s, NULL, NULL) < 0) bad = 1;
            free(lg);
            mp_close(e);
        }
    }
    mp_plan_info p; char err[256];
    if (mp_plan("/nonexistent", 0, &p, err, sizeof err) == 0) bad = 1;
    printf("done %d\n", bad);
    return bad;
}
"""


@pytest.mark.slow
def test_engine_under_asan_and_ubsan(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    from moepack.convert.pipeline import convert
    from moepack.convert.settings import Settings
    from moepack.format.synthetic import mixtral_spec, write_synthetic

    files = []
    # GQA variants too: q/k/v biases and partial RoPE (GLM), full-width q/k norms (MiniMax),
    # and an INT4-sourced nested model (Kimi K2.5)
    for arch in ARCHS:
        make_checkpoint(arch, tmp_path / arch, **({"int4_group": 4} if arch == "kimi_k25" else {}))
        convert(tmp_path / arch, tmp_path / f"{arch}.moepack", Settings())
        files.append(tmp_path / f"{arch}.moepack")
    write_synthetic(tmp_path / "wide.moepack", mixtral_spec(hidden=256, inter=192, vocab=80))
    files.append(tmp_path / "wide.moepack")
    write_synthetic(tmp_path / "q6.moepack", mixtral_spec(  # q6 trunk, 4-column group tails
        hidden=260, inter=96, vocab=80, heads=2, kv_heads=1,
        attn={"name": "q6", "group_size": 32}, embed={"name": "q6", "group_size": 16}))
    files.append(tmp_path / "q6.moepack")
    (tmp_path / "drv.c").write_text(DRIVER)
    exe = tmp_path / "drv"
    subprocess.run([cc, "-std=c11", "-g", "-O1", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-pthread",
                    "-Iruntime/include", "-Iruntime/src", *sorted(glob.glob("runtime/src/*.c")),
                    str(tmp_path / "drv.c"), "-lm", "-o", str(exe)], check=True, timeout=300)
    r = subprocess.run([str(exe), *map(str, files)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "done 0" in r.stdout and "ERROR" not in r.stderr and "runtime error" not in r.stderr
