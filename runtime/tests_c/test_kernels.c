/* rvq expert kernels (spec/CODECS.md §3 tiled codes, §3.5 integer-table product): every kernel
 * path (scalar, AVX2, AVX-512 VBMI where the CPU has them) and thread count against a literal
 * implementation of §3.5 written here from the spec, bit for bit, on awkward shapes and
 * activations (zero, tiny, one huge element, overflow, NaN, NaN/inf row scales); mpk_wsum
 * against mpk_axpy, mpk_dots against mpk_dot, and mpk_softmax against a literal implementation of
 * its definition (kernels.h) written here, whose e^x is also checked against e^x in binary64.
 * The small vector helpers pick their SIMD level from the CPU, so their tests run once at every
 * level this CPU has (mpk_vec_helpers_cap) and each level's outputs must be level 0's bits. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernel_paths.h"
#include "t.h"
#define T_SEED 0x9e3779b97f4a7c15ull
#include "rand.h"


/* f32 -> f16 for positive normal values in range (test scales only), truncating */
static uint16_t f16_of(float f) {
    uint32_t u = bits(f);
    int e = (int)((u >> 23) & 255) - 127 + 15;
    return (uint16_t)((e << 10) | ((u >> 13) & 0x3ff));
}

/* §3.5 read literally: codes[r][v][t] untiled, cb[t][e][d] untransposed. */
static void reference(int64_t rows, int64_t cols, int S, const uint8_t *codes, const uint16_t *sc,
                      const float *cb, const float *x, float *y) {
    int64_t nv = (cols + 7) / 8, ng = (nv + 31) / 32;
    float *T = malloc((size_t)(nv * S * 256) * 4);
    int8_t *q = malloc((size_t)(nv * S * 256));
    float *d = malloc((size_t)(ng * S) * 4);
    int nan = 0;
    for (int64_t v = 0; v < nv; v++)
        for (int t = 0; t < S; t++)
            for (int e = 0; e < 256; e++) {
                float xd[8];
                for (int k = 0; k < 8; k++) xd[k] = 8 * v + k < cols ? x[8 * v + k] : 0.0f;
                const float *c = cb + ((size_t)t * 256 + (size_t)e) * 8;
                float a = xd[0] * c[0];
                for (int k = 1; k < 8; k++) a = fmaf(xd[k], c[k], a);
                T[(v * S + t) * 256 + e] = a;
            }
    for (int64_t g = 0; g < ng; g++)
        for (int t = 0; t < S; t++) {
            float m = 0.0f;
            int isnan_ = 0;
            for (int64_t v = 32 * g; v < nv && v < 32 * g + 32; v++)
                for (int e = 0; e < 256; e++) {
                    float a = fabsf(T[(v * S + t) * 256 + e]);
                    if (a != a) isnan_ = 1;
                    else if (a > m) m = a;
                }
            if (isnan_ || m == INFINITY) nan = 1;
            int live = !isnan_ && m != INFINITY && m >= 0x1p-96f;
            float inv = live ? 127.0f / m : 0.0f;
            d[g * S + t] = live ? m / 127.0f : 0.0f;
            for (int64_t v = 32 * g; v < nv && v < 32 * g + 32; v++)
                for (int e = 0; e < 256; e++) {
                    float p = T[(v * S + t) * 256 + e] * inv;
                    q[(v * S + t) * 256 + e] = live ? (int8_t)lrintf(p) : 0;
                }
        }
    for (int64_t r = 0; r < rows; r++) {
        float acc = 0.0f;
        for (int64_t g = 0; g < ng; g++)
            for (int t = 0; t < S; t++) {
                int32_t n = 0;
                for (int64_t v = 32 * g; v < nv && v < 32 * g + 32; v++)
                    n += q[(v * S + t) * 256 + codes[(r * nv + v) * S + t]];
                acc = fmaf((float)n, d[g * S + t], acc);
            }
        float yy = acc * mpk_f16_to_f32(sc[r]);
        y[r] = nan || yy != yy ? NAN : yy; /* the kernels canonicalise NaN to 0x7fc00000 */
    }
    free(T);
    free(q);
    free(d);
}

