/* Trunk matrix times many inputs, for every codec, kernel path, thread count and awkward shapes
 * (partial last group, columns not a multiple of 8, rows not a multiple of the 16-row task):
 * - mpk_matmat (decode numerics): every output element equals the scalar path's product of its
 *   row alone (mpk_matvec_rows) bit for bit, for input counts below, at and past the 8-input SIMD
 *   blocks, and so does mpk_matvec_rows of any row range on every path;
 * - mpk_gemm (the prefill product): each input's result has the bits it has among others and
 *   the scalar path's (1 input, partial three-input steps, past one kernel call's 64), lies
 *   within f32 rounding of the double product of the decoded rows (mpk_row) with the inputs (for
 *   the grouped codecs: as CODECS.md §2.4 rounds them to 16-bit integers, and within that
 *   rounding's bound of the product with the inputs themselves), and a NaN input gives the
 *   canonical NaN in its own outputs only. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "t.h"
#define T_SEED 0x243f6a8885a308d3ull
#include "rand.h"
#include "kernel_paths.h"


typedef struct {
    const char *name;
    int codec, zp;
    int64_t group;
} kind;

enum { NI = 70 }; /* inputs of the prefill-product checks */

static void check_gemm(const char *name, const mpk_mat *w, const mpk_impl *const *paths, int np,
                       mpk_pool *const *pools) {
    const int64_t rows = w->rows, cols = w->cols;
    float *x = malloc(sizeof(float) * (size_t)(NI * cols)), *row = malloc(sizeof(float) * (size_t)w->cols_p);
    for (int64_t i = 0; i < NI * cols; i++) x[i] = urand() * (i % 7 == 0 ? 100.0f : 1.0f);
    x[3 * cols + cols / 2] = NAN; /* input 3 */
    float *ref = malloc(sizeof(float) * (size_t)(NI * rows)), *y = malloc(sizeof(float) * (size_t)(NI * rows));
    mpk_gemm(paths[0], NULL, w, x, NI, ref);
    double worst = 0.0, rmax = 0.0; /* rmax: the largest |x - x^| / d */
    for (int64_t r = 0; r < rows; r++) {
        mpk_row(w, r, row);
        for (int64_t t = 0; t < NI; t++) {
            if (t == 3) {
                CHECK(bits(ref[t * rows + r]) == 0x7fc00000u, "gemm %s NaN input row %lld", name, (long long)r);
                continue;
            }
            /* grouped codecs (CODECS.md §2.4): the product of the rows with the inputs as rounded
             * to 16-bit integers, x^ = q x d, within f32 rounding; and the product with x within
             * that rounding's bound, sum |w| x |x - x^| <= sum |w| x d / 2 (d = the group's
             * max |x| / 32767) */
            double s = 0.0, mag = 0.0, bound = 0.0, exact = 0.0;
            for (int64_t c0 = 0; c0 < cols; c0 += w->group ? w->group : cols) {
                const int64_t c1 = w->group && c0 + w->group < cols ? c0 + w->group : cols;
                float m = 0.0f;
                for (int64_t c = c0; c < c1; c++) m = fabsf(x[t * cols + c]) > m ? fabsf(x[t * cols + c]) : m;
                const float d = m / 32767.0f, inv = 32767.0f / m;
                for (int64_t c = c0; c < c1; c++) {
                    const double xc = x[t * cols + c], xh = w->group ? (double)rintf(xc * inv) * d : xc;
                    s += (double)row[c] * xh;
                    mag += fabs((double)row[c] * xh);
                    bound += fabs((double)row[c]) * fabs(xc - xh);
                    if (w->group && d > 0.0f) rmax = fabs(xc - xh) / d > rmax ? fabs(xc - xh) / d : rmax;
                    exact += (double)row[c] * xc;
                }
            }
            double e = fabs((double)ref[t * rows + r] - s) / (mag + 1e-30);
            worst = e > worst ? e : worst;
            CHECK(fabs((double)ref[t * rows + r] - exact) <= bound + 1e-5 * mag + 1e-30,
                  "gemm %s row %lld input %lld: %g off the float product, bound %g", name, (long long)r, (long long)t,
                  fabs((double)ref[t * rows + r] - exact), bound + 1e-5 * mag);
        }
    }
    /* half a step, and the step's and inverse's own roundings: |x| <= 32767 d, 3 x 2^-24 of it */
    CHECK(rmax <= 0.5 + 32767.0 * 3 * 0x1p-24, "gemm %s: inputs rounded %g steps off", name, rmax);
    CHECK(worst < 1e-5, "gemm %s %lldx%lld: relative error %g vs the double product", name, (long long)rows,
          (long long)cols, worst);
    static const int64_t ns[] = {1, 2, 4, 5, 64, 66};
    for (int k = 0; k < np; k++)
        for (int p = 0; p < 2; p++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int64_t n = ns[ni], off = n == 1 ? 5 : 2, bad = -1;
                if (off + n > NI) off = NI - n;
                memset(y, 0x55, sizeof(float) * (size_t)(n * rows));
                mpk_gemm(paths[k], pools[p], w, x + off * cols, n, y);
                for (int64_t e = 0; e < n * rows && bad < 0; e++)
                    if (bits(y[e]) != bits(ref[off * rows + e])) bad = e;
                CHECK(bad < 0, "gemm %s %lldx%lld path %s threads %d n %lld: element %lld", name, (long long)rows,
                      (long long)cols, mpk_impl_name(paths[k]), mpk_pool_threads(pools[p]), (long long)n,
                      (long long)bad);
            }
    free(x);
    free(row);
    free(ref);
    free(y);
}

