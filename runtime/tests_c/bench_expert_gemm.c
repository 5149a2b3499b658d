/* Issue 15's question, measured: from how many tokens per expert would decoding the codes once
 * into a float block and multiplying it with all tokens (GEMM) beat the int8-table kernel?
 * Not a test.  Single thread (times are its CPU time, best of 7), one 4096x1536 (or --shape) rvq3
 * projection, codes in cache.
 *
 *   gcc -std=c11 -O2 -ffp-contract=off -Iruntime/include -Iruntime/src \
 *       runtime/tests_c/bench_expert_gemm.c runtime/src/kernels*.c runtime/src/codecs.c \
 *       runtime/src/json.c -pthread -lm -o /tmp/bench_expert_gemm
 *   /tmp/bench_expert_gemm [ROWSxCOLS [STAGES]]
 *
 * Prints one JSON line per token count n:
 *   table_ns_w   ns per (weight x token) of mpk_rvq_matmat on n prebuilt tables (the engine's
 *                prefill path; the table build is apart: table_us per token);
 *   fma_ns_w     ns per (weight x token) of the GEMM's multiply alone at its best: a 12 x 16
 *                register-blocked AVX-512 FMA kernel on operands in L1 (no decode, no memory);
 *   decode_ns_w  ns per weight of decoding the codes to floats (row-major, codebook sums in
 *                stage order), paid once per expert and chunk;
 *   gemm_bound_ns_w = fma_ns_w + decode_ns_w / n: what a decode + GEMM path could at best cost. */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "bench.h"

/* 12 rows x 16 tokens of C += A (12 x K, broadcast) * B (K x 16): 12 zmm accumulators. */
__attribute__((target("avx512f,fma"), noinline)) static void fma_block(const float *a, const float *b, int K, float *c) {
    __m512 acc[12];
    for (int r = 0; r < 12; r++) acc[r] = _mm512_loadu_ps(c + 16 * r);
    for (int k = 0; k < K; k++) {
        __m512 bk = _mm512_loadu_ps(b + 16 * k);
#pragma GCC unroll 12
        for (int r = 0; r < 12; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * K + k]), bk, acc[r]);
    }
    for (int r = 0; r < 12; r++) _mm512_storeu_ps(c + 16 * r, acc[r]);
}

/* Float blocks of one tile, [cols / 256][64 rows][256] (a block of 64 KiB per group of 32
 * vectors, what a GEMM would multiply): sums over stages in order. */
__attribute__((target("avx2,fma"), noinline)) static void decode_tile(const mpk_rvq *w, int64_t tile, const float *cb,
                                                                    float *out) {
    const int S = w->stages;
    const uint8_t *c = w->codes + (size_t)(tile * w->nv * S) * 64;
    for (int64_t v = 0; v < w->nv; v++)
        for (int l = 0; l < 64; l++) {
            __m256 s = _mm256_loadu_ps(cb + (size_t)c[(v * S) * 64 + l] * 8);
            for (int st = 1; st < S; st++)
                s = _mm256_add_ps(s, _mm256_loadu_ps(cb + ((size_t)st * 256 + c[(v * S + st) * 64 + l]) * 8));
            _mm256_storeu_ps(out + ((size_t)(v / 32) * 64 + (size_t)l) * 256 + (size_t)(v % 32) * 8, s);
        }
}