/* part bytes per CODECS.md §3: tiles [nt][nv*S][64], padding rows code 0, then f16 scales */
static uint8_t *make_part(int64_t rows, int64_t cols, int S, const uint8_t *codes, const uint16_t *sc) {
    int64_t nv = (cols + 7) / 8, J = nv * S, R = (rows + 63) / 64 * 64;
    uint64_t n = mpk_rvq_nbytes(rows, cols, S);
    CHECK(n == (uint64_t)(R * J + 2 * rows), "size rule");
    uint8_t *p = calloc(n, 1);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < J; j++) p[((r / 64) * J + j) * 64 + r % 64] = codes[r * J + j];
    for (int64_t r = 0; r < rows; r++) {
        p[R * J + 2 * r] = (uint8_t)(sc[r] & 255);
        p[R * J + 2 * r + 1] = (uint8_t)(sc[r] >> 8);
    }
    return p;
}

/* The vector helper tests' outputs in order: recorded at level 0 (scalar), compared at the others */
static uint32_t *tape;
static size_t tape_n, tape_pos, tape_bad;
static int tape_level;

static void tape_put(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (tape_level == 0) {
            if ((tape_n & (tape_n - 1)) == 0) tape = realloc(tape, (tape_n ? 2 * tape_n : 1024) * sizeof *tape);
            tape[tape_n++] = bits(v[i]);
        } else {
            tape_bad += tape_pos >= tape_n || tape[tape_pos] != bits(v[i]);
            tape_pos++;
        }
    }
}

/* fn at level 0, then at each higher level the CPU has, from the same random stream */
static void at_every_level(const char *name, void (*fn)(void)) {
    const uint64_t seed = rng;
    tape_n = 0;
    for (int level = 0; level <= 2 && mpk_vec_helpers_cap(level) == level; level++) {
        rng = seed;
        tape_level = level, tape_pos = 0, tape_bad = 0;
        fn();
        if (level == 0) CHECK(tape_n > 0, "%s recorded no outputs", name);
        else CHECK(tape_bad == 0 && tape_pos == tape_n, "%s at level %d: %zu of %zu values differ from level 0 (%zu compared)",
                   name, level, tape_bad, tape_n, tape_pos);
        printf("%s: level %d, %zu values%s\n", name, level, tape_n, level ? " as level 0" : "");
    }
    mpk_vec_helpers_cap(2);
}

static const mpk_impl *paths[4];
static int npaths;
static mpk_pool *pools[3];

static void run_case(const char *what, int64_t rows, int64_t cols, int S, const float *x,
                     const uint16_t *sc_override) {
    int64_t nv = (cols + 7) / 8;
    float *cb = malloc((size_t)S * 256 * 8 * 4), *cbt = malloc((size_t)S * 256 * 8 * 4);
    for (int t = 0; t < S; t++) /* stage magnitudes shrink like a trained residual codebook */
        for (int i = 0; i < 256 * 8; i++) cb[t * 2048 + i] = urand() / (float)(1 << t);
    mpk_rvq_transpose_cb(cb, S, cbt);
    uint8_t *codes = malloc((size_t)(rows * nv * S));
    for (int64_t i = 0; i < rows * nv * S; i++) codes[i] = (uint8_t)rnd();
    uint16_t *sc = malloc((size_t)rows * 2);
    for (int64_t r = 0; r < rows; r++) sc[r] = sc_override ? sc_override[r] : f16_of(0.01f + (float)(rnd() % 1000) / 1e4f);
    uint8_t *part = make_part(rows, cols, S, codes, sc);
    float *ref = malloc((size_t)rows * 4), *y = malloc((size_t)rows * 4);
    reference(rows, cols, S, codes, sc, cb, x, ref);
    void *mem = malloc(mpk_rvq_tab_bytes(cols, S));
    mpk_rvq w;
    mpk_rvq_init(&w, rows, cols, S, part);
    int bad = 0;
    for (int k = 0; k < npaths; k++)
        for (int p = 0; p < 3; p++) {
            mpk_rvq_tab tab;
            mpk_rvq_tab_init(&tab, mem, cols, S);
            mpk_rvq_tables(paths[k], pools[p], cbt, x, &tab);
            memset(y, 0x55, (size_t)rows * 4);
            mpk_rvq_matvec(paths[k], pools[p], &w, &tab, y);
            for (int64_t r = 0; r < rows && !bad; r++)
                if (bits(y[r]) != bits(ref[r])) {
                    bad = 1;
                    CHECK(0, "%s rows %lld cols %lld S %d path %s threads %d row %lld: %.9g (%08x) != ref %.9g (%08x)",
                          what, (long long)rows, (long long)cols, S, mpk_impl_name(paths[k]),
                          mpk_pool_threads(pools[p]), (long long)r, y[r], bits(y[r]), ref[r], bits(ref[r]));
                }
            CHECK(!bad, "%s", what);
        }
    free(mem);
    free(cb);
    free(cbt);
    free(codes);
    free(sc);
    free(part);
    free(ref);
    free(y);
}

