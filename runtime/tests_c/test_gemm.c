/* The trunk's prefill product (mpk_gemm): for every codec, kernel path, thread count and input
 * count (one, partial three-input steps, past one kernel call's 64), each input's result has the
 * bits it has alone and the scalar path's bits, lies within f32 rounding of the double product
 * of the decoded rows (mpk_row), and a NaN input gives the canonical NaN in its own outputs only.
 * Awkward shapes: partial last group, columns not a multiple of 8, rows not a multiple of 16. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "t.h"

static uint64_t rng = 0x13198a2e03707344ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float urand(void) { return (float)(rnd() % 2000001) / 1e6f - 1.0f; }
static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static uint16_t f16r(void) { return (uint16_t)((rnd() & 0x8000u) | ((rnd() % 16u) << 10) | (rnd() & 0x3ffu)); }

typedef struct {
    const char *name;
    int codec, zp;
    int64_t group;
} kind;

enum { NI = 70 };

int main(void) {
    const mpk_impl *paths[3];
    int np = 0;
    paths[np++] = mpk_select(MPK_SCALAR);
    if (mpk_select(MPK_AVX2)) paths[np++] = mpk_select(MPK_AVX2);
    if (mpk_select(MPK_AVX512VBMI)) paths[np++] = mpk_select(MPK_AVX512VBMI);
    mpk_pool *pools[2] = {NULL, mpk_pool_create(3)};
    const kind kinds[] = {{"f32", MP_CODEC_F32, 0, 0},  {"f16", MP_CODEC_F16, 0, 0},  {"bf16", MP_CODEC_BF16, 0, 0},
                          {"q8/32", MP_CODEC_Q8, 0, 32}, {"q6/16", MP_CODEC_Q6, 0, 16}, {"q4/32", MP_CODEC_Q4, 0, 32},
                          {"q4z/16", MP_CODEC_Q4, 1, 16}};
    const int64_t shapes[][2] = {{37, 100}, {16, 64}, {70, 523}, {1, 8}};
    const int64_t ns[] = {1, 2, 4, 5, 64, 66};
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
            float *x = malloc(sizeof(float) * (size_t)(NI * cols));
            for (int64_t i = 0; i < NI * cols; i++) x[i] = urand() * (i % 7 == 0 ? 100.0f : 1.0f);
            x[3 * cols + cols / 2] = NAN; /* input 3 */
            float *ref = malloc(sizeof(float) * (size_t)(NI * rows)), *y = malloc(sizeof(float) * (size_t)(NI * rows));
            float *row = malloc(sizeof(float) * (size_t)w.cols_p);
            mpk_gemm(paths[0], NULL, &w, x, NI, ref);
            double worst = 0.0;
            for (int64_t r = 0; r < rows; r++) {
                mpk_row(&w, r, row);
                for (int64_t t = 0; t < NI; t++) {
                    if (t == 3) {
                        CHECK(bits(ref[t * rows + r]) == 0x7fc00000u, "%s NaN input row %lld", K->name, (long long)r);
                        continue;
                    }
                    double s = 0.0, mag = 0.0;
                    for (int64_t c = 0; c < cols; c++) {
                        s += (double)row[c] * x[t * cols + c];
                        mag += fabs((double)row[c] * x[t * cols + c]);
                    }
                    double e = fabs((double)ref[t * rows + r] - s) / (mag + 1e-30);
                    worst = e > worst ? e : worst;
                }
            }
            CHECK(worst < 1e-5, "%s %lldx%lld: relative error %g vs the double product", K->name, (long long)rows,
                  (long long)cols, worst);
            for (int k = 0; k < np; k++)
                for (int p = 0; p < 2; p++)
                    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                        int64_t n = ns[ni], off = n == 1 ? 5 : 2, bad = -1;
                        if (off + n > NI) off = NI - n;
                        memset(y, 0x55, sizeof(float) * (size_t)(n * rows));
                        mpk_gemm(paths[k], pools[p], &w, x + off * cols, n, y);
                        for (int64_t e = 0; e < n * rows && bad < 0; e++)
                            if (bits(y[e]) != bits(ref[off * rows + e])) bad = e;
                        CHECK(bad < 0, "%s %lldx%lld path %s threads %d n %lld: element %lld", K->name,
                              (long long)rows, (long long)cols, mpk_impl_name(paths[k]), mpk_pool_threads(pools[p]),
                              (long long)n, (long long)bad);
                    }
            free(data);
            free(x);
            free(ref);
            free(y);
            free(row);
        }
    mpk_pool_destroy(pools[1]);
    T_DONE("test_gemm");
}
