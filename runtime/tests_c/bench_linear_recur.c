/* Not a test: one head's delta rule (linear_recur.c) over a 512-token call, token form (L 1)
 * against the chunk form's sub-chunks, per-head (Gated DeltaNet) and per-channel (KDA) decay,
 * one thread, the AVX2 build where the CPU has it; microseconds per token, best of 12 calls.
 *
 *     make -C runtime bench-linear [BENCH_LINEAR_ARGS="128 128"]   (dk dv) */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "linear_ops.h"
#include "bench.h"

static float unit(void) { return (float)rand() / (float)RAND_MAX; }

int main(int argc, char **argv) {
    const int64_t dk = argc > 1 ? atoi(argv[1]) : 128, dv = argc > 2 ? atoi(argv[2]) : 128;
    const int T = 512, Ls[] = {1, 8, 16, 32, 64}, simd = __builtin_cpu_supports("avx2");
    if (dk < 1 || dv < 1 || dk > 4096 || dv > 4096) return fprintf(stderr, "dk dv: 1..4096\n"), 2;
    float *q = malloc(sizeof(float) * (size_t)(T * dk)), *k = malloc(sizeof(float) * (size_t)(T * dk));
    float *v = malloc(sizeof(float) * (size_t)(T * dv)), *o = malloc(sizeof(float) * (size_t)(T * dv));
    float *a = malloc(sizeof(float) * (size_t)(T * dk)), *beta = malloc(sizeof(float) * (size_t)T);
    float *S = malloc(sizeof(float) * (size_t)(dk * dv));
    float *ws = malloc(sizeof(float) * (size_t)mpl_ws_floats(dk, dv, 64));
    for (int64_t i = 0; i < T * dk; i++) q[i] = unit() - 0.5f, k[i] = unit() - 0.5f, a[i] = 0.9f + 0.1f * unit();
    for (int64_t i = 0; i < T * dv; i++) v[i] = unit() - 0.5f;
    for (int t = 0; t < T; t++) {
        beta[t] = unit();
        mpl_l2norm(q + t * dk, dk, 1.0f / sqrtf((float)dk));
        mpl_l2norm(k + t * dk, dk, 1.0f);
    }
    printf("dk %lld dv %lld, %d tokens, %s build\n", (long long)dk, (long long)dv, T, simd ? "AVX2" : "portable");
    for (int per_channel = 0; per_channel < 2; per_channel++)
        for (size_t li = 0; li < sizeof Ls / sizeof *Ls; li++) {
            const mpl_seq s = {q, k, v, a, beta, dk, dk, dv, per_channel ? dk : 1, 1, o, dv, dk, dv, per_channel};
            double best = 1e30;
            for (int r = 0; r < 12; r++) {
                memset(S, 0, sizeof(float) * (size_t)(dk * dv));
                const double t0 = wall_now();
                mpl_recur(&s, 0, T, Ls[li], S, S, ws, simd);
                const double dt = wall_now() - t0;
                best = dt < best ? dt : best;
            }
            printf("%s L %2d: %6.2f us per token\n", per_channel ? "KDA" : "GDN", Ls[li], 1e6 * best / T);
        }
    free(q), free(k), free(v), free(o), free(a), free(beta), free(S), free(ws);
    return 0;
}
