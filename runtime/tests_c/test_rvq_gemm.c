/* The prefill product of a routed-expert matrix (mpk_rvq_gemm, CODECS.md §3.6): every kernel path
 * and thread count gives the scalar path's bits, and those are §3.6 written out here (all four
 * steps, bit for bit); each input's result is the same whether it comes alone or among up to 150
 * others (so chunking a prompt never changes it); it lies within the
 * bound §3.6's two roundings allow (activations to 12 bits per 512 columns, codebook entries to
 * multiples of 2^-p) of a double-precision product of the decoded weights; a NaN input gives the
 * canonical NaN in its own outputs only.  Shapes with partial tiles, row blocks, groups, vectors.
 * The activations' quantiser (mpk_rvq_xq) gives the same bytes at every vector level the CPU has. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "t.h"
#define T_SEED 0x2545f4914f6cdd1dull
#include "rand.h"
#include "kernel_paths.h"


enum { NMAX = 280 }; /* past MPK_GEMM_INPUTS: a call of two input sets */

/* §3.6 written out from the spec for row r and one input x[cols] (cb as stored, [S][256][8]):
 * the integer codebook (step 1), the 12-bit activation (2), the group sums (3), the combine (4) */
static float spec_row(const mpk_rvq *w, const float *cb, int S, const float *x, int64_t cols, int64_t r) {
    double M = 0.0;
    for (int t = 0; t < S; t++) {
        float mt = 0.0f;
        for (int i = 0; i < 2048; i++) mt = fabsf(cb[t * 2048 + i]) > mt ? fabsf(cb[t * 2048 + i]) : mt;
        M += (double)mt;
    }
    int p = 0, e;
    if (M != 0.0) {
        const double f = frexp(M, &e);
        p = f * 16384.0 <= 16383.0 - S ? 14 - e : 13 - e;
        p = p < 100 ? p : 100;
    }
    const int64_t nv = (cols + 7) / 8, ng = (nv * 8 + 511) / 512;
    const uint8_t *codes = w->codes + (size_t)((r / 64) * nv * S) * 64 + (size_t)(r % 64);
    float a = 0.0f;
    for (int64_t g = 0; g < ng; g++) {
        float m = 0.0f;
        int nan = 0;
        for (int64_t c = 512 * g; c < 512 * (g + 1) && c < cols; c++) {
            nan |= x[c] != x[c];
            m = fabsf(x[c]) > m ? fabsf(x[c]) : m;
        }
        float inv = 0.0f, dx = 0.0f;
        if (nan || m == INFINITY) dx = NAN;
        else if (m >= 0x1p-96f) inv = 2047.0f / m, dx = m / 2047.0f;
        int64_t n = 0;
        for (int64_t c = 512 * g; c < 512 * (g + 1) && c < nv * 8; c++) {
            const float xc = c < cols ? x[c] : 0.0f, prod = xc * inv;
            const int64_t q = inv == 0.0f ? 0 : (int64_t)rintf(prod);
            int64_t wv = 0;
            for (int t = 0; t < S; t++)
                wv += (int64_t)rint(ldexp((double)cb[((size_t)t * 256 + codes[(size_t)((c / 8) * S + t) * 64]) * 8 + (size_t)(c % 8)], p));
            n += wv * q;
        }
        a = fmaf((float)n, dx, a);
    }
    const float sc = mpk_f16_to_f32((uint16_t)(w->scales[2 * r] | w->scales[2 * r + 1] << 8));
    const float y = (a * sc) * ldexpf(1.0f, -p);
    return y == y ? y : NAN;
}