/* mpk_wsum (attention's values): the bits of mpk_axpy over the rows onto zeros, f32 and f16 rows,
 * column counts around the 16- and 8-wide blocks, every head count up to two blocks of 8 and one */
static void test_wsum(void) {
    enum { NT = 37, NC = 70, NH = 17 };
    float w[NH * NT], r32[NT * NC], out[NH * NC], ref[NH * NC];
    uint16_t r16[NT * NC];
    for (int i = 0; i < NH * NT; i++) w[i] = urand();
    for (int i = 0; i < NT * NC; i++) {
        r16[i] = f16_of(0.01f + (float)(rnd() % 1000) / 1e3f) ^ (uint16_t)(rnd() % 2 ? 0x8000 : 0);
        r32[i] = mpk_f16_to_f32(r16[i]) * (1.0f + urand() * 1e-3f);
    }
    for (int f16 = 0; f16 < 2; f16++)
        for (int nh = 1; nh <= NH; nh++) /* every remainder of the 8-head blocks */
            for (int64_t n = 1; n <= NC; n += 23) {
                float row[NC];
                memset(ref, 0, sizeof ref);
                for (int64_t t = 0; t < NT; t++) {
                    for (int64_t c = 0; c < n; c++) row[c] = f16 ? mpk_f16_to_f32(r16[t * NC + c]) : r32[t * NC + c];
                    for (int h = 0; h < nh; h++) mpk_axpy(ref + h * NC, w[h * NT + t], row, n);
                }
                memset(out, 0x55, sizeof out);
                mpk_wsum(out, NC, nh, w, NT, f16 ? (const void *)r16 : (const void *)r32,
                         (size_t)NC * (f16 ? 2 : 4), f16, NT, n);
                int bad = 0;
                for (int h = 0; h < nh; h++)
                    for (int64_t c = 0; c < n; c++) bad += bits(out[h * NC + c]) != bits(ref[h * NC + c]);
                CHECK(bad == 0, "wsum f16 %d heads %d columns %lld: %d elements differ", f16, nh, (long long)n, bad);
                for (int h = 0; h < nh; h++) tape_put(out + h * NC, n);
            }
}

/* mpk_dots (attention scores): each row's bits are mpk_dot's, row counts around the blocks of
 * eight, lengths around the 8-wide steps, a row stride wider than the length */
