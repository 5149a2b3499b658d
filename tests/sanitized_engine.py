"""Runs the whole engine (open, eval, generate with the cache large / off / one record, scalar
kernels, a long prompt whose passes borrow the cache) on containers, compiled from runtime/src
under AddressSanitizer and UBSan."""

from __future__ import annotations

import glob
import shutil
import subprocess
from pathlib import Path

import pytest

DRIVER = r"""
#include "moepack.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef struct { mp_engine *e; long ns; } canceller;
static void *cancel_after(void *arg) {
    const canceller *c = arg;
    struct timespec t = {0, c->ns};
    nanosleep(&t, NULL);
    mp_set_cancel(c->e, 1);
    return NULL;
}
/* After a prefix of P tokens, a cancel from another thread lands somewhere in the rest of the
 * long prompt (a pass, a layer, an expert read group, or before the call): the call fails with
 * MP_ECANCELED, the position (and a linear-attention state) stays at P, and the same call, once
 * cleared, gives the bits of `ref`, the whole prompt's in one call (P is a multiple of the
 * linear-attention sub-chunk, where a split keeps the bits). 1: a cancel landed, 0: none, -1:
 * wrong. */
static int cancelled_prompt(mp_engine *e, const int32_t *toks, int n, float *lg, const float *ref) {
    const long delays[] = {4000000, 1000000, 250000, 0};
    const int P = 16;
    for (int i = 0; i < 4; i++) {
        mp_reset(e);
        if (mp_eval(e, toks, P, NULL, 0)) return -1;
        canceller c = {e, delays[i]};
        pthread_t th;
        pthread_create(&th, NULL, cancel_after, &c);
        int rc = mp_eval(e, toks + P, (size_t)(n - P), lg, 0);
        pthread_join(th, NULL);
        mp_set_cancel(e, 0);
        if (rc == MP_OK) continue; /* the prompt ended first */
        if (rc != MP_ECANCELED || mp_position(e) != P ||
            mp_eval(e, toks + P, (size_t)(n - P), lg, 0) ||
            memcmp(lg, ref, sizeof(float) * (size_t)mp_vocab_size(e)))
            return -1;
        return 1;
    }
    return 0;
}
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
            /* refusals name themselves (not the last call's message) */
            if (mp_generate(e, toks, 0, 8, &s, NULL, NULL) != MP_EINVAL ||
                !strstr(mp_error(e), "empty")) bad = 1;
            if (mp_generate(e, toks, 3, -1, &s, NULL, NULL) != MP_EINVAL ||
                !strstr(mp_error(e), "n_new")) bad = 1;
            if (mp_eval(e, NULL, 3, NULL, 0) != MP_EINVAL ||
                !strstr(mp_error(e), "no token array")) bad = 1;
            if (bad) printf("refusal messages: %s\n", mp_error(e));
            free(lg);
            mp_close(e);
        }
        /* a long prompt whose passes borrow the cache's room (the chunk's buffers regrown for
         * the call and back, the cache shrunk and restored), so that every module's chunk
         * buffers run longer passes: with a quarter of the experts cached, else with the cache
         * capped at one record under budgets of 4, 8, .. 40 records, the rest left to borrow */
        mp_config cfg; mp_config_default(&cfg); cfg.threads = 2; cfg.ctx = 512;
        mp_plan_info p; char err[512];
        if (mp_plan_config(argv[a], &cfg, &p, err, sizeof err)) {
            cfg.ctx = 0; /* the model's own, when shorter */
            if (mp_plan_config(argv[a], &cfg, &p, err, sizeof err)) {
                printf("plan: %s\n", err);
                bad = 1;
                continue;
            }
        }
        cfg.ctx = p.ctx;
        for (int k = 0, borrowed = 0; k <= 40 && !borrowed; k += 4) {
            cfg.budget_bytes = k ? p.floor_bytes + (uint64_t)k * p.expert_record_bytes
                                 : p.floor_bytes + p.experts_bytes / 4;
            cfg.cache_experts = k ? 1 : -1;
            mp_engine *e;
            if (mp_open(argv[a], &cfg, &e, err, sizeof err)) {
                printf("open %s: %s\n", argv[a], err);
                bad = 1;
                break;
            }
            int n = p.ctx - 8 < 500 ? p.ctx - 8 : 500, V = mp_vocab_size(e);
            int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
            float *lg = malloc(sizeof(float) * (size_t)V), *ref = malloc(sizeof(float) * (size_t)V);
            for (int i = 0; i < n; i++) toks[i] = (i * 7 + 3) % V;
            if (mp_eval(e, toks, (size_t)n, ref, 0) || mp_eval(e, toks, 1, lg, 0)) {
                printf("eval: %s\n", mp_error(e));
                bad = 1;
            }
            mp_stats st; mp_get_stats(e, &st);
            if ((borrowed = st.longest_pass > st.chunk)) {
                printf("borrowed %s: %d -> %d\n", argv[a], st.chunk, st.longest_pass);
                int c = cancelled_prompt(e, toks, n, lg, ref);
                if (c < 0) bad = 1;
                printf("cancel %s: %s\n", argv[a], c > 0 ? "landed" : c ? "wrong" : "too late");
            }
            free(toks); free(lg); free(ref);
            mp_close(e);
        }
    }
    mp_plan_info p; char err[256];
    if (mp_plan("/nonexistent", 0, &p, err, sizeof err) == 0) bad = 1;
    if (argc > 1 && mp_plan(argv[1], -5, &p, err, sizeof err) != MP_EINVAL) bad = 1;
    mp_config neg; mp_config_default(&neg); neg.threads = -1;
    mp_engine *none = NULL;
    if (argc > 1 && (mp_open(argv[1], &neg, &none, err, sizeof err) != MP_EINVAL || none))
        bad = 1;
    printf("done %d\n", bad);
    return bad;
}
"""


def run_engine_under_sanitizers(tmp_path: Path, files: list[Path], timeout: int = 300) -> str:
    """Compile runtime/src with the sanitizers and the driver, run it on `files`, assert a clean
    run (skipped without a C compiler) and return what the driver printed."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "drv.c").write_text(DRIVER)
    exe = tmp_path / "drv"
    subprocess.run([cc, "-std=c11", "-g", "-O1", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-pthread",
                    "-Iruntime/include", "-Iruntime/src", *sorted(glob.glob("runtime/src/*.c")),
                    str(tmp_path / "drv.c"), "-lm", "-o", str(exe)], check=True, timeout=600)
    r = subprocess.run([str(exe), *map(str, files)], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "done 0" in r.stdout and "ERROR" not in r.stderr and "runtime error" not in r.stderr
    return r.stdout