static void check_shape(const mpk_impl *const *paths, int npaths, mpk_pool *const *pools, int npools,
                        int64_t rows, int64_t cols, int S) {
    uint64_t nbytes = mpk_rvq_nbytes(rows, cols, S);
    uint8_t *part = malloc(nbytes);
    for (uint64_t i = 0; i < nbytes; i++) part[i] = (uint8_t)rnd();
    mpk_rvq w;
    mpk_rvq_init(&w, rows, cols, S, part);
    for (int64_t r = 0; r < rows; r++) {
        uint16_t h = mpk_f32_to_f16(0.01f + (float)(rnd() % 1000) / 1e4f);
        memcpy((uint8_t *)w.scales + 2 * r, &h, 2);
    }
    float *cb = malloc((size_t)S * 2048 * 4);
    for (int t = 0; t < S; t++)
        for (int i = 0; i < 2048; i++) cb[t * 2048 + i] = urand() / (float)(1 << t);
    const int64_t xs = w.nv * 8 + 8; /* a row stride longer than the vectors */
    float *x = calloc((size_t)(NMAX * xs), 4), *want = malloc((size_t)(NMAX * rows) * 4);
    float *y = malloc((size_t)(NMAX * rows) * 4);
    for (int i = 0; i < NMAX; i++)
        for (int64_t c = 0; c < cols; c++) x[i * xs + c] = i == 5 ? 0.0f : urand() * (float)(1 + i % 9);
    x[11 * xs + cols / 2] = NAN; /* input 11's products are NaN, its neighbours' are not */
    const size_t qs = mpk_rvq_xq_bytes(cols);
    uint8_t *xq = aligned_alloc(32, NMAX * qs), *xq_at = aligned_alloc(32, NMAX * qs);
    mpk_vec_helpers_cap(0); /* the scalar quantiser here; every vector level must give its bytes */
    for (int i = 0; i < NMAX; i++) mpk_rvq_xq(x + i * xs, cols, xq + i * qs);
    const size_t written = (size_t)(cols + 15) / 16 * 16 * 2 + (size_t)(cols + 511) / 512 * 4;
    for (int level = 1; level <= 2 && mpk_vec_helpers_cap(level) == level; level++) {
        memset(xq_at, 0x55, NMAX * qs);
        int bad = 0;
        for (int i = 0; i < NMAX; i++) {
            mpk_rvq_xq(x + i * xs, cols, xq_at + i * qs);
            bad += memcmp(xq + i * qs, xq_at + i * qs, written) != 0;
        }
        CHECK(bad == 0, "rvq_xq cols %lld at vector level %d: %d of %d inputs differ from level 0", (long long)cols,
              level, bad, NMAX);
    }
    mpk_vec_helpers_cap(2);
    free(xq_at);
    mpk_rvq_icb *icb = malloc(sizeof *icb);
    mpk_rvq_icb_init(icb, cb, S);
    mpk_rvq_gemm(NULL, NULL, &w, icb, xq, qs, NMAX, NULL, want);
    /* |error| <= the activation rounding (half a step of the group, times |w|) + the codebook
     * rounding (S half-units of 2^-p, times |x|) + f32 rounding of the sums; worst = the largest
     * error as a share of that bound, tightest = the largest bound as a share of sum |w x| */
    double worst = 0.0, loosest = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *c = w.codes + (size_t)((r / 64) * w.nv * S) * 64 + (size_t)(r % 64);
        float sc = mpk_f16_to_f32((uint16_t)(w.scales[2 * r] | w.scales[2 * r + 1] << 8));
        for (int i = 0; i < NMAX; i += 7) {
            if (i == 11) continue;
            double s = 0.0, mag = 0.0, bound = 0.0, gmax = 0.0;
            for (int64_t col = 0; col < cols; col++) {
                if (col % 512 == 0) {
                    gmax = 0.0;
                    for (int64_t k = col; k < col + 512 && k < cols; k++)
                        gmax = fabs(x[i * xs + k]) > gmax ? fabs(x[i * xs + k]) : gmax;
                }
                const uint8_t *cv = c + (size_t)((col / 8) * S) * 64;
                float wv = cb[(size_t)cv[0] * 8 + (size_t)(col % 8)];
                for (int st = 1; st < S; st++) wv += cb[((size_t)st * 256 + cv[st * 64]) * 8 + (size_t)(col % 8)];
                const double xv = x[i * xs + col];
                s += (double)wv * xv;
                mag += fabs((double)wv * xv);
                bound += fabs((double)wv) * 0.5001 * gmax / 2047.0 + fabs(xv) * (0.5 * S + 1e-3) * icb->unscale;
            }
            bound = (bound + 1e-5 * mag) * sc;
            double err = fabs((double)want[i * rows + r] - s * sc);
            worst = err / (bound + 1e-30) > worst ? err / (bound + 1e-30) : worst;
            loosest = bound / (mag * sc + 1e-30) > loosest ? bound / (mag * sc + 1e-30) : loosest;
        }
    }
    CHECK(worst <= 1.0, "rvq %lldx%lld S %d: error %g of §3.6's rounding bound vs the double product",
          (long long)rows, (long long)cols, S, worst);
    CHECK(loosest < 2e-3, "rvq %lldx%lld S %d: the bound itself is %g of sum |w x|", (long long)rows,
          (long long)cols, S, loosest);
    int64_t off_spec = 0;
    for (int i = 0; i < NMAX; i += i == 5 || i == 11 ? 1 : 6) /* inputs 5 (zero) and 11 (NaN) among them */
        for (int64_t r = 0; r < rows; r++) {
            const float v = spec_row(&w, cb, S, x + i * xs, cols, r);
            off_spec += bits(want[i * rows + r]) != (v == v ? bits(v) : 0x7fc00000u);
        }
    CHECK(off_spec == 0, "rvq %lldx%lld S %d: %lld results differ from §3.6 written out", (long long)rows,
          (long long)cols, S, (long long)off_spec);
    for (int64_t r = 0; r < rows; r++) {
        CHECK(bits(want[11 * rows + r]) == 0x7fc00000u, "NaN input: row %lld is %a", (long long)r,
              (double)want[11 * rows + r]);
        CHECK(want[5 * rows + r] == 0.0f, "zero input: row %lld is %a", (long long)r, (double)want[5 * rows + r]);
        CHECK(want[10 * rows + r] == want[10 * rows + r] && want[12 * rows + r] == want[12 * rows + r],
              "a NaN beside the NaN input at row %lld", (long long)r);
    }
    static const int64_t ns[] = {1, 2, 3, 16, 17, 64, 65, 141, 257, NMAX - 9};
    for (int k = 0; k < npaths; k++)
        for (int p = 0; p < npools; p++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                /* a window of inputs from 9 (n = 1: input 9 alone; n >= 3 holds the NaN one) */
                int64_t n = ns[ni], off = 9, bad = -1;
                memset(y, 0x55, (size_t)(n * rows) * 4);
                /* the caller's workspace (odd pools) or the call's own */
                const size_t wsb = mpk_rvq_gemm_ws_bytes(paths[k], cols, n);
                void *ws = p % 2 && wsb ? aligned_alloc(64, wsb) : NULL;
                mpk_rvq_gemm(paths[k], pools[p], &w, icb, xq + off * qs, qs, n, ws, y);
                free(ws);
                for (int64_t e = 0; e < n * rows && bad < 0; e++)
                    if (bits(y[e]) != bits(want[off * rows + e])) bad = e;
                CHECK(bad < 0, "rvq %lldx%lld S %d path %s threads %d n %lld: element %lld %a != %a", (long long)rows,
                      (long long)cols, S, mpk_impl_name(paths[k]), mpk_pool_threads(pools[p]), (long long)n,
                      (long long)bad, bad < 0 ? 0.0 : (double)y[bad], bad < 0 ? 0.0 : (double)want[off * rows + bad]);
            }
    free(part);
    free(cb);
    free(icb);
    free(xq);
    free(x);
    free(want);
    free(y);
}