static void test_dots(void) {
    enum { NR = 19, NC = 140, STRIDE = 147 };
    float rows[NR * STRIDE], x[NC], out[NR];
    for (int i = 0; i < NR * STRIDE; i++) rows[i] = urand() * 4.0f;
    for (int i = 0; i < NC; i++) x[i] = urand();
    for (int nr = 1; nr <= NR; nr += 3)
        for (int64_t n = 1; n <= NC; n += 13) {
            memset(out, 0x55, sizeof out);
            mpk_dots(x, rows, STRIDE, nr, n, out);
            int bad = 0;
            for (int r = 0; r < nr; r++) bad += bits(out[r]) != bits(mpk_dot(rows + r * STRIDE, x, n));
            CHECK(bad == 0, "dots rows %d length %lld: %d rows differ", nr, (long long)n, bad);
            tape_put(out, nr);
        }
    /* an f16 x (the KV cache's keys): mpk_dots' bits on x converted first */
    uint8_t xh[2 * NC];
    float xf[NC], ref[NR];
    for (int i = 0; i < NC; i++) {
        uint16_t h = mpk_f32_to_f16(x[i] * 3.0f - 1.0f);
        xh[2 * i] = (uint8_t)h, xh[2 * i + 1] = (uint8_t)(h >> 8);
        xf[i] = mpk_f16_to_f32(h);
    }
    for (int nr = 1; nr <= NR; nr++)
        for (int64_t n = 1; n <= NC; n += 13) {
            memset(out, 0x55, sizeof out);
            mpk_dots_f16(xh, rows, STRIDE, nr, n, out);
            mpk_dots(xf, rows, STRIDE, nr, n, ref);
            int bad = 0;
            for (int r = 0; r < nr; r++) bad += bits(out[r]) != bits(ref[r]);
            CHECK(bad == 0, "dots f16 rows %d length %lld: %d rows differ", nr, (long long)n, bad);
            tape_put(out, nr);
        }
    /* mpk_dots_keys: several keys a call (f32 and f16, odd key counts for the two-key steps,
     * lengths with and without a tail), each key's row the bits of mpk_dots / mpk_dots_f16 */
    enum { NK = 7, OS = 23 };
    uint8_t kh[NK][2 * NC];
    float kf[NK][NC], kout[NK * OS], kref[NR];
    for (int k = 0; k < NK; k++)
        for (int i = 0; i < NC; i++) {
            uint16_t h = mpk_f32_to_f16(urand() * 2.0f);
            kh[k][2 * i] = (uint8_t)h, kh[k][2 * i + 1] = (uint8_t)(h >> 8);
            kf[k][i] = urand();
        }
    for (int f16 = 0; f16 < 2; f16++)
        for (int nk = 1; nk <= NK; nk += 2)
            for (int nr = 1; nr <= NR; nr += 4)
                for (int64_t n = 8; n <= NC; n += n % 8 ? 13 : 5) {
                    memset(kout, 0x55, sizeof kout);
                    mpk_dots_keys(f16 ? (const void *)kh : (const void *)kf, f16 ? sizeof kh[0] : sizeof kf[0], nk, f16,
                                  rows, STRIDE, nr, n, kout, OS);
                    int bad = 0;
                    for (int k = 0; k < nk; k++) {
                        if (f16) mpk_dots_f16(kh[k], rows, STRIDE, nr, n, kref);
                        else mpk_dots(kf[k], rows, STRIDE, nr, n, kref);
                        for (int r = 0; r < nr; r++) bad += bits(kout[k * OS + r]) != bits(kref[r]);
                    }
                    CHECK(bad == 0, "dots_keys f16 %d keys %d rows %d length %lld: %d differ", f16, nk, nr,
                          (long long)n, bad);
                    for (int k = 0; k < nk; k++) tape_put(kout + k * OS, nr);
                }
}

/* mpk_softmax's e^x as kernels.h and kernels_impl.h define it, written out again */
static float p2(int e) { return ldexpf(1.0f, e); }
static float ref_exp(float x) {
    if (isnan(x)) return x;
    if (x < -104.0f) return 0.0f;
    if (x > 88.7228394f) return INFINITY;
    volatile float t = x * 1.44269504088896341f; /* volatile: each step rounded to binary32 */
    volatile float n = (t + 0x1.8p23f) - 0x1.8p23f;
    volatile float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    volatile float y = 1.9875691500e-4f * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    volatile float rr = r * r;
    y = (y * rr + r) + 1.0f;
    int ni = (int)n, na = ni < -126 ? -126 : ni > 127 ? 127 : ni;
    volatile float a = y * p2(ni - na);
    return a * p2(na);
}