int main(int argc, char **argv) {
    long rows = 4096, cols = 1536;
    int S = 3;
    if (argc > 1 && sscanf(argv[1], "%ldx%ld", &rows, &cols) != 2) return 2;
    if (argc > 2) S = atoi(argv[2]);
    const mpk_impl *k = mpk_select(MPK_AUTO);
    float *cb = malloc((size_t)S * 2048 * 4), *cbt = malloc((size_t)S * 2048 * 4);
    mpk_rvq w;
    random_rvq(&w, rows, cols, S, cbt);
    for (int st = 0; st < S; st++) /* decode_tile reads the untransposed codebook */
        for (int e = 0; e < 256; e++)
            for (int d = 0; d < 8; d++) cb[(st * 256 + e) * 8 + d] = cbt[(st * 8 + d) * 256 + e];
    enum { NMAX = 200 };
    float *x = malloc((size_t)NMAX * (size_t)cols * 4), *y = malloc((size_t)NMAX * (size_t)rows * 4);
    for (long i = 0; i < NMAX * cols; i++) x[i] = (float)((int64_t)(rnd() % 2001) - 1000) / 1000.0f;
    size_t tb = mpk_rvq_tab_bytes(cols, S);
    uint8_t *tmem = malloc(tb * NMAX);
    mpk_rvq_tab tabs[NMAX];
    const mpk_rvq_tab *tp[NMAX];
    double t_tab = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double a = cpu_now();
        for (int i = 0; i < NMAX; i++) {
            mpk_rvq_tab_init(&tabs[i], tmem + tb * (size_t)i, cols, S);
            mpk_rvq_tables(k, NULL, cbt, x + (size_t)i * (size_t)cols, &tabs[i]);
            tp[i] = &tabs[i];
        }
        double d = (cpu_now() - a) / NMAX;
        t_tab = d < t_tab ? d : t_tab;
    }
    /* the GEMM's two parts, each at its best */
    float *blk = aligned_alloc(64, (size_t)64 * (size_t)(w.nv + 31) / 32 * 256 * 4);
    double t_dec = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double a = cpu_now();
        for (int64_t t = 0; t < (rows + 63) / 64; t++) decode_tile(&w, t, cb, blk);
        double d = cpu_now() - a;
        t_dec = d < t_dec ? d : t_dec;
    }
    const int K = 256;
    float *A = aligned_alloc(64, 12 * K * 4), *B = aligned_alloc(64, (size_t)K * 16 * 4), C[12 * 16];
    for (int i = 0; i < 12 * K; i++) A[i] = blk[i];
    for (int i = 0; i < K * 16; i++) B[i] = x[i];
    memset(C, 0, sizeof C);
    double t_fma = 1e30;
    /* the GEMM bound is an AVX-512 figure: without it, fma_ns_w and gemm_bound_ns_w are NaN */
    if (!__builtin_cpu_supports("avx512f")) t_fma = __builtin_nan("");
    for (int rep = 0; rep < 5 && t_fma == t_fma; rep++) {
        double a = cpu_now();
        for (int it = 0; it < 2000; it++) fma_block(A, B, K, C);
        double d = (cpu_now() - a) / (2000.0 * 12 * 16 * K); /* per weight x token */
        t_fma = d < t_fma ? d : t_fma;
    }
    double wts = (double)rows * (double)cols;
    static const int ns[] = {1, 4, 8, 16, 17, 32, 64, 128, 200};
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
        int n = ns[ni];
        double best = 1e30;
        for (int rep = 0; rep < 7; rep++) {
            double a = cpu_now();
            mpk_rvq_matmat(k, NULL, &w, tp, n, y, NULL);
            double d = cpu_now() - a;
            best = d < best ? d : best;
        }
        char fma[32] = "null", bound[32] = "null"; /* JSON has no NaN */
        if (t_fma == t_fma) {
            snprintf(fma, sizeof fma, "%.5f", t_fma * 1e9);
            snprintf(bound, sizeof bound, "%.5f", t_fma * 1e9 + t_dec / wts * 1e9 / n);
        }
        printf("{\"shape\": \"%ldx%ld\", \"stages\": %d, \"path\": \"%s\", \"n\": %d, \"table_ns_w\": %.5f, "
               "\"table_us\": %.2f, \"fma_ns_w\": %s, \"decode_ns_w\": %.4f, \"gemm_bound_ns_w\": %s, \"check\": %g}\n",
               rows, cols, S, mpk_impl_name(k), n, best / (wts * n) * 1e9, t_tab * 1e6, fma, t_dec / wts * 1e9,
               bound, (double)(y[0] + C[0]));
    }
    return 0;
}