/* The memory plan counts mpk_rvq_gemm_ws_bound per chunk token: it must cover every path's
 * workspace for any call of up to n inputs, and grow by the same bytes for every token. */
static void check_ws_bound(const mpk_impl *const *paths, int npaths) {
    static const int64_t cols[] = {1, 61, 512, 513, 1536, 4096, 7168};
    for (size_t c = 0; c < sizeof cols / sizeof *cols; c++) {
        const size_t step = mpk_rvq_gemm_ws_bound(cols[c], 2) - mpk_rvq_gemm_ws_bound(cols[c], 1);
        for (int64_t n = 1; n <= 600; n++) {
            CHECK(mpk_rvq_gemm_ws_bound(cols[c], n + 1) - mpk_rvq_gemm_ws_bound(cols[c], n) == step,
                  "ws bound not linear at cols %lld n %lld", (long long)cols[c], (long long)n);
            for (int k = 0; k < npaths; k++)
                CHECK(mpk_rvq_gemm_ws_bytes(paths[k], cols[c], n) <= mpk_rvq_gemm_ws_bound(cols[c], n),
                      "path %s cols %lld n %lld: workspace above the planned bound", mpk_impl_name(paths[k]),
                      (long long)cols[c], (long long)n);
        }
    }
}

int main(void) {
    const mpk_impl *paths[4];
    const int np = kernel_paths(paths);
    check_ws_bound(paths, np);
    mpk_pool *pools[3] = {NULL, mpk_pool_create(2), mpk_pool_create(3)};
    /* 130 rows: a partial third tile and row block; 264 columns: 33 vectors, an odd count;
     * 1160 columns: a partial third group; 61 columns: a partial vector; 1100 rows: many row
     * blocks across threads */
    check_shape(paths, np, pools, 3, 130, 264, 3);
    check_shape(paths, np, pools, 3, 70, 1160, 4);
    check_shape(paths, np, pools, 3, 100, 61, 1);
    check_shape(paths, np, pools, 3, 1100, 72, 2);
    mpk_pool_destroy(pools[1]);
    mpk_pool_destroy(pools[2]);
    T_DONE("test_rvq_gemm");
}