int main(void) {
    const mpk_impl *paths[4];
    const int np = kernel_paths(paths);
    mpk_pool *pools[2] = {NULL, mpk_pool_create(3)};
    const kind kinds[] = {{"f32", MP_CODEC_F32, 0, 0},  {"f16", MP_CODEC_F16, 0, 0},   {"bf16", MP_CODEC_BF16, 0, 0},
                          {"q8/32", MP_CODEC_Q8, 0, 32}, {"q8/8", MP_CODEC_Q8, 0, 8},   {"q6/16", MP_CODEC_Q6, 0, 16},
                          {"q6/32", MP_CODEC_Q6, 0, 32},
                          {"q4/32", MP_CODEC_Q4, 0, 32}, {"q4z/64", MP_CODEC_Q4, 1, 64}, {"q4z/16", MP_CODEC_Q4, 1, 16}};
    /* 1031 columns: many blocks of eight full groups (the AVX2 reduction) and a partial group;
     * 1024 and 512: AVX-512's q8 product (16 groups per step, four rows at a time); 4100 at
     * group 8: more groups than the AVX2 product keeps parts of in one pass; 4400 and 8200: the
     * prefill product's passes of fewer blocks and inputs (three blocks x 27, one block x 15) */
    const int64_t shapes[][2] = {{37, 100}, {16, 64}, {70, 523}, {1, 8}, {3, 1031}, {13, 1024}, {6, 512}, {3, 4100},
                                 {20, 4400}, {6, 8200}};
    const int64_t ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33};
    for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            const kind *K = &kinds[ki];
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            mpk_mat w;
            static uint8_t dummy[1];
            if (mpk_mat_init(&w, K->codec, rows, cols, K->group, K->zp, dummy)) {
                CHECK(0, "init %s", K->name);
                continue;
            }
            uint64_t nbytes = mpk_mat_nbytes(&w);
            uint8_t *data = malloc(nbytes);
            for (uint64_t i = 0; i < nbytes; i++) data[i] = (uint8_t)rnd();
            /* floats and f16 scales must be finite: rewrite them */
            if (K->codec == MP_CODEC_F32)
                for (int64_t i = 0; i < rows * cols; i++) ((float *)(void *)data)[i] = urand();
            else if (K->codec == MP_CODEC_F16 || K->codec == MP_CODEC_BF16)
                for (int64_t i = 0; i < rows * cols; i++) {
                    uint16_t h = K->codec == MP_CODEC_F16 ? f16r() : (uint16_t)(bits(urand()) >> 16);
                    memcpy(data + 2 * i, &h, 2);
                }
            else
                for (int64_t i = 0; i < rows * w.ngroups * (K->zp ? 2 : 1); i++) {
                    uint16_t h = f16r();
                    memcpy(data + 2 * i, &h, 2);
                }
            mpk_mat_init(&w, K->codec, rows, cols, K->group, K->zp, data);
            if (K->codec == MP_CODEC_Q8) /* zero codes (products of +-0): the first half of every third row */
                for (int64_t r = 0; r < rows; r += 3)
                    memset(data + (size_t)(rows * w.ngroups) * 2 + (size_t)(r * w.cols_p), 0, (size_t)w.cols_p / 2);
            float *x = malloc(sizeof(float) * (size_t)(33 * cols));
            for (int64_t i = 0; i < 33 * cols; i++) x[i] = urand() * (i % 7 == 0 ? 100.0f : 1.0f);
            float *ref = malloc(sizeof(float) * (size_t)(33 * rows)), *y = malloc(sizeof(float) * (size_t)(33 * rows));
            for (int64_t t = 0; t < 33; t++)
                for (int64_t r = 0; r < rows; r++) mpk_matvec_rows(paths[0], &w, r, r + 1, x + t * cols, ref + t * rows + r);
            for (int k = 0; k < np; k++) { /* row ranges on the calling thread: rows [r0, rows) */
                const int64_t r0 = rows / 3, t = k % 33;
                mpk_matvec_rows(paths[k], &w, r0, rows, x + t * cols, y);
                int64_t bad = -1;
                for (int64_t r = r0; r < rows && bad < 0; r++)
                    if (bits(y[r - r0]) != bits(ref[t * rows + r])) bad = r;
                CHECK(bad < 0, "%s %lldx%lld rows from %lld %s: row %lld", K->name, (long long)rows, (long long)cols,
                      (long long)r0, mpk_impl_name(paths[k]), (long long)bad);
            }
            for (int k = 0; k < np; k++)
                for (int p = 0; p < 2; p++)
                    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                        int64_t n = ns[ni], bad = -1;
                        memset(y, 0xff, sizeof(float) * (size_t)(n * rows));
                        mpk_matmat(paths[k], pools[p], &w, x, n, y);
                        for (int64_t i = 0; i < n * rows && bad < 0; i++)
                            if (bits(y[i]) != bits(ref[i])) bad = i;
                        CHECK(bad < 0, "%s %lldx%lld n=%lld %s threads=%d: element %lld %a != %a", K->name,
                              (long long)rows, (long long)cols, (long long)n, mpk_impl_name(paths[k]),
                              p ? 3 : 1, (long long)bad, bad < 0 ? 0.0 : (double)y[bad],
                              bad < 0 ? 0.0 : (double)ref[bad]);
                    }
            if ((rows <= 70 && cols <= 523) || cols >= 4400) check_gemm(K->name, &w, paths, np, pools);
            free(data);
            free(x);
            free(ref);
            free(y);
        }
    mpk_pool_destroy(pools[1]);
    T_DONE("test_matmat");
}