static void ref_softmax(float *x, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    double l[8] = {0};
    for (int64_t i = 0; i < n; i++) {
        x[i] = ref_exp(x[i] - m);
        l[i % 8] += (double)x[i];
    }
    double s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    float inv = (float)(1.0 / s);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(s)) {
            uint32_t q = 0x7fc00000u;
            memcpy(&x[i], &q, 4);
        } else {
            x[i] = x[i] * inv;
        }
    }
}

/* ulps between a binary32 result and the binary64 value it approximates */
static double ulps(float got, double want) {
    double u = want >= (double)FLT_MIN ? ldexp(1.0, ilogb(want) - 23) : ldexp(1.0, -149);
    return fabs((double)got - want) / u;
}

static void test_exp(void) {
    /* e^x: within 2 ulp over the normal range, within one subnormal step below it, 0 and inf at
     * the ends, NaN kept */
    double worst = 0, worst_sub = 0;
    for (int64_t k = 0; k <= 4000000; k++) {
        float x = -104.0f + (float)k * (192.7228394f / 4000000.0f);
        double want = exp((double)x);
        float got = ref_exp(x);
        if (want >= (double)FLT_MIN && want <= (double)FLT_MAX) worst = fmax(worst, ulps(got, want));
        else if (want < (double)FLT_MIN) worst_sub = fmax(worst_sub, fabs((double)got - want) / ldexp(1.0, -149));
    }
    CHECK(worst <= 2.0, "e^x within 2 ulp of e^x (binary64): %.3f", worst);
    CHECK(worst_sub <= 1.0, "e^x within a subnormal step below FLT_MIN: %.3f", worst_sub);
    printf("softmax e^x: at most %.3f ulp (normal results), %.3f subnormal steps\n", worst, worst_sub);
    CHECK(ref_exp(0.0f) == 1.0f && ref_exp(-0.0f) == 1.0f, "e^0 = 1");
    CHECK(ref_exp(-105.0f) == 0.0f && ref_exp(-INFINITY) == 0.0f && isinf(ref_exp(89.0f)) && isnan(ref_exp(NAN)),
          "e^x at the ends");
}

static void test_softmax(void) {
    /* mpk_softmax against the definition: row lengths around the 8-wide steps and long rows,
     * spreads that underflow into subnormals and to zero, -inf, ties, signed zeros, a NaN */
    enum { NMAX = 4099 };
    static float a[NMAX], b[NMAX];
    const int64_t lens[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 64, 100, 1000, 4099};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int kind = 0; kind < 6; kind++) {
            int64_t n = lens[li];
            for (int64_t i = 0; i < n; i++) {
                float v = urand();
                a[i] = kind == 0 ? v * 30.0f : kind == 1 ? v * 120.0f : kind == 2 ? (i % 3 ? -90.0f + v : 0.0f)
                     : kind == 3 ? (i % 5 == 1 ? -INFINITY : v) : kind == 4 ? (i % 2 ? 0.0f : -0.0f) : v;
            }
            if (kind == 5) a[n / 2] = NAN;
            memcpy(b, a, (size_t)n * sizeof(float));
            mpk_softmax(a, n);
            ref_softmax(b, n);
            int bad = 0;
            double sum = 0;
            for (int64_t i = 0; i < n; i++) {
                bad += bits(a[i]) != bits(b[i]);
                sum += a[i];
            }
            CHECK(bad == 0, "softmax length %lld kind %d: %d elements differ from the definition", (long long)n, kind, bad);
            if (kind < 5) CHECK(fabs(sum - 1.0) < 1e-5, "softmax length %lld kind %d sums to %.9f", (long long)n, kind, sum);
            else CHECK(bits(a[0]) == 0x7fc00000u, "softmax with a NaN: the quiet NaN");
            tape_put(a, n);
        }
}

