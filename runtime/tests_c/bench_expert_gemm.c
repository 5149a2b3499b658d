/* Where the prefill product (mpk_rvq_gemm, CODECS.md §3.6: codes decoded once, multiplied with
 * all of an expert's tokens) overtakes one table product per token (the decode path: §3.5 tables
 * built per token, then mpk_rvq_matvec).  Not a test.  Single thread (its CPU time, best of 7),
 * one rvq projection (default 4096x1536, 3 stages), codes in cache.
 *
 *   gcc -std=c11 -O2 -ffp-contract=off -Iruntime/include -Iruntime/src \
 *       runtime/tests_c/bench_expert_gemm.c runtime/src/kernels*.c runtime/src/codecs.c \
 *       runtime/src/json.c -pthread -lm -o /tmp/bench_expert_gemm
 *   /tmp/bench_expert_gemm [ROWSxCOLS [STAGES [PATH]]]   (PATH: kernels.h MPK_*, 0 = auto)
 *
 * Prints one JSON line per token count n (ns per weight x token):
 *   table_ns_w  n table products (each token's table build included: in decode a gate/up table
 *               serves top_k experts, so this overstates gate/up by the build's share, table_us);
 *   gemm_ns_w   the prefill product of the n tokens (the integer codebook and the tokens'
 *               quantisation included);  gemm_speedup = table_ns_w / gemm_ns_w. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kernels.h"

int main(int argc, char **argv) {
    long rows = 4096, cols = 1536;
    int S = 3;
    if (argc > 1 && sscanf(argv[1], "%ldx%ld", &rows, &cols) != 2) return 2;
    if (argc > 2) S = atoi(argv[2]);
    const mpk_impl *k = mpk_select(argc > 3 ? atoi(argv[3]) : MPK_AUTO);
    if (!k) return 3; /* this CPU cannot run that path */
    float *cb = malloc((size_t)S * 2048 * 4), *cbt = malloc((size_t)S * 2048 * 4);
    mpk_rvq w;
    uint8_t *part = random_rvq(&w, rows, cols, S, cbt);
    for (int st = 0; st < S; st++) /* the prefill product reads the codebook as stored */
        for (int e = 0; e < 256; e++)
            for (int d = 0; d < 8; d++) cb[(st * 256 + e) * 8 + d] = cbt[(st * 8 + d) * 256 + e];
    enum { NMAX = 128 };
    const long xs = (cols + 7) / 8 * 8;
    float *x = calloc((size_t)NMAX * (size_t)xs, 4), *y = malloc((size_t)NMAX * (size_t)rows * 4);
    const size_t qs = mpk_rvq_xq_bytes(cols);
    uint8_t *xq = aligned_alloc(32, NMAX * qs);
    mpk_rvq_icb *icb = malloc(sizeof *icb);
    for (long i = 0; i < NMAX; i++)
        for (long c = 0; c < cols; c++) x[i * xs + c] = (float)((int64_t)(rnd() % 2001) - 1000) / 1000.0f;
    size_t tb = mpk_rvq_tab_bytes(cols, S);
    uint8_t *tmem = malloc(tb);
    mpk_rvq_tab tab;
    double wts = (double)rows * (double)cols, t_tab = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double a = cpu_now();
        mpk_rvq_tab_init(&tab, tmem, cols, S);
        mpk_rvq_tables(k, NULL, cbt, x, &tab);
        double d = cpu_now() - a;
        t_tab = d < t_tab ? d : t_tab;
    }
    static const int ns[] = {1, 2, 3, 4, 6, 8, 16, 32, 64, 128};
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
        int n = ns[ni];
        double bt = 1e30, bg = 1e30;
        for (int rep = 0; rep < 7; rep++) {
            double a = cpu_now();
            for (int i = 0; i < n; i++) {
                mpk_rvq_tab_init(&tab, tmem, cols, S);
                mpk_rvq_tables(k, NULL, cbt, x + (size_t)i * (size_t)xs, &tab);
                mpk_rvq_matvec(k, NULL, &w, &tab, y + (size_t)i * (size_t)rows);
            }
            double d = cpu_now() - a;
            bt = d < bt ? d : bt;
            a = cpu_now();
            mpk_rvq_icb_init(icb, cb, S);
            for (int i = 0; i < n; i++) mpk_rvq_xq(x + (size_t)i * (size_t)xs, cols, xq + (size_t)i * qs);
            mpk_rvq_gemm(k, NULL, &w, icb, xq, qs, n, NULL, y);
            d = cpu_now() - a;
            bg = d < bg ? d : bg;
        }
        printf("{\"shape\": \"%ldx%ld\", \"stages\": %d, \"path\": \"%s\", \"n\": %d, \"table_ns_w\": %.5f, "
               "\"table_us\": %.2f, \"gemm_ns_w\": %.5f, \"gemm_speedup\": %.2f, \"check\": %g}\n",
               rows, cols, S, mpk_impl_name(k), n, bt / (wts * n) * 1e9, t_tab * 1e6, bg / (wts * n) * 1e9, bt / bg,
               (double)y[0]);
    }
    free(part);
    free(cb);
    free(cbt);
    free(x);
    free(y);
    free(tmem);
    free(xq);
    free(icb);
    return 0;
}
