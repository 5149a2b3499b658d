/* Where mpk_rvq_matmat's block path (transposed tables, MPK_RVQ_TB inputs per code load) starts
 * to beat one int8-table product per input, measured per kernel path.  Not a test.  Single
 * thread (its CPU time, best of 5), one rvq projection (default 1536x4096, 3 stages: a gate/up
 * of a 4096-wide model; 4096x1536 for a down), codes in cache.
 *
 *   gcc -std=c11 -O2 -ffp-contract=off -Iruntime/include -Iruntime/src -o /tmp/bench_rvq_blocks \
 *       runtime/tests_c/bench_rvq_blocks.c runtime/src/[a-z]*.c -pthread -lm
 *   /tmp/bench_rvq_blocks [ROWSxCOLS [STAGES]]
 *
 * One JSON line per (path, inputs n): ns per (weight x input) of the per-input product
 * (per_input_ns_w), of the block path with its table transposition (block_ns_w), their ratio,
 * and whether both gave the same bits; for a full block, the two parts of the block path apart
 * (pack_ns_w: transposing the tables, lookup_ns_w: the products). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "kernels_impl.h"
#include "bench.h"

static double best_of(const mpk_impl *k, const mpk_rvq *w, const mpk_rvq_tab *const *tp, int n, float *y,
                      void *ws) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double a = cpu_now();
        mpk_rvq_matmat(k, NULL, w, tp, n, y, ws);
        double d = cpu_now() - a;
        best = d < best ? d : best;
    }
    return best;
}

/* The block path's two parts for one full block, single-threaded, best of 5. */
static void parts(const mpk_impl *k, const mpk_rvq *w, const mpk_rvq_tab *const *tp) {
    const int64_t J = w->nv * w->stages, nt = (w->rows + 63) / 64;
    const int64_t ng = (w->nv + MPK_RVQ_GROUP - 1) / MPK_RVQ_GROUP;
    int8_t *tt = malloc((size_t)J * 256 * MPK_RVQ_TB);
    float *d = calloc((size_t)(ng * w->stages) * MPK_RVQ_TB, sizeof *d);
    float *acc = calloc((size_t)nt * 64 * MPK_RVQ_TB, sizeof *acc);
    double tp_ = 1e30, tl = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double a = cpu_now();
        k->rvq_tb_pack(tp, MPK_RVQ_TB, 0, J, tt);
        double b = cpu_now();
        k->rvq_tb(w, tt, d, 0, nt, acc);
        double c = cpu_now();
        tp_ = b - a < tp_ ? b - a : tp_;
        tl = c - b < tl ? c - b : tl;
    }
    double wt = (double)w->rows * (double)w->cols * MPK_RVQ_TB;
    printf("{\"path\": \"%s\", \"block\": %d, \"pack_ns_w\": %.5f, \"lookup_ns_w\": %.5f, "
           "\"lookup_ns_per_code\": %.3f}\n", mpk_impl_name(k), MPK_RVQ_TB, tp_ / wt * 1e9, tl / wt * 1e9,
           tl / ((double)w->rows * (double)J) * 1e9);
    free(tt);
    free(d);
    free(acc);
}

int main(int argc, char **argv) {
    long rows = 1536, cols = 4096;
    int S = 3;
    if (argc > 1 && sscanf(argv[1], "%ldx%ld", &rows, &cols) != 2) return 2;
    if (argc > 2) S = atoi(argv[2]);
    float *cbt = malloc((size_t)S * 2048 * 4);
    mpk_rvq w;
    random_rvq(&w, rows, cols, S, cbt);
    enum { NMAX = 128 };
    float *x = malloc((size_t)cols * 4);
    float *y0 = malloc((size_t)NMAX * (size_t)rows * 4), *y1 = malloc((size_t)NMAX * (size_t)rows * 4);
    size_t tb = mpk_rvq_tab_bytes(cols, S);
    uint8_t *tmem = malloc(tb * NMAX);
    mpk_rvq_tab tabs[NMAX];
    const mpk_rvq_tab *tp[NMAX];
    for (int i = 0; i < NMAX; i++) {
        for (long c = 0; c < cols; c++) x[c] = (float)((int64_t)(rnd() % 2001) - 1000) / 1000.0f;
        mpk_rvq_tab_init(&tabs[i], tmem + tb * (size_t)i, cols, S);
        mpk_rvq_tables(NULL, NULL, cbt, x, &tabs[i]);
        tp[i] = &tabs[i];
    }
    const double wts = (double)rows * (double)cols;
    void *ws = malloc(mpk_rvq_block_bytes(rows, cols, S)); /* reused, as the engine's */
    const int paths[] = {MPK_SCALAR, MPK_AVX2, MPK_AVX512VBMI};
    static const int ns[] = {1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128};
    for (size_t p = 0; p < sizeof paths / sizeof *paths; p++) {
        const mpk_impl *k = mpk_select(paths[p]);
        if (!k || !k->rvq_tb) continue;
        mpk_impl per_input = *k;
        per_input.rvq_tb_min = 0;
        mpk_impl blocks = *k;
        blocks.rvq_tb_min = 1;
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            int n = ns[ni];
            if (paths[p] == MPK_SCALAR && n > 16) break; /* the reference, not a speed path */
            double a = best_of(&per_input, &w, tp, n, y0, ws), b = best_of(&blocks, &w, tp, n, y1, ws);
            if (n == MPK_RVQ_TB) parts(k, &w, tp);
            int same = memcmp(y0, y1, (size_t)n * (size_t)rows * 4) == 0;
            printf("{\"shape\": \"%ldx%ld\", \"stages\": %d, \"path\": \"%s\", \"n\": %d, "
                   "\"per_input_ns_w\": %.5f, \"block_ns_w\": %.5f, \"speedup\": %.2f, \"rvq_tb_min\": %lld, "
                   "\"same_bits\": %s}\n",
                   rows, cols, S, mpk_impl_name(k), n, a / (wts * n) * 1e9, b / (wts * n) * 1e9, a / b,
                   (long long)k->rvq_tb_min, same ? "true" : "false");
            fflush(stdout);
        }
    }
    return 0;
}