/* mpk_swiglu: mpk_silu(g) x u element by element, lengths around the 8-wide steps, large,
 * tiny, signed-zero and NaN gates; mpk_silu itself as its definition with the e^x above */
static void test_swiglu(void) {
    enum { N = 77 };
    float g[N], u[N], out[N];
    for (int n = 1; n <= N; n += 9) {
        for (int i = 0; i < n; i++) {
            g[i] = i % 7 == 3 ? (i % 2 ? 100.0f : -100.0f) : i % 11 == 5 ? -0.0f : urand() * 8.0f;
            u[i] = urand();
        }
        if (n > 40) g[40] = NAN;
        memcpy(out, g, sizeof g);
        mpk_swiglu(out, u, n);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            volatile float e = ref_exp(-g[i]), d = 1.0f + e, s = g[i] / d;
            bad += bits(out[i]) != bits(s * u[i]) || bits(mpk_silu(g[i])) != bits(s);
        }
        CHECK(bad == 0, "swiglu length %d: %d elements differ from the definition", n, bad);
        tape_put(out, n);
    }
}

/* a NaN's bits with the quiet bit set: F16C returns a signalling f16 NaN quiet, mpk_f16_to_f32
 * keeps it signalling (the engine's f16 rows come from mpk_f32_to_f16, which writes no sNaN) */
static uint32_t quieted(float f) { return f != f ? bits(f) | 0x00400000u : bits(f); }

/* mpk_f16_to_f32_n: every f16 bit pattern, at offsets and lengths around the 8-wide blocks, as
 * mpk_f16_to_f32 converts each (signalling NaNs up to the quiet bit) */
static void test_f16_to_f32_n(void) {
    enum { N = 65536 + 16 };
    static uint8_t h[2 * N];
    static float out[N];
    for (uint32_t i = 0; i < N; i++) h[2 * i] = (uint8_t)i, h[2 * i + 1] = (uint8_t)(i >> 8);
    const int64_t spans[][2] = {{0, 65536}, {3, 1}, {5, 7}, {1, 8}, {7, 9}, {2, 17}, {11, 65536 + 5}};
    for (size_t k = 0; k < sizeof spans / sizeof spans[0]; k++) {
        const int64_t o = spans[k][0], n = spans[k][1];
        memset(out, 0x55, (size_t)n * 4);
        mpk_f16_to_f32_n(h + 2 * o, n, out);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) {
            bad += quieted(out[i]) != quieted(mpk_f16_to_f32((uint16_t)(o + i)));
            const uint32_t q = quieted(out[i]);
            memcpy(&out[i], &q, 4);
        }
        CHECK(bad == 0, "f16_to_f32_n offset %lld length %lld: %lld values differ", (long long)o, (long long)n,
              (long long)bad);
        tape_put(out, n);
    }
}

