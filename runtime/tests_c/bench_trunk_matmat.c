/* Trunk matrix times several tokens, both products (issue 15): ns per (weight x token) against
 * the number of tokens, per codec, one thread, matrix in cache after the first call.  Not a test.
 * For the grouped codecs both are CODECS.md §2.4 (mpk_matmat calls mpk_gemm; one token takes the
 * rows as stored, more the column-pair panels); for f16, mpk_matmat is the float codecs' decode
 * product (routers; MPK_MM_TB inputs a register from 8 tokens on) and mpk_gemm the prefill FMA
 * product.
 *
 *   gcc -std=c11 -O2 -ffp-contract=off -Iruntime/include -Iruntime/src \
 *       runtime/tests_c/bench_trunk_matmat.c runtime/src/kernels*.c runtime/src/codecs.c \
 *       runtime/src/json.c -pthread -lm -o /tmp/bench_trunk_matmat
 *   /tmp/bench_trunk_matmat [ROWSxCOLS]
 *
 * One JSON line per codec and token count n: ns_w (mpk_matmat) and ns_w_gemm (mpk_gemm) = this
 * thread's CPU time (time spent descheduled on a shared machine does not count) per weight x
 * token, best of 5 calls each. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "bench.h"

/* its own stream: seeded in main */
int main(int argc, char **argv) {
    rs = 0x9e3779b97f4a7c15ull;
    long rows = 4096, cols = 4096;
    if (argc > 1 && sscanf(argv[1], "%ldx%ld", &rows, &cols) != 2) return 2;
    const mpk_impl *k = mpk_select(MPK_AUTO);
    static const struct {
        const char *name;
        int codec, zp;
        int64_t group;
    } kinds[] = {{"q8", MP_CODEC_Q8, 0, 32}, {"q6", MP_CODEC_Q6, 0, 32}, {"q4", MP_CODEC_Q4, 0, 32},
                 {"f16", MP_CODEC_F16, 0, 0}};
    enum { NMAX = 256 };
    static const int ns[] = {1, 4, 8, 16, 64, 256};
    float *x = malloc(sizeof(float) * (size_t)NMAX * (size_t)cols), *y = malloc(sizeof(float) * (size_t)NMAX * (size_t)rows);
    for (long i = 0; i < NMAX * cols; i++) x[i] = (float)((int64_t)(rnd() % 2001) - 1000) / 1000.0f;
    for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++) {
        mpk_mat w;
        static uint8_t dummy[1];
        if (mpk_mat_init(&w, kinds[ki].codec, rows, cols, kinds[ki].group, kinds[ki].zp, dummy)) return 1;
        uint64_t nb = mpk_mat_nbytes(&w);
        uint8_t *data = malloc(nb);
        /* codes random; f16 values and scales a finite 0x3c00-ish pattern */
        for (uint64_t i = 0; i < nb; i++) data[i] = (uint8_t)rnd();
        for (uint64_t i = 1; i < nb; i += 2) data[i] = (uint8_t)(0x30 | (data[i] & 0x8b));
        mpk_mat_init(&w, kinds[ki].codec, rows, cols, kinds[ki].group, kinds[ki].zp, data);
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
            int n = ns[ni];
            double best[2] = {1e30, 1e30};
            for (int rep = 0; rep < 10; rep++) { /* the two products alternated */
                double a = cpu_now();
                if (rep % 2) mpk_gemm(k, NULL, &w, x, n, y);
                else mpk_matmat(k, NULL, &w, x, n, y);
                double d = cpu_now() - a;
                best[rep % 2] = d < best[rep % 2] ? d : best[rep % 2];
            }
            const double wt = (double)rows * (double)cols * n;
            printf("{\"codec\": \"%s\", \"shape\": \"%ldx%ld\", \"path\": \"%s\", \"n\": %d, \"ns_w\": %.5f, "
                   "\"ns_w_gemm\": %.5f, \"check\": %g}\n",
                   kinds[ki].name, rows, cols, mpk_impl_name(k), n, best[0] / wt * 1e9, best[1] / wt * 1e9,
                   (double)y[0]);
        }
        free(data);
    }
    free(x);
    free(y);
    return 0;
}