int main(void) {
    test_exp();
    at_every_level("softmax", test_softmax);
    at_every_level("swiglu", test_swiglu);
    at_every_level("wsum", test_wsum);
    at_every_level("dots", test_dots);
    at_every_level("f16_to_f32_n", test_f16_to_f32_n);
    npaths = kernel_paths(paths);
    printf("paths:");
    for (int k = 0; k < npaths; k++) printf(" %s", mpk_impl_name(paths[k]));
    printf(" (auto: %s)\n", mpk_impl_name(mpk_select(MPK_AUTO)));
    CHECK(mpk_select(MPK_AUTO) == paths[npaths - 1], "auto picks the best path");
    CHECK(mpk_select(99) == NULL, "unknown path");
    pools[0] = NULL;
    pools[1] = mpk_pool_create(2);
    pools[2] = mpk_pool_create(3);

    static const int64_t R[] = {1, 63, 64, 100, 130, 257};
    static const int64_t C[] = {1, 7, 8, 20, 255, 257, 520};
    float *x = malloc(1100 * 4);
    /* shapes x stages with random activations */
    for (int S = 1; S <= 8; S++)
        for (size_t i = 0; i < sizeof R / sizeof *R; i++)
            for (size_t j = 0; j < sizeof C / sizeof *C; j++) {
                if ((i + j + (size_t)S) % 3 && S > 2 && S != 4) continue; /* a third of the grid beyond S = 1, 2, 4 */
                for (int64_t c = 0; c < C[j]; c++) x[c] = urand() * 3.0f;
                run_case("random", R[i], C[j], S, x, NULL);
            }
    /* a shape that spans many tiles and groups (task partition, V_NB remainders) */
    for (int64_t c = 0; c < 1100; c++) x[c] = urand();
    run_case("large", 64 * 21 + 5, 1100, 3, x, NULL);
    run_case("large", 64 * 37, 1024, 4, x, NULL);
    /* special activations */
    memset(x, 0, 1100 * 4);
    run_case("zero", 130, 300, 4, x, NULL);
    for (int64_t c = 0; c < 300; c++) x[c] = urand() * 1e-31f; /* below 2^-96 after the table: zeros */
    run_case("tiny", 130, 300, 3, x, NULL);
    for (int64_t c = 0; c < 300; c++) x[c] = urand() * 1e-27f; /* small but live */
    run_case("small", 130, 300, 3, x, NULL);
    for (int64_t c = 0; c < 300; c++) x[c] = urand();
    x[77] = 1e30f; /* one huge element: its group's small entries round to 0 */
    run_case("huge", 130, 300, 4, x, NULL);
    x[77] = 3e38f; /* the table overflows to inf: NaN product */
    run_case("overflow", 130, 300, 4, x, NULL);
    x[77] = 1.0f;
    x[299] = NAN;
    run_case("nan", 130, 300, 2, x, NULL);
    x[299] = -INFINITY;
    run_case("inf", 100, 300, 2, x, NULL);
    x[299] = 0.5f;
    uint16_t sc[130];
    for (int r = 0; r < 130; r++) sc[r] = r % 5 == 0 ? 0x7e00 : r % 5 == 1 ? 0x7c00 : r % 5 == 2 ? 0xfc00 : r % 5 == 3 ? 0 : 0x3c00;
    run_case("scales nan/inf/0", 130, 300, 3, x, sc);
    memset(x, 0, 300 * 4);
    run_case("inf scale x zero activation", 130, 300, 3, x, sc);

    /* table layout: q in range and 64-aligned, d = 0 for an all-zero group */
    {
        void *mem = malloc(mpk_rvq_tab_bytes(520, 3));
        mpk_rvq_tab t;
        mpk_rvq_tab_init(&t, mem, 520, 3);
        CHECK(((uintptr_t)t.q & 63) == 0 && t.nv == 65 && t.ngroups == 3, "tab layout");
        CHECK((char *)(t.d + t.ngroups * 3) <= (char *)mem + mpk_rvq_tab_bytes(520, 3), "tab bytes");
        float *cbt = malloc(3 * 2048 * 4);
        for (int i = 0; i < 3 * 2048; i++) cbt[i] = urand();
        for (int c = 0; c < 520; c++) x[c] = c < 256 ? 0.0f : urand();
        for (int k = 0; k < npaths; k++) {
            mpk_rvq_tables(paths[k], NULL, cbt, x, &t);
            int ok = !t.nan && t.d[0] == 0.0f && t.d[1] == 0.0f && t.d[2] == 0.0f && t.d[3] > 0.0f;
            for (int64_t i = 0; i < t.nv * 3 * 256; i++) ok &= t.q[i] >= -127 && (i >= 32 * 3 * 256 || t.q[i] == 0);
            CHECK(ok, "table contents (%s)", mpk_impl_name(paths[k]));
        }
        free(cbt);
        free(mem);
    }
    free(x);
    mpk_pool_destroy(pools[1]);
    mpk_pool_destroy(pools[2]);
    free(tape);
    T_DONE("kernels");
}
