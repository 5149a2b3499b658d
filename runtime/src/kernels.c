/* Scalar kernels, run-time dispatch, and the threaded drivers.
 *
 * Trunk matrices: summation order is defined once here and mirrored exactly by kernels_avx2.c:
 * every dot product keeps 8 lane accumulators (element i goes to lane i mod 8 of its row or
 * group), adds with separate multiply and add (no FMA: fused rounding would differ from the
 * scalar path) and reduces lanes with red8().
 *
 * Routed experts (rvq): the integer lookup-table product of spec/CODECS.md §3.5, which fixes
 * every rounding (FMA where the spec says fma), so the scalar code below defines the numerics and
 * kernels_avx2.c / kernels_avx512.c reproduce it bit for bit; integer sums make the row and
 * thread partition irrelevant. */
#include "kernels.h"
#include "kernels_impl.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
static int cpu_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
}
static int cpu_avx512vbmi(void) {
    /* libgcc also checks that the OS saves the zmm state (XCR0) before reporting these */
    return cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
           __builtin_cpu_supports("avx512vnni");
}
static int cpu_avx512amx(void) { return cpu_avx512vbmi() && mpk_amx_usable(); }
#else
static int cpu_avx2(void) { return 0; }
static int cpu_avx512vbmi(void) { return 0; }
static int cpu_avx512amx(void) { return 0; }
#endif

const mpk_impl *mpk_select(int which) {
    switch (which) {
    case MPK_AUTO:
        return cpu_avx512amx()    ? &mpk_avx512amx_impl
               : cpu_avx512vbmi() ? &mpk_avx512_impl
               : cpu_avx2()       ? &mpk_avx2_impl
                                  : &mpk_scalar_impl;
    case MPK_SCALAR: return &mpk_scalar_impl;
    case MPK_AVX2: return cpu_avx2() ? &mpk_avx2_impl : NULL;
    case MPK_AVX512VBMI: return cpu_avx512vbmi() ? &mpk_avx512_impl : NULL;
    case MPK_AVX512AMX: return cpu_avx512amx() ? &mpk_avx512amx_impl : NULL;
    }
    return NULL;
}

const char *mpk_impl_name(const mpk_impl *k) { return k ? k->name : mpk_scalar_impl.name; }

static const mpk_impl *impl_or_scalar(const mpk_impl *k) { return k ? k : &mpk_scalar_impl; }
/* The grouped codecs (q8/q6/q4) take the trunk's integer product (CODECS.md §2.4) in every call:
 * their group sums fit int32 (|code| <= 128, |q| <= 32767, at most MPK_MAX_GROUP columns a group,
 * the spec's largest, which mpk_mat_init enforces); the float codecs keep their float products. */
#define MPK_MAX_GROUP 256
static int grouped(const mpk_mat *w) { return w->group > 0; }
static int vec_helpers(void);

float mpk_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

#if defined(__x86_64__) || defined(__i386__)
/* the whole blocks of eight; returns how many values it converted */
__attribute__((target("avx,f16c"))) static int64_t f16_to_f32_f16c(const uint8_t *s, int64_t n, float *d) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * i))));
    return i;
}
#endif

void mpk_f16_to_f32_n(const void *src, int64_t n, float *d) {
    const uint8_t *s = src;
    int64_t i = 0;
#if defined(__x86_64__) || defined(__i386__)
    /* F16C: exact like mpk_f16_to_f32, only faster, but a signalling NaN comes back quiet */
    if (vec_helpers()) i = f16_to_f32_f16c(s, n, d);
#endif
    for (; i < n; i++) d[i] = mpk_f16_to_f32(ld16(s + 2 * i));
}

/* IEEE binary16 with round to nearest, ties to even (what numpy's astype(float16) and F16C do);
 * NaN stays a quiet NaN with the top payload bits, beyond 65504 rounds to Inf. */
uint16_t mpk_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: Inf */
    uint32_t e = ax >> 23, man = ax & 0x7fffffu, h, rem, half;
    if (e >= 113) { /* normal in f16: drop 13 mantissa bits */
        h = ((e - 112) << 10) | (man >> 13);
        rem = man & 0x1fffu;
        half = 0x1000u;
    } else { /* subnormal (or zero) in f16: units of 2^-24 */
        if (e < 102) return (uint16_t)sign; /* below 2^-25: rounds to 0 */
        uint32_t shift = 126 - e;         /* 14..24 */
        man |= 0x800000u;
        h = man >> shift;
        rem = man & ((1u << shift) - 1);
        half = 1u << (shift - 1);
    }
    if (rem > half || (rem == half && (h & 1))) h++; /* a carry moves into the exponent: right */
    return (uint16_t)(sign | h);
}

float mpk_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}


/* ---- scalar implementations ---- */

static float red8(const float l[8]) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
float mpk_red8(const float l[8]) { return red8(l); }

/* Per-codec scalar row products of the float codecs (row_dot's order: lanes of element mod 8,
 * separate multiply and add, red8); the grouped codecs take §2.4 (s_qdot_rows). */
static float s_dot_f32(const mpk_mat *w, int64_t r, const float *x) {
    float l[8] = {0};
    const float *row = (const float *)w->data + r * w->cols;
    for (int64_t c = 0; c < w->cols; c++) l[c & 7] += row[c] * x[c];
    return red8(l);
}

static float dot_16(const mpk_mat *w, int64_t r, const float *x, float (*cvt)(uint16_t)) {
    float l[8] = {0};
    const uint8_t *row = w->data + (size_t)(r * w->cols) * 2;
    for (int64_t c = 0; c < w->cols; c++) l[c & 7] += cvt(ld16(row + 2 * c)) * x[c];
    return red8(l);
}
static float s_dot_f16(const mpk_mat *w, int64_t r, const float *x) { return dot_16(w, r, x, mpk_f16_to_f32); }
static float s_dot_bf16(const mpk_mat *w, int64_t r, const float *x) { return dot_16(w, r, x, mpk_bf16_to_f32); }

static const mpk_row_dot_fn s_row_dots[MPK_TRUNK_CODECS] = {
    [MP_CODEC_F32] = s_dot_f32, [MP_CODEC_F16] = s_dot_f16, [MP_CODEC_BF16] = s_dot_bf16};

/* §3.5 steps 1-2, literally.  T is kept for the group (32 KiB) because q needs the group's max. */
static void s_rvq_tables(const float *cbt, const float *x, mpk_rvq_tab *t, int64_t g, int st) {
    const int S = t->stages;
    const int64_t v0 = g * MPK_RVQ_GROUP;
    const int64_t v1 = v0 + MPK_RVQ_GROUP < t->nv ? v0 + MPK_RVQ_GROUP : t->nv;
    const float *cs = cbt + (size_t)st * 8 * 256;
    float T[MPK_RVQ_GROUP][256];
    uint32_t mb = 0;
    for (int64_t v = v0; v < v1; v++) {
        float xv[8];
        for (int d = 0; d < 8; d++) xv[d] = 8 * v + d < t->cols ? x[8 * v + d] : 0.0f;
        for (int e = 0; e < 256; e++) {
            float a = xv[0] * cs[e];
            for (int d = 1; d < 8; d++) a = fmaf(xv[d], cs[d * 256 + e], a);
            T[v - v0][e] = a;
            uint32_t b = mpk_absbits(a);
            mb = b > mb ? b : mb;
        }
    }
    float inv = 0.0f, dd;
    int live = mpk_rvq_scale(mb, 127.0f, &inv, &dd);
    t->d[g * S + st] = dd;
    for (int64_t v = v0; v < v1; v++) {
        int8_t *q = t->q + ((size_t)v * (size_t)S + (size_t)st) * 256;
        for (int e = 0; e < 256; e++) {
            /* round half to even: adding 1.5 * 2^23 leaves ulp 1 for |p| <= 127.5 (default
             * rounding mode, like the SIMD conversions) */
            float p = T[v - v0][e] * inv;
            q[e] = live ? (int8_t)(int)((p + 0x1.8p23f) - 0x1.8p23f) : 0;
        }
    }
}

static void s_rvq_acc(const mpk_rvq *w, const mpk_rvq_tab *t, int64_t tile0, int64_t ntiles,
                      int64_t g0, int64_t g1, float *acc) {
    const int S = w->stages;
    const int64_t nv = w->nv, J = nv * S;
    for (int64_t g = g0; g < g1; g++) {
        int64_t v0 = g * MPK_RVQ_GROUP, v1 = v0 + MPK_RVQ_GROUP < nv ? v0 + MPK_RVQ_GROUP : nv;
        for (int64_t i = 0; i < ntiles; i++) {
            const uint8_t *c = w->codes + (size_t)((tile0 + i) * J) * 64;
            for (int st = 0; st < S; st++) {
                float d = t->d[g * S + st];
                for (int l = 0; l < 64; l++) {
                    int32_t n = 0;
                    for (int64_t v = v0; v < v1; v++) {
                        size_t j = (size_t)(v * S + st);
                        n += t->q[j * 256 + c[j * 64 + (size_t)l]];
                    }
                    acc[i * 64 + l] = fmaf((float)n, d, acc[i * 64 + l]);
                }
            }
        }
    }
}

static void s_rvq_tiles(const mpk_rvq *w, const mpk_rvq_tab *t, int64_t tile0, int64_t ntiles,
                        float *acc) {
    memset(acc, 0, (size_t)ntiles * 64 * sizeof *acc);
    s_rvq_acc(w, t, tile0, ntiles, 0, t->ngroups, acc);
}

/* §3.6: each decoded weight is its stages' integer entries summed (exact), each group's products
 * summed exactly in 64 bits, and the groups accumulated in order with one fma each */
static void s_rvq_gemm(const mpk_rvq *w, const mpk_rvq_icb *cb, const uint8_t *xq, size_t xqs, int64_t n,
                       int64_t r0, float *acc) {
    const int S = w->stages;
    const int64_t nv = w->nv, ng = (nv + MPK_RVQ_XGROUP - 1) / MPK_RVQ_XGROUP;
    const uint8_t *c = w->codes + (size_t)((r0 / 64) * nv * S) * 64 + (size_t)(r0 % 64);
    for (int i = 0; i < MPK_GEMM_ROWS; i++)
        for (int64_t t = 0; t < n; t++) {
            const int16_t *q = (const int16_t *)(xq + (size_t)t * xqs);
            const float *d = mpk_rvq_xq_steps(xq + (size_t)t * xqs, w->cols);
            float a = 0.0f;
            for (int64_t g = 0; g < ng; g++) {
                int64_t sum = 0;
                for (int64_t v = g * MPK_RVQ_XGROUP; v < nv && v < (g + 1) * MPK_RVQ_XGROUP; v++) {
                    const uint8_t *cv = c + (size_t)(v * S) * 64 + (size_t)i;
                    for (int dd = 0; dd < 8; dd++) {
                        int32_t wv = cb->q[0][cv[0]][dd];
                        for (int st = 1; st < S; st++) wv += cb->q[st][cv[st * 64]][dd];
                        sum += (int64_t)wv * q[v * 8 + dd];
                    }
                }
                a = fmaf((float)sum, d[g], a);
            }
            acc[(size_t)t * MPK_GEMM_ROWS + (size_t)i] = a;
        }
}

static void s_gemm_rows(const float *wb, int64_t nv, const float *x, int64_t xs, int64_t n, float *acc) {
    for (int i = 0; i < MPK_GEMM_ROWS; i++)
        for (int64_t t = 0; t < n; t++) {
            float a[8] = {0};
            for (int64_t c = 0; c < nv * 8; c++)
                a[c & 7] = fmaf(wb[((c >> 3) * MPK_GEMM_ROWS + i) * 8 + (c & 7)], x[t * xs + c], a[c & 7]);
            memcpy(acc + ((size_t)t * MPK_GEMM_ROWS + (size_t)i) * 8, a, sizeof a);
        }
}

static void s_row_ints(const mpk_mat *w, int64_t r, int16_t *out);
/* §2.4 steps 2-4 as written: the definition the SIMD paths reproduce */
static void s_qgemm_rows(const int16_t *wq, const float *sc, const float *mn, int64_t ng, int64_t group,
                         const uint8_t *xq, size_t xqs, int64_t n, float *acc) {
    for (int64_t t = 0; t < n; t++) {
        const int16_t *q = (const int16_t *)(xq + (size_t)t * xqs);
        const float *d = mpk_tq_steps(xq + (size_t)t * xqs, ng * group), *z = d + ng;
        for (int i = 0; i < MPK_GEMM_ROWS; i++) {
            float a = 0.0f;
            for (int64_t g = 0; g < ng; g++) {
                int32_t sum = 0; /* |sum| <= 256 x 128 x 32767 < 2^31 */
                for (int64_t c = g * group; c < (g + 1) * group; c++)
                    sum += (int32_t)wq[((c >> 1) * MPK_GEMM_ROWS + i) * 2 + (c & 1)] * q[c];
                a = fmaf((float)sum, sc[g * MPK_GEMM_ROWS + i] * d[g], a);
                if (mn) a = fmaf(z[g], mn[g * MPK_GEMM_ROWS + i] * d[g], a);
            }
            acc[t * MPK_GEMM_ROWS + i] = a;
        }
    }
}

/* §2.4 for one input, as written (the definition the SIMD qdot_rows reproduce) */
static void s_qdot_rows(const mpk_mat *w, int64_t r0, int64_t r1, const uint8_t *xq, float *y) {
    const int16_t *q = (const int16_t *)xq;
    const int64_t ng = w->ngroups, G = w->group;
    const float *d = mpk_tq_steps(xq, w->cols_p), *z = d + ng;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *k = mpk_grouped_row(w, r), *s = w->data + (size_t)(r * ng) * 2, *m = s + (size_t)(w->rows * ng) * 2;
        float a = 0.0f;
        for (int64_t g = 0; g < ng; g++) {
            int32_t sum = 0; /* |sum| <= 256 x 128 x 32767 < 2^31 */
            for (int64_t c = g * G; c < (g + 1) * G; c++) sum += mpk_int_code(w, k, c) * q[c];
            a = fmaf((float)sum, mpk_f16_to_f32(ld16(s + 2 * g)) * d[g], a);
            if (w->zero_point) a = fmaf(z[g], mpk_f16_to_f32(ld16(m + 2 * g)) * d[g], a);
        }
        y[r - r0] = a;
    }
}

static void s_row_values(const mpk_mat *w, int64_t r, float *out) { mpk_row(w, r, out); }

const mpk_impl mpk_scalar_impl = {.name = "scalar", .row_dot = s_row_dots, .rvq_tables = s_rvq_tables,
                                 .rvq_tiles = s_rvq_tiles, .rvq_gemm = s_rvq_gemm,
                                 .row_values = s_row_values, .gemm_rows = s_gemm_rows,
                                 .qgemm_rows = s_qgemm_rows, .row_ints = s_row_ints,
                                 .qdot_rows = s_qdot_rows};

/* ---- shared helpers ---- */

int mpk_mat_init(mpk_mat *m, int codec, int64_t rows, int64_t cols, int64_t group,
                 int zero_point, const void *data) {
    memset(m, 0, sizeof *m);
    if (rows < 1 || cols < 1 || !data) return -1;
    m->codec = codec;
    m->rows = rows;
    m->cols = cols;
    m->data = data;
    m->cols_p = cols;
    if (codec == MP_CODEC_Q8 || codec == MP_CODEC_Q4 || codec == MP_CODEC_Q6) {
        if (group < 8 || group % 8 || group > MPK_MAX_GROUP) return -1;
        m->group = group;
        m->ngroups = (cols + group - 1) / group;
        m->cols_p = m->ngroups * group;
        m->zero_point = codec == MP_CODEC_Q4 ? zero_point : 0;
    } else if (codec != MP_CODEC_F32 && codec != MP_CODEC_F16 && codec != MP_CODEC_BF16) {
        return -1;
    }
    return 0;
}

uint64_t mpk_mat_nbytes(const mpk_mat *m) {
    mp_codec_info ci = {.kind = (mp_codec_kind)m->codec, .group_size = (uint32_t)m->group,
                        .zero_point = m->zero_point};
    return mp_codec_nbytes(&ci, 2, (const int64_t[2]){m->rows, m->cols});
}

/* Per-codec row decodes: a row's values (mpk_row), and its stored numbers with the group scales
 * and q4 minimums apart (mpk_row_codes; for the float codecs, what mm_rows multiplies). */
void mpk_group_scales(const mpk_mat *w, int64_t r, float *sc, float *mn) {
    if (!sc) return; /* mpk_row applies the scales itself */
    const int64_t ng = w->ngroups;
    const uint8_t *s = w->data + (size_t)(r * ng) * 2, *m = s + (size_t)(w->rows * ng) * 2;
    for (int64_t g = 0; g < ng; g++) sc[g] = mpk_f16_to_f32(ld16(s + 2 * g));
    if (mn && w->zero_point)
        for (int64_t g = 0; g < ng; g++) mn[g] = mpk_f16_to_f32(ld16(m + 2 * g));
}

static void codes_f32(const mpk_mat *w, int64_t r, float *out, float *sc, float *mn) {
    (void)sc, (void)mn;
    memcpy(out, (const float *)w->data + r * w->cols, (size_t)w->cols * 4);
}
static void codes_f16(const mpk_mat *w, int64_t r, float *out, float *sc, float *mn) {
    (void)sc, (void)mn;
    for (int64_t c = 0; c < w->cols; c++) out[c] = mpk_f16_to_f32(ld16(w->data + (size_t)(r * w->cols + c) * 2));
}
static void codes_bf16(const mpk_mat *w, int64_t r, float *out, float *sc, float *mn) {
    (void)sc, (void)mn;
    for (int64_t c = 0; c < w->cols; c++) out[c] = mpk_bf16_to_f32(ld16(w->data + (size_t)(r * w->cols + c) * 2));
}
static void codes_q8(const mpk_mat *w, int64_t r, float *out, float *sc, float *mn) {
    const int8_t *q = (const int8_t *)mpk_q8_row(w, r);
    for (int64_t c = 0; c < w->cols; c++) out[c] = (float)q[c];
    mpk_group_scales(w, r, sc, mn);
}
static void codes_q6(const mpk_mat *w, int64_t r, float *out, float *sc, float *mn) {
    const uint8_t *q = mpk_q6_row(w, r);
    for (int64_t c = 0; c < w->cols; c++) out[c] = (float)(mpk_q6_code(q, c) - 32);
    mpk_group_scales(w, r, sc, mn);
}
static void codes_q4(const mpk_mat *w, int64_t r, float *out, float *sc, float *mn) {
    const uint8_t *q = mpk_q4_row(w, r);
    for (int64_t c = 0; c < w->cols; c++) {
        int nib = (q[c >> 1] >> ((c & 1) * 4)) & 15;
        out[c] = (float)(w->zero_point ? nib : nib - 8);
    }
    mpk_group_scales(w, r, sc, mn);
}

/* Row r's integer codes as §2.4 multiplies them (q4 symmetric and q6 minus their offsets), columns
 * [c0, cols) of out */
void mpk_row_ints_from(const mpk_mat *w, int64_t r, int64_t c0, int16_t *out) {
    const uint8_t *q = mpk_grouped_row(w, r);
    for (int64_t c = c0; c < w->cols; c++) out[c] = (int16_t)mpk_int_code(w, q, c);
}
static void s_row_ints(const mpk_mat *w, int64_t r, int16_t *out) { mpk_row_ints_from(w, r, 0, out); }

static const mpk_row_codes_fn row_codes[MPK_TRUNK_CODECS] = {
    [MP_CODEC_F32] = codes_f32, [MP_CODEC_F16] = codes_f16, [MP_CODEC_BF16] = codes_bf16,
    [MP_CODEC_Q8] = codes_q8,   [MP_CODEC_Q6] = codes_q6,   [MP_CODEC_Q4] = codes_q4};

void mpk_row_codes(const mpk_mat *w, int64_t r, float *out, float *sc, float *mn) {
    row_codes[w->codec](w, r, out, sc, mn);
}

void mpk_row(const mpk_mat *w, int64_t r, float *out) {
    row_codes[w->codec](w, r, out, NULL, NULL);
    if (!w->group) return; /* float codecs: the codes are the values */
    /* grouped: code x scale (+ minimum), as the reference decode; the scales of one group at a
     * time (the row's full set can be large) */
    const int64_t G = w->group, ng = w->ngroups;
    const uint8_t *s = w->data + (size_t)(r * ng) * 2, *m = s + (size_t)(w->rows * ng) * 2;
    for (int64_t c = 0; c < w->cols; c++) {
        float sc = mpk_f16_to_f32(ld16(s + 2 * (c / G)));
        out[c] = w->zero_point ? out[c] * sc + mpk_f16_to_f32(ld16(m + 2 * (c / G))) : out[c] * sc;
    }
}

/* ---- threaded drivers: fixed row blocks ---- */

/* A task's work buffer (64-byte aligned): the running thread's scratch in `pool`, reserved at
 * open for the widest trunk matrix (mpk_task_bytes, in the memory plan), or without a pool one
 * allocated for the task and freed by task_buffer_done */
static void *task_buffer(mpk_pool *pool, size_t bytes) {
    return pool ? mpk_pool_scratch(pool, bytes) : aligned_alloc(64, (bytes + 63) / 64 * 64);
}

static void task_buffer_done(mpk_pool *pool, void *b) {
    if (!pool) free(b);
}

/* Rows a task of single-input products takes: about STREAM_TASK_BYTES of a matrix, so that each
 * thread reads long runs of contiguous rows (16-row tasks, 64 KiB of q8 at 4096 columns, broke the
 * two threads' streams every task: q8 4096x4096 in RAM, 2 threads, Intel Xeon VM, 15 -> 17-18 G
 * weights/s at 128 rows, 2026-12-06), a multiple of 16 rows and at most an even share of them.
 * Which rows a task takes never changes a row's result. */
#define STREAM_TASK_BYTES (512 << 10)
static int64_t stream_rows(const mpk_mat *w, int threads) {
    const int64_t row_bytes = (int64_t)(mpk_mat_nbytes(w) / (uint64_t)w->rows) + 1;
    const int64_t share = (w->rows + threads - 1) / threads;
    int64_t r = STREAM_TASK_BYTES / row_bytes;
    r = r < share ? r : share;
    r = r > 1 ? r : 1;
    return (r + MPK_MM_ROWS - 1) / MPK_MM_ROWS * MPK_MM_ROWS;
}

size_t mpk_mm_wb_floats(const mpk_mat *w) {
    return (size_t)MPK_MM_ROWS * ((size_t)w->cols_p + 2 * (size_t)(w->ngroups ? w->ngroups : 1));
}

typedef struct {
    const mpk_impl *k;
    const mpk_mat *w;
    const float *x;
    int64_t n;
    float *y;
    const float *xt; /* multi-input path: transposed inputs */
    int64_t nb;
    int64_t rows; /* per task: MPK_MM_ROWS for mm_rows (its buffer's rows), else stream_rows */
    mpk_pool *pool; /* whose threads' scratch the tasks use (NULL: their own allocations) */
} mv_job;

static void mv_task(void *ctx, size_t t) {
    mv_job *j = ctx;
    const mpk_mat *w = j->w;
    int64_t r0 = (int64_t)t * j->rows, r1 = r0 + j->rows;
    if (r1 > w->rows) r1 = w->rows;
    if (j->xt) {
        float *wb = task_buffer(j->pool, mpk_mm_wb_floats(w) * sizeof(float));
        if (wb) {
            j->k->mm_rows(w, r0, r1, j->xt, j->nb, j->n, j->y, wb);
            task_buffer_done(j->pool, wb);
            return;
        }
    }
    if (j->n == 1 && j->k->rows_dot) {
        j->k->rows_dot(w, r0, r1, j->x, j->y + r0);
        return;
    }
    for (int64_t r = r0; r < r1; r++)
        for (int64_t i = 0; i < j->n; i++) j->y[i * w->rows + r] = j->k->row_dot[w->codec](w, r, j->x + i * w->cols);
}

/* Inputs transposed for mm_rows: xt[b][c][i] = x[b * TB + i][c] (0 past n).  NULL when out of
 * memory (the caller then runs row by row). */
static float *mm_inputs(mpk_pool *pool, const mpk_mat *w, const float *x, int64_t n, int64_t nb) {
    const int64_t C = w->cols, TB = MPK_MM_TB;
    float *xt = mpk_pool_inputs(pool, (size_t)(nb * C * TB) * sizeof(float));
    if (!xt) return NULL;
    memset(xt, 0, (size_t)(nb * C * TB) * sizeof(float));
    for (int64_t t = 0; t < n; t++)
        for (int64_t c = 0; c < C; c++) xt[((t / TB) * C + c) * TB + t % TB] = x[t * C + c];
    return xt;
}

void mpk_matmat(const mpk_impl *k, mpk_pool *pool, const mpk_mat *w, const float *x, int64_t n,
                float *y) {
    if (grouped(w)) { /* grouped codecs: §2.4 for any number of inputs */
        mpk_gemm(k, pool, w, x, n, y);
        return;
    }
    mv_job j = {impl_or_scalar(k), w, x, n, y, NULL, 0, MPK_MM_ROWS, pool};
    float *xt = NULL;
    /* several inputs: each row decoded once and multiplied with MPK_MM_TB inputs per
     * instruction (same operations per input as row_dot, so the same bits) */
    /* from where it beats row by row (bench_trunk_matmat) */
    if (n >= MPK_MM_TB && j.k->mm_rows) {
        j.nb = (n + MPK_MM_TB - 1) / MPK_MM_TB;
        j.xt = xt = mm_inputs(pool, w, x, n, j.nb);
    }
    if (!j.xt) j.rows = stream_rows(w, mpk_pool_threads(pool));
    size_t ntasks = (size_t)((w->rows + j.rows - 1) / j.rows);
    /* tiny matrices: thread wake-up costs more than the work */
    mpk_pool_run(w->rows * w->cols * n < 32768 ? NULL : pool, ntasks, mv_task, &j);
    mpk_pool_inputs_done(pool, xt);
}

void mpk_matvec(const mpk_impl *k, mpk_pool *pool, const mpk_mat *w, const float *x, float *y) {
    mpk_matmat(k, pool, w, x, 1, y);
}

void mpk_rvq_transpose_cb(const float *cb, int stages, float *cbt) {
    for (int s = 0; s < stages; s++)
        for (int e = 0; e < 256; e++)
            for (int d = 0; d < 8; d++)
                cbt[((size_t)s * 8 + (size_t)d) * 256 + (size_t)e] = cb[((size_t)s * 256 + (size_t)e) * 8 + (size_t)d];
}

uint64_t mpk_rvq_nbytes(int64_t rows, int64_t cols, int stages) {
    mp_codec_info ci = {.kind = MP_CODEC_RVQ, .stages = (uint32_t)stages, .dim = 8, .entries = 256};
    return mp_codec_nbytes(&ci, 2, (const int64_t[2]){rows, cols});
}

void mpk_rvq_init(mpk_rvq *w, int64_t rows, int64_t cols, int stages, const uint8_t *part) {
    w->rows = rows;
    w->cols = cols;
    w->nv = (cols + 7) / 8;
    w->stages = stages;
    w->codes = part;
    w->scales = part + (mpk_rvq_nbytes(rows, cols, stages) - 2 * (uint64_t)rows); /* codes first */
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t mpk_rvq_tab_bytes(int64_t cols, int stages) {
    size_t nv = (size_t)((cols + 7) / 8), ng = (nv + MPK_RVQ_GROUP - 1) / MPK_RVQ_GROUP;
    return 64 + align64(nv * (size_t)stages * 256) + ng * (size_t)stages * sizeof(float);
}

void mpk_rvq_tab_init(mpk_rvq_tab *t, void *mem, int64_t cols, int stages) {
    t->cols = cols;
    t->nv = (cols + 7) / 8;
    t->ngroups = (t->nv + MPK_RVQ_GROUP - 1) / MPK_RVQ_GROUP;
    t->stages = stages;
    t->nan = 0;
    uintptr_t p = ((uintptr_t)mem + 63) & ~(uintptr_t)63;
    t->q = (int8_t *)p;
    t->d = (float *)(p + align64((size_t)t->nv * (size_t)stages * 256));
}

/* A batch's tasks: matrix i owns tasks first[i] .. first[i + 1] - 1 */
static int batch_item(const size_t *first, int n, size_t task) {
    int i = 0;
    while (i + 1 < n && first[i + 1] <= task) i++;
    return i;
}

typedef struct {
    const mpk_impl *k;
    const float *cbt;
    const float *const *x;
    mpk_rvq_tab *const *t;
    int n;
    size_t first[MPK_RVQ_BATCH + 1];
} tab_job;

static void tab_task(void *ctx, size_t task) {
    tab_job *j = ctx;
    int i = batch_item(j->first, j->n, task);
    size_t k = task - j->first[i];
    mpk_rvq_tab *t = j->t[i];
    j->k->rvq_tables(j->cbt, j->x[i], t, (int64_t)k / t->stages, (int)(k % (size_t)t->stages));
}

void mpk_rvq_tables_batch(const mpk_impl *k, mpk_pool *pool, int n, const float *cbt, const float *const *x,
                          mpk_rvq_tab *const *t) {
    tab_job j = {impl_or_scalar(k), cbt, x, t, n, {0}};
    int64_t work = 0;
    for (int i = 0; i < n; i++) {
        j.first[i + 1] = j.first[i] + (size_t)t[i]->ngroups * (size_t)t[i]->stages;
        work += t[i]->nv * t[i]->stages;
    }
    mpk_pool_run(work < 64 ? NULL : pool, j.first[n], tab_task, &j);
    for (int i = 0; i < n; i++) {
        t[i]->nan = 0;
        for (size_t g = 0; g < j.first[i + 1] - j.first[i]; g++) t[i]->nan |= t[i]->d[g] != t[i]->d[g];
    }
}

void mpk_rvq_tables(const mpk_impl *k, mpk_pool *pool, const float *cbt, const float *x, mpk_rvq_tab *t) {
    mpk_rvq_tables_batch(k, pool, 1, cbt, &x, &t);
}

typedef struct {
    const mpk_impl *k;
    const mpk_rvq *w;
    const mpk_rvq_tab *const *t;
    float *const *y;
    int n;
    int64_t per[MPK_RVQ_BATCH]; /* tiles per task */
    size_t first[MPK_RVQ_BATCH + 1];
} rvq_job;

static void rvq_task(void *ctx, size_t task) {
    rvq_job *j = ctx;
    int i = batch_item(j->first, j->n, task);
    const mpk_rvq *w = &j->w[i];
    int64_t nt = (w->rows + 63) / 64, per = j->per[i], tile0 = (int64_t)(task - j->first[i]) * per;
    int64_t n = nt - tile0 < per ? nt - tile0 : per;
    float acc[MPK_RVQ_MAX_TILES * 64] __attribute__((aligned(64)));
    j->k->rvq_tiles(w, j->t[i], tile0, n, acc);
    int64_t r0 = tile0 * 64, r1 = r0 + n * 64 < w->rows ? r0 + n * 64 : w->rows;
    float *y = j->y[i], sc[MPK_RVQ_MAX_TILES * 64];
    mpk_f16_to_f32_n(w->scales + 2 * r0, r1 - r0, sc);
    for (int64_t r = r0; r < r1; r++) y[r] = mpk_canon(acc[r - r0] * sc[r - r0]);
}

void mpk_rvq_matvec_batch(const mpk_impl *k, mpk_pool *pool, int n, const mpk_rvq *w,
                          const mpk_rvq_tab *const *t, float *const *y) {
    rvq_job j = {impl_or_scalar(k), w, t, y, n, {0}, {0}};
    const int64_t threads = mpk_pool_threads(pool);
    int64_t work = 0;
    for (int i = 0; i < n; i++) {
        const int64_t nt = (w[i].rows + 63) / 64;
        /* big tasks keep a group's tables in L1 across many tiles; two per thread and matrix
         * balance shared cores.  The partition never changes a result (integer sums, per-row
         * combine). */
        int64_t per = (nt + 2 * threads - 1) / (2 * threads);
        per = per < 1 ? 1 : per > MPK_RVQ_MAX_TILES ? MPK_RVQ_MAX_TILES : per;
        j.per[i] = per;
        j.first[i + 1] = j.first[i] + (t[i]->nan ? 0 : (size_t)((nt + per - 1) / per));
        if (t[i]->nan) /* §3.5 step 2: the whole product is NaN */
            for (int64_t r = 0; r < w[i].rows; r++) y[i][r] = mpk_bits_f32(0x7fc00000u);
        work += w[i].rows * w[i].nv;
    }
    mpk_pool_run(work < 4096 ? NULL : pool, j.first[n], rvq_task, &j);
}

void mpk_rvq_matvec(const mpk_impl *k, mpk_pool *pool, const mpk_rvq *w, const mpk_rvq_tab *t, float *y) {
    mpk_rvq_matvec_batch(k, pool, 1, w, &t, &y);
}

void mpk_hadamard_rotate(const float *x, const float *signs, int64_t n, int64_t block, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * signs[i];
    for (int64_t b0 = 0; b0 + block <= n; b0 += block)
        for (int64_t h = 1; h < block; h *= 2)
            for (int64_t i = b0; i < b0 + block; i += 2 * h)
                for (int64_t j = i; j < i + h; j++) {
                    float a = out[j], b = out[j + h];
                    out[j] = a + b;
                    out[j + h] = a - b;
                }
    float c = (float)(1.0 / sqrt((double)block));
    for (int64_t i = 0; i < n; i++) out[i] *= c;
}

/* ---- small vector helpers ---- */

/* The helpers below run per head and position in attention: on AVX2 CPUs 8-wide with the same
 * operations (lanes = index mod 8, multiply then add, red8), so the same bits (mpk_wsum, whose
 * lanes are columns, 16-wide on AVX-512 CPUs: vec_helpers 2).  Which one runs
 * depends on the CPU alone (and mpk_vec_helpers_cap, which only tests call), never on an
 * engine's kernel choice. */
static _Atomic int vec_cap = 2;
static int vec_helpers(void) {
    static _Atomic int have = -1; /* -1: not asked yet */
    int h = have;
    if (h < 0) have = h = cpu_avx512vbmi() ? 2 : cpu_avx2();
    const int c = vec_cap;
    return h < c ? h : c;
}

int mpk_vec_helpers_cap(int level) {
    vec_cap = level < 0 ? 0 : level;
    return vec_helpers();
}

float mpk_dot(const float *a, const float *b, int64_t n) {
#if defined(__x86_64__) || defined(__i386__)
    if (vec_helpers()) return mpk_avx2_dot(a, b, n);
#endif
    float l[8] = {0};
    for (int64_t i = 0; i < n; i++) l[i & 7] += a[i] * b[i];
    return red8(l);
}

void mpk_dots(const float *x, const float *rows, int64_t stride, int nr, int64_t n, float *out) {
#if defined(__x86_64__) || defined(__i386__)
    if (vec_helpers()) {
        mpk_avx2_dots(x, rows, stride, nr, n, out);
        return;
    }
#endif
    for (int i = 0; i < nr; i++) out[i] = mpk_dot(rows + i * stride, x, n);
}

void mpk_dots_f16(const void *x, const float *rows, int64_t stride, int nr, int64_t n, float *out) {
#if defined(__x86_64__) || defined(__i386__)
    if (vec_helpers()) {
        mpk_avx2_dots_f16(x, rows, stride, nr, n, out);
        return;
    }
#endif
    const uint8_t *h = x;
    for (int i = 0; i < nr; i++) { /* mpk_dot's lanes and order, x converted as it is read */
        float l[8] = {0};
        for (int64_t c = 0; c < n; c++) l[c & 7] += rows[i * stride + c] * mpk_f16_to_f32(ld16(h + 2 * c));
        out[i] = red8(l);
    }
}

void mpk_dots_keys(const void *x, size_t xs, int nk, int f16, const float *rows, int64_t stride, int nr, int64_t n,
                   float *out, int64_t os) {
#if defined(__x86_64__) || defined(__i386__)
    if (vec_helpers()) {
        mpk_avx2_dots_keys(x, xs, nk, f16, rows, stride, nr, n, out, os, vec_helpers() > 1);
        return;
    }
#endif
    for (int k = 0; k < nk; k++) {
        const void *xk = (const uint8_t *)x + (size_t)k * xs;
        if (f16) mpk_dots_f16(xk, rows, stride, nr, n, out + k * os);
        else mpk_dots(xk, rows, stride, nr, n, out + k * os);
    }
}

void mpk_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0.0; /* double: the sum of squares is the one long reduction here */
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

void mpk_wsum_cols(float *out, int64_t os, int nh, const float *w, int64_t ws, const void *rows, size_t rs,
                   int f16, int64_t nt, int64_t c0, int64_t n) {
    for (int h = 0; h < nh; h++)
        for (int64_t c = c0; c < n; c++) out[h * os + c] = 0.0f;
    for (int64_t t = 0; t < nt; t++) {
        const uint8_t *r = (const uint8_t *)rows + (size_t)t * rs;
        for (int64_t c = c0; c < n; c++) {
            const float v = f16 ? mpk_f16_to_f32(ld16(r + 2 * c)) : ((const float *)(const void *)r)[c];
            for (int h = 0; h < nh; h++) out[h * os + c] += w[h * ws + t] * v;
        }
    }
}

void mpk_wsum(float *out, int64_t os, int nh, const float *w, int64_t ws, const void *rows, size_t rs, int f16,
              int64_t nt, int64_t n) {
#if defined(__x86_64__) || defined(__i386__)
    if (vec_helpers()) {
        (vec_helpers() > 1 ? mpk_avx512_wsum : mpk_avx2_wsum)(out, os, nh, w, ws, rows, rs, f16, nt, n);
        return;
    }
#endif
    mpk_wsum_cols(out, os, nh, w, ws, rows, rs, f16, nt, 0, n);
}

void mpk_axpy(float *y, float a, const float *x, int64_t n) {
#if defined(__x86_64__) || defined(__i386__)
    if (vec_helpers()) {
        mpk_avx2_axpy(y, a, x, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* mpk_softmax's lane sums: lane i & 7 of the exponentials in binary64, added in index order,
 * then these pairs */
static double softmax_total(const double l[8]) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

void mpk_softmax(float *x, int64_t n) {
    float m = x[0]; /* with a NaN the row ends NaN whatever m is */
    int64_t i = 1, e = 0, k = 0;
#if defined(__x86_64__) || defined(__i386__)
    const int vec = vec_helpers();
    if (vec && n >= 8) i = mpk_avx2_max(x, n, &m);
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    double l[8] = {0};
#if defined(__x86_64__) || defined(__i386__)
    if (vec) e = mpk_avx2_softmax_exp(x, n, m, l);
#endif
    for (; e < n; e++) {
        x[e] = mpk_exp(x[e] - m);
        l[e & 7] += x[e];
    }
    const double s = softmax_total(l);
    if (s != s) {
        for (i = 0; i < n; i++) x[i] = mpk_bits_f32(0x7fc00000u);
        return;
    }
    const float inv = (float)(1.0 / s);
#if defined(__x86_64__) || defined(__i386__)
    if (vec) k = mpk_avx2_scale(x, n, inv);
#endif
    for (; k < n; k++) x[k] *= inv;
}

float mpk_silu(float x) { return x / (1.0f + mpk_exp(-x)); }

void mpk_swiglu(float *g, const float *u, int64_t n) {
    int64_t i = 0;
#if defined(__x86_64__) || defined(__i386__)
    if (vec_helpers()) i = mpk_avx2_swiglu(g, u, n);
#endif
    for (; i < n; i++) g[i] = mpk_silu(g[i]) * u[i];
}

void mpk_rvq_icb_init(mpk_rvq_icb *c, const float *cb, int stages) {
    memset(c, 0, sizeof *c);
    double total = 0;
    for (int t = 0; t < stages; t++) {
        float m = 0;
        for (int i = 0; i < 256 * 8; i++) {
            const float v = fabsf(cb[t * 2048 + i]);
            if (!(v <= FLT_MAX)) c->nan = 1;
            m = v > m ? v : m;
        }
        total += m;
    }
    int p = 0;
    if (c->nan) total = 0;
    if (total > 0) {
        int e;
        const double frac = frexp(total, &e);
        p = frac * 16384.0 <= 16383.0 - stages ? 14 - e : 13 - e;
        p = p < 100 ? p : 100;
    }
    /* |cb x 2^p| < 2^14: adding and removing 1.5 x 2^52 rounds it to the nearest even integer
     * (binary64, default mode), without a libm call per entry */
    const double scale = ldexp(1.0, p), magic = 0x1.8p52;
    for (int t = 0; t < stages && !c->nan; t++)
        for (int i = 0; i < 256 * 8; i++) {
            const double v = (double)cb[t * 2048 + i] * scale + magic; /* the product is exact */
            c->q[t][i / 8][i % 8] = (int16_t)(v - magic);
        }
    c->unscale = ldexpf(1.0f, -p);
}

size_t mpk_rvq_xq_bytes(int64_t cols) {
    const size_t ng = (size_t)((cols + MPK_RVQ_XGROUP * 8 - 1) / (MPK_RVQ_XGROUP * 8));
    return (2 * (size_t)((cols + 15) / 16 * 16) + 4 * ng + 31) / 32 * 32;
}

/* x[c0 .. c1) rounded to integers in -qmax .. qmax (qmax <= 2^22) with one step for the range:
 * q[c] and *d as mpk_rvq_scale defines them (§3.6 step 2, §2.4 step 1) */
static void xq_group(const float *x, int64_t c0, int64_t c1, float qmax, int16_t *q, float *d) {
    uint32_t mb = 0;
    int64_t c = c0;
#if defined(__x86_64__) || defined(__i386__)
    const int vec = vec_helpers();
    if (vec) c += mpk_avx2_absmax_bits(x + c0, c1 - c0, &mb);
#endif
    for (; c < c1; c++) {
        const uint32_t b = mpk_absbits(x[c]);
        mb = b > mb ? b : mb;
    }
    float inv = 0;
    const int live = mpk_rvq_scale(mb, qmax, &inv, d);
    /* the product rounded to f32, then to the even integer: adding and subtracting 1.5 x 2^23
     * does that exactly for |v| <= 2^22 (default rounding mode), without a libm call */
    const float magic = 0x1.8p23f;
    c = c0;
#if defined(__x86_64__) || defined(__i386__)
    if (vec && live) c += mpk_avx2_round_i16(x + c0, c1 - c0, inv, q + c0);
#endif
    for (; c < c1; c++) {
        const float v = x[c] * inv;
        q[c] = live ? (int16_t)((v + magic) - magic) : 0;
    }
}

void mpk_rvq_xq(const float *x, int64_t cols, void *out) {
    int16_t *q = out;
    float *d = (float *)(q + (cols + 15) / 16 * 16);
    for (int64_t g0 = 0, g = 0; g0 < cols; g0 += MPK_RVQ_XGROUP * 8, g++)
        xq_group(x, g0, g0 + MPK_RVQ_XGROUP * 8 < cols ? g0 + MPK_RVQ_XGROUP * 8 : cols, 2047.0f, q, &d[g]);
    for (int64_t c = cols; c < (cols + 15) / 16 * 16; c++) q[c] = 0;
}

typedef void (*rvq_gemm_fn)(const mpk_rvq *w, const mpk_rvq_icb *cb, const uint8_t *xq, size_t xqs, int64_t n,
                            int64_t r0, float *acc);
typedef struct {
    rvq_gemm_fn gemm; /* the kernel's rvq_gemm, or rvq_gemm_tiles on its own input layout */
    const mpk_rvq *w;
    const mpk_rvq_icb *cb;
    const uint8_t *xq;
    size_t xqs;
    int64_t n, nsets; /* input sets of MPK_GEMM_INPUTS */
    float *y;
} gemm_job;

/* y[r] = (a[r] x s_r) x 2^-p for one input's rows; a full block's fixed trip count and the
 * restrict pointers let GCC vectorise it (it was ~8 % of the AMX product, scalar) */
static void gemm_put(const float *restrict a, const float *restrict sc, float u, int64_t nr, float *restrict y) {
    if (nr == MPK_GEMM_ROWS)
        for (int r = 0; r < MPK_GEMM_ROWS; r++) y[r] = mpk_canon(a[r] * sc[r] * u);
    else
        for (int64_t r = 0; r < nr; r++) y[r] = mpk_canon(a[r] * sc[r] * u);
}

static void gemm_task(void *ctx, size_t task) {
    gemm_job *j = ctx;
    const mpk_rvq *w = j->w;
    const int64_t r0 = (int64_t)task / j->nsets * MPK_GEMM_ROWS, t0 = (int64_t)task % j->nsets * MPK_GEMM_INPUTS;
    const int64_t n = j->n - t0 < MPK_GEMM_INPUTS ? j->n - t0 : MPK_GEMM_INPUTS;
    const int64_t r1 = r0 + MPK_GEMM_ROWS < w->rows ? r0 + MPK_GEMM_ROWS : w->rows;
    float acc[MPK_GEMM_INPUTS * MPK_GEMM_ROWS] __attribute__((aligned(64)));
    j->gemm(w, j->cb, j->xq + (size_t)t0 * j->xqs, j->xqs, n, r0, acc);
    float sc[MPK_GEMM_ROWS];
    mpk_f16_to_f32_n(w->scales + 2 * r0, r1 - r0, sc);
    /* input-outer: each input's rows are one run of y (row-outer wrote a line per store, and
     * the stores' misses were most of this loop) */
    for (int64_t t = 0; t < n; t++)
        gemm_put(acc + t * MPK_GEMM_ROWS, sc, j->cb->unscale, r1 - r0, j->y + (t0 + t) * w->rows + r0);
}

size_t mpk_rvq_gemm_ws_bytes(const mpk_impl *k, int64_t cols, int64_t n) {
    k = impl_or_scalar(k);
    return k->rvq_gemm_tiles ? ((size_t)((n + 15) / 16 * 16) * k->rvq_gemm_xbytes(cols) + 63) / 64 * 64 : 0;
}

/* the one layout so far, AMX's, in blocks of 16 inputs */
size_t mpk_rvq_gemm_ws_bound(int64_t cols, int64_t n) {
    return (size_t)(n + 16) * (size_t)((cols + MPK_RVQ_XGROUP * 8 - 1) / (MPK_RVQ_XGROUP * 8)) * MPK_AMX_GROUP_BYTES;
}

void mpk_rvq_gemm(const mpk_impl *k, mpk_pool *pool, const mpk_rvq *w, const mpk_rvq_icb *cb,
                  const void *xq, size_t xqs, int64_t n, void *ws, float *y) {
    if (n < 1) return;
    if (cb->nan) { /* §3.6 step 1: a non-finite codebook entry makes every row NaN */
        for (int64_t i = 0; i < n * w->rows; i++) y[i] = mpk_bits_f32(0x7fc00000u);
        return;
    }
    const mpk_impl *ki = impl_or_scalar(k);
    gemm_job j = {ki->rvq_gemm, w, cb, xq, xqs, n, (n + MPK_GEMM_INPUTS - 1) / MPK_GEMM_INPUTS, y};
    uint8_t *own = NULL, *xb = ws;
    if (ki->rvq_gemm_tiles && n >= ki->rvq_gemm_tiles_min) { /* the same bits, from its own layout */
        if (!xb) xb = own = aligned_alloc(64, mpk_rvq_gemm_ws_bytes(ki, w->cols, n));
        if (xb) { /* else (no memory): rvq_gemm */
            ki->rvq_gemm_xprep(xq, xqs, w->cols, n, xb);
            j.gemm = ki->rvq_gemm_tiles, j.xq = xb, j.xqs = ki->rvq_gemm_xbytes(w->cols);
        }
    }
    const int64_t blocks = (w->rows + MPK_GEMM_ROWS - 1) / MPK_GEMM_ROWS;
    mpk_pool_run(w->rows * w->cols * n < 32768 ? NULL : pool, (size_t)(blocks * j.nsets), gemm_task, &j);
    free(own);
}

typedef struct {
    const mpk_impl *k;
    const mpk_mat *w;
    const float *x;
    int64_t xs, n; /* inputs at x + t * xs; whole vectors (zero past cols) unless xs == cols */
    int64_t per;   /* row blocks per task */
    float *y;
    mpk_pool *pool; /* whose threads' scratch the tasks use (NULL: their own allocations) */
    const uint8_t *xq; /* the integer product's inputs (grouped matrices), xqs bytes apart; else NULL */
    size_t xqs;
} tgemm_job;

#if defined(__SSE2__)
static inline __m128 hadd4(__m128 a, __m128 b) { /* (a0 + a1, a2 + a3, b0 + b1, b2 + b3) */
    return _mm_add_ps(_mm_shuffle_ps(a, b, 0x88), _mm_shuffle_ps(a, b, 0xdd));
}
#endif

/* y[t][r] = red8 of row r's lane sums (a: rows q0 .. q1, 8 floats each), NaN canonical; with SSE2
 * four rows at once, red8's pairs as shuffled adds (the same sums): one row at a time this took
 * 7-10 % of the trunk's prefill product */
static void tgemm_put(const tgemm_job *j, int64_t t, int64_t q0, int64_t q1, const float *a) {
    float *y = j->y + t * j->w->rows;
    int64_t r = q0;
#if defined(__SSE2__)
    const __m128 qnan = _mm_castsi128_ps(_mm_set1_epi32(0x7fc00000));
    for (; r + 4 <= q1; r += 4, a += 32) {
        __m128 h[4];
        for (int i = 0; i < 4; i++) h[i] = hadd4(_mm_loadu_ps(a + 8 * i), _mm_loadu_ps(a + 8 * i + 4));
        const __m128 s = hadd4(hadd4(h[0], h[1]), hadd4(h[2], h[3])), ok = _mm_cmpord_ps(s, s);
        _mm_storeu_ps(y + r, _mm_or_ps(_mm_and_ps(ok, s), _mm_andnot_ps(ok, qnan)));
    }
#endif
    for (; r < q1; r++, a += 8) y[r] = mpk_canon(red8(a));
}

/* rows [r0, r1) one at a time, the same numbers (no memory for the blocked path) */
static void tgemm_rows_one_by_one(const tgemm_job *j, int64_t r0, int64_t r1) {
    float *one = malloc((size_t)j->w->cols_p * sizeof(float)), a[8];
    for (int64_t r = r0; one && r < r1; r++) {
        mpk_row(j->w, r, one);
        for (int64_t t = 0; t < j->n; t++) {
            memset(a, 0, sizeof a);
            for (int64_t c = 0; c < j->w->cols; c++) a[c & 7] = fmaf(one[c], j->x[t * j->xs + c], a[c & 7]);
            tgemm_put(j, t, r, r + 1, a);
        }
    }
    free(one);
}

/* Rows and inputs per pass, sized to stay in L2 together: up to four 16-row blocks (about 1 MiB
 * of decoded rows) times up to 30 inputs (about 512 KiB; a multiple of the micro-kernels' three,
 * so that only a call's last set ends in a pair or a single input).  Inputs then come from L3
 * once per group of blocks, not once per block: q8 4096 x 4096 x 512 inputs, one thread, Intel
 * Xeon (AMX VM), best of 5: 0.0169 -> 0.0146 ns per weight x input. */
#define TGEMM_MAX_BLOCKS 4
#define TGEMM_MAX_INPUTS 30
static int64_t tgemm_blocks(int64_t rs) {
    const int64_t b = (1 << 20) / (MPK_GEMM_ROWS * rs * (int64_t)sizeof(float));
    return b < 1 ? 1 : b > TGEMM_MAX_BLOCKS ? TGEMM_MAX_BLOCKS : b;
}
static int64_t tgemm_inputs(int64_t rs) {
    const int64_t n = (1 << 19) / (rs * (int64_t)sizeof(float)) / 3 * 3;
    return n < 3 ? 3 : n > TGEMM_MAX_INPUTS ? TGEMM_MAX_INPUTS : n;
}

/* qgemm_task's buffer: per block the codes [cols_p / 2][16][2] and the scales and minimums
 * [ng][16], then one block's rows as decoded [16][cols_p] and their scales and minimums
 * [16][ng]; each part 64-byte aligned */
static size_t qgemm_buffer_bytes(int64_t blocks, int64_t cols_p, int64_t ng) {
    const size_t wq = (size_t)(MPK_GEMM_ROWS * cols_p) * 2, sm = (size_t)(2 * MPK_GEMM_ROWS * ng) * 4;
    return (size_t)(blocks + 1) * (wq + sm) + 4 * 64;
}

uint64_t mpk_task_bytes(int64_t cols, int64_t group) {
    const uint64_t cols_p = (uint64_t)(group ? (cols + group - 1) / group * group : cols);
    const uint64_t ng = group ? cols_p / (uint64_t)group : 1, rs = (uint64_t)(cols + 7) / 8 * 8;
    /* tgemm_task's wb (aligned up to 64 bytes), qgemm_task's, mv_task's wb */
    const uint64_t tg = (((uint64_t)tgemm_blocks((int64_t)rs) * MPK_GEMM_ROWS * rs + rs + 2 * ng) * 4 + 63) / 64 * 64;
    const uint64_t ig = (qgemm_buffer_bytes(tgemm_blocks((int64_t)rs), (int64_t)cols_p, (int64_t)ng) + 63) / 64 * 64;
    const uint64_t mm = (uint64_t)MPK_MM_ROWS * (cols_p + 2 * ng) * 4;
    return tg > mm ? (tg > ig ? tg : ig) : (mm > ig ? mm : ig);
}

/* Blocks of 16 rows [b0, b1), tgemm_blocks at a time: each decoded once (zero past cols and past
 * the last row) into the vector-major layout gemm_rows streams, then multiplied with every input
 * set, all blocks of a group with one set before the next; one buffer per task (a few tasks per
 * thread), so that a call allocates a few groups' worth, not one per block. */
static void tgemm_task(void *ctx, size_t task) {
    tgemm_job *j = ctx;
    const mpk_mat *w = j->w;
    const int64_t nblocks = (w->rows + MPK_GEMM_ROWS - 1) / MPK_GEMM_ROWS;
    const int64_t b0 = (int64_t)task * j->per, b1 = b0 + j->per < nblocks ? b0 + j->per : nblocks;
    const int64_t rs = j->xs, nv = rs / 8, bs = MPK_GEMM_ROWS * rs; /* floats a block */
    const int64_t G = tgemm_blocks(rs), N = tgemm_inputs(rs);
    /* wb[block][v][16][8], then one row's values */
    const size_t bytes = (size_t)(G * bs + rs) * sizeof(float);
    float *wb = rs % 8 ? NULL : task_buffer(j->pool, bytes); /* aligned vector loads */
    if (!wb) {
        tgemm_rows_one_by_one(j, b0 * MPK_GEMM_ROWS, b1 * MPK_GEMM_ROWS < w->rows ? b1 * MPK_GEMM_ROWS : w->rows);
        return;
    }
    float *one = wb + G * bs;
    float acc[TGEMM_MAX_INPUTS * MPK_GEMM_ROWS * 8] __attribute__((aligned(64)));
    for (int64_t g0 = b0; g0 < b1; g0 += G) {
        const int64_t g1 = g0 + G < b1 ? g0 + G : b1;
        const int64_t r0 = g0 * MPK_GEMM_ROWS, r1 = g1 * MPK_GEMM_ROWS < w->rows ? g1 * MPK_GEMM_ROWS : w->rows;
        for (int64_t r = r0; r < g1 * MPK_GEMM_ROWS; r++) {
            if (r < r1) {
                j->k->row_values(w, r, one); /* cols values */
                memset(one + w->cols, 0, (size_t)(rs - w->cols) * sizeof(float));
            } else {
                memset(one, 0, (size_t)rs * sizeof(float));
            }
            float *blk = wb + (r - r0) / MPK_GEMM_ROWS * bs;
            for (int64_t v = 0; v < nv; v++)
                memcpy(blk + ((size_t)v * MPK_GEMM_ROWS + (size_t)(r % MPK_GEMM_ROWS)) * 8, one + v * 8, 8 * sizeof(float));
        }
        for (int64_t t0 = 0; t0 < j->n; t0 += N) {
            const int64_t n = j->n - t0 < N ? j->n - t0 : N;
            for (int64_t b = g0; b < g1; b++) {
                const int64_t q0 = b * MPK_GEMM_ROWS, q1 = q0 + MPK_GEMM_ROWS < r1 ? q0 + MPK_GEMM_ROWS : r1;
                j->k->gemm_rows(wb + (b - g0) * bs, nv, j->x + t0 * j->xs, j->xs, n, acc);
                for (int64_t t = 0; t < n; t++) /* input-outer, as gemm_task */
                    tgemm_put(j, t0 + t, q0, q1, acc + (size_t)t * MPK_GEMM_ROWS * 8);
            }
        }
    }
    task_buffer_done(j->pool, wb);
}

/* ---- the trunk's integer product (CODECS.md §2.4) ---- */

static size_t tq_bytes(const mpk_mat *w) {
    return mpk_tq_qbytes(w->cols_p) + ((size_t)w->ngroups * 8u + 63) / 64 * 64;
}

/* §2.4 step 1: x[cols] into out (tq_bytes, mpk_tq_steps' layout) */
static void tq_input(const mpk_mat *w, const float *x, uint8_t *out) {
    int16_t *q = (int16_t *)out;
    float *d = (float *)mpk_tq_steps(out, w->cols_p), *z = d + w->ngroups;
    const int64_t G = w->group;
    for (int64_t g = 0; g < w->ngroups; g++) {
        const int64_t c0 = g * G, c1 = c0 + G < w->cols ? c0 + G : w->cols;
        xq_group(x, c0, c1, 32767.0f, q, &d[g]);
        for (int64_t c = c1; c < c0 + G; c++) q[c] = 0;
        int32_t sum = 0;
        for (int64_t c = c0; c < c1; c++) sum += q[c];
        z[g] = (float)sum; /* |sum| <= 256 x 32767 < 2^24: exact */
    }
}

#define TQ_TASK_INPUTS 16
static void tq_task(void *ctx, size_t task) {
    const tgemm_job *j = ctx;
    const int64_t t0 = (int64_t)task * TQ_TASK_INPUTS, t1 = t0 + TQ_TASK_INPUTS < j->n ? t0 + TQ_TASK_INPUTS : j->n;
    for (int64_t t = t0; t < t1; t++) tq_input(j->w, j->x + t * j->w->cols, (uint8_t *)j->xq + (size_t)t * j->xqs);
}

/* rows [r0, r1) one at a time through the scalar kernel, the same numbers (no memory for the
 * blocked path) */
static void qgemm_rows_one_by_one(const tgemm_job *j, int64_t r0, int64_t r1) {
    const mpk_mat *w = j->w;
    const int64_t ng = w->ngroups;
    int16_t *wq = calloc((size_t)(MPK_GEMM_ROWS * w->cols_p), 2), *row = calloc((size_t)w->cols_p, 2);
    float *sc = calloc((size_t)((2 * MPK_GEMM_ROWS + 2) * ng), 4), *mn = sc + MPK_GEMM_ROWS * ng, *rs = mn + MPK_GEMM_ROWS * ng;
    float acc[MPK_GEMM_ROWS];
    for (int64_t r = r0; wq && row && sc && r < r1; r++) {
        s_row_ints(w, r, row);
        mpk_group_scales(w, r, rs, rs + ng);
        for (int64_t c = 0; c < w->cols_p; c++) wq[(c >> 1) * MPK_GEMM_ROWS * 2 + (c & 1)] = c < w->cols ? row[c] : 0;
        for (int64_t g = 0; g < ng; g++) sc[g * MPK_GEMM_ROWS] = rs[g], mn[g * MPK_GEMM_ROWS] = rs[ng + g];
        for (int64_t t = 0; t < j->n; t++) {
            mpk_scalar_impl.qgemm_rows(wq, sc, w->zero_point ? mn : NULL, ng, w->group, j->xq + (size_t)t * j->xqs,
                                       j->xqs, 1, acc);
            j->y[t * w->rows + r] = mpk_canon(acc[0]);
        }
    }
    if (!wq || !row || !sc) /* no memory at all: NaN rows, never numbers that were not computed */
        for (int64_t t = 0; t < j->n; t++)
            for (int64_t r = r0; r < r1; r++) j->y[t * w->rows + r] = mpk_bits_f32(0x7fc00000u);
    free(wq), free(row), free(sc);
}

static inline void *align_ptr64(void *p) { return (void *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

/* The 16 rows [16][cp] int16 as column pairs [cp / 2][16][2] (cp a multiple of 8) */
static void pairs_transpose(const int16_t *rows, int64_t cp, int16_t *out) {
#if defined(__SSE2__)
    for (int64_t p = 0; p < cp / 2; p += 4) /* 4 x 4 pairs a step, as a 4 x 4 float transpose */
        for (int i = 0; i < MPK_GEMM_ROWS; i += 4) {
            __m128 r0 = _mm_loadu_ps((const float *)(rows + i * cp + 2 * p));
            __m128 r1 = _mm_loadu_ps((const float *)(rows + (i + 1) * cp + 2 * p));
            __m128 r2 = _mm_loadu_ps((const float *)(rows + (i + 2) * cp + 2 * p));
            __m128 r3 = _mm_loadu_ps((const float *)(rows + (i + 3) * cp + 2 * p));
            _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
            _mm_storeu_ps((float *)(out + (p * MPK_GEMM_ROWS + i) * 2), r0);
            _mm_storeu_ps((float *)(out + ((p + 1) * MPK_GEMM_ROWS + i) * 2), r1);
            _mm_storeu_ps((float *)(out + ((p + 2) * MPK_GEMM_ROWS + i) * 2), r2);
            _mm_storeu_ps((float *)(out + ((p + 3) * MPK_GEMM_ROWS + i) * 2), r3);
        }
#else
    for (int64_t p = 0; p < cp / 2; p++)
        for (int i = 0; i < MPK_GEMM_ROWS; i++) memcpy(out + (p * MPK_GEMM_ROWS + i) * 2, rows + i * cp + 2 * p, 4);
#endif
}

/* tgemm_task for grouped matrices: blocks of 16 rows decoded once to their integer codes in
 * column pairs (and their scales), then multiplied with every input set, as tgemm_task */
static void qgemm_task(void *ctx, size_t task) {
    tgemm_job *j = ctx;
    const mpk_mat *w = j->w;
    const int64_t nblocks = (w->rows + MPK_GEMM_ROWS - 1) / MPK_GEMM_ROWS, ng = w->ngroups, cp = w->cols_p;
    const int64_t b0 = (int64_t)task * j->per, b1 = b0 + j->per < nblocks ? b0 + j->per : nblocks;
    const int64_t rs = (w->cols + 7) / 8 * 8, B = tgemm_blocks(rs), N = tgemm_inputs(rs);
    uint8_t *buf = task_buffer(j->pool, qgemm_buffer_bytes(B, cp, ng));
    if (!buf) {
        qgemm_rows_one_by_one(j, b0 * MPK_GEMM_ROWS, b1 * MPK_GEMM_ROWS < w->rows ? b1 * MPK_GEMM_ROWS : w->rows);
        return;
    }
    int16_t *wq = align_ptr64(buf); /* [B][cp / 2][16][2] */
    float *sc = align_ptr64(wq + B * MPK_GEMM_ROWS * cp), *mn = sc + B * MPK_GEMM_ROWS * ng; /* [B][ng][16] each */
    int16_t *rows = align_ptr64(mn + B * MPK_GEMM_ROWS * ng); /* [16][cp] */
    float *rsc = align_ptr64(rows + MPK_GEMM_ROWS * cp), *rmn = rsc + MPK_GEMM_ROWS * ng; /* [16][ng] each */
    float acc[TGEMM_MAX_INPUTS * MPK_GEMM_ROWS] __attribute__((aligned(64)));
    for (int64_t g0 = b0; g0 < b1; g0 += B) {
        const int64_t g1 = g0 + B < b1 ? g0 + B : b1;
        const int64_t r0 = g0 * MPK_GEMM_ROWS, r1 = g1 * MPK_GEMM_ROWS < w->rows ? g1 * MPK_GEMM_ROWS : w->rows;
        for (int64_t b = 0; b < g1 - g0; b++) { /* each block's rows decoded, then in column pairs */
            for (int64_t i = 0; i < MPK_GEMM_ROWS; i++) {
                const int64_t r = r0 + b * MPK_GEMM_ROWS + i;
                int16_t *row = rows + i * cp;
                if (r < r1) {
                    j->k->row_ints(w, r, row);
                    memset(row + w->cols, 0, (size_t)(cp - w->cols) * 2);
                    mpk_group_scales(w, r, rsc + i * ng, rmn + i * ng); /* minimums: zero point only */
                } else { /* past the last row: code 0, scale and minimum 0 */
                    memset(row, 0, (size_t)cp * 2);
                    memset(rsc + i * ng, 0, (size_t)ng * 4);
                    memset(rmn + i * ng, 0, (size_t)ng * 4);
                }
            }
            pairs_transpose(rows, cp, wq + b * MPK_GEMM_ROWS * cp);
            for (int64_t g = 0; g < ng; g++)
                for (int i = 0; i < MPK_GEMM_ROWS; i++) sc[(b * ng + g) * MPK_GEMM_ROWS + i] = rsc[i * ng + g];
            if (w->zero_point)
                for (int64_t g = 0; g < ng; g++)
                    for (int i = 0; i < MPK_GEMM_ROWS; i++) mn[(b * ng + g) * MPK_GEMM_ROWS + i] = rmn[i * ng + g];
        }
        for (int64_t t0 = 0; t0 < j->n; t0 += N) {
            const int64_t n = j->n - t0 < N ? j->n - t0 : N;
            for (int64_t b = g0; b < g1; b++) {
                const int64_t q0 = b * MPK_GEMM_ROWS, q1 = q0 + MPK_GEMM_ROWS < r1 ? q0 + MPK_GEMM_ROWS : r1;
                const int64_t o = (b - g0) * MPK_GEMM_ROWS * ng;
                j->k->qgemm_rows(wq + (b - g0) * MPK_GEMM_ROWS * cp, sc + o, w->zero_point ? mn + o : NULL, ng,
                                 w->group, j->xq + (size_t)t0 * j->xqs, j->xqs, n, acc);
                for (int64_t t = 0; t < n; t++) /* input-outer, as gemm_task */
                    for (int64_t r = q0; r < q1; r++)
                        j->y[(t0 + t) * w->rows + r] = mpk_canon(acc[t * MPK_GEMM_ROWS + (r - q0)]);
            }
        }
    }
    task_buffer_done(j->pool, buf);
}

/* §2.4 for one input (decode, the lm_head, routers of grouped codecs): the input rounded once,
 * then rows in stream_rows blocks, each read once as stored */
typedef struct {
    const mpk_impl *k;
    const mpk_mat *w;
    const uint8_t *xq;
    float *y;
    int64_t rows;
} qmv_job;

/* rows [r0, r1) of a grouped matrix times the rounded input xq: y[r - r0], NaNs canonical */
static void qdot_canon(const mpk_impl *k, const mpk_mat *w, int64_t r0, int64_t r1, const uint8_t *xq, float *y) {
    (k->qdot_rows ? k->qdot_rows : s_qdot_rows)(w, r0, r1, xq, y);
    for (int64_t i = 0; i < r1 - r0; i++) y[i] = mpk_canon(y[i]);
}

static void qmv_task(void *ctx, size_t t) {
    const qmv_job *j = ctx;
    const int64_t r0 = (int64_t)t * j->rows, r1 = r0 + j->rows < j->w->rows ? r0 + j->rows : j->w->rows;
    qdot_canon(j->k, j->w, r0, r1, j->xq, j->y + r0);
}

/* Rounded inputs up to this size stay on the stack: MLA's value rows take a call per head and
 * token, each with its own small input. */
#define QMV_STACK_BYTES 4096

/* rows [r0, r1) of a grouped matrix times x: all rows on the pool, a range on the calling thread */
static void qmatvec(const mpk_impl *k, mpk_pool *pool, const mpk_mat *w, int64_t r0, int64_t r1, const float *x,
                    float *y) {
    uint8_t small[QMV_STACK_BYTES] __attribute__((aligned(64)));
    const size_t nb = tq_bytes(w);
    uint8_t *xq = nb <= sizeof small ? small : mpk_pool_inputs(pool, nb);
    if (!xq) { /* no memory: NaN rows, never numbers that were not computed */
        for (int64_t r = r0; r < r1; r++) y[r - r0] = mpk_bits_f32(0x7fc00000u);
        return;
    }
    tq_input(w, x, xq);
    if (pool && r0 == 0 && r1 == w->rows) {
        qmv_job j = {k, w, xq, y, stream_rows(w, mpk_pool_threads(pool))};
        mpk_pool_run(w->rows * w->cols < 32768 ? NULL : pool, (size_t)((w->rows + j.rows - 1) / j.rows), qmv_task, &j);
    } else {
        qdot_canon(k, w, r0, r1, xq, y);
    }
    if (xq != small) mpk_pool_inputs_done(pool, xq);
}

void mpk_matvec_rows(const mpk_impl *k, const mpk_mat *w, int64_t r0, int64_t r1, const float *x, float *y) {
    k = impl_or_scalar(k);
    if (grouped(w)) {
        qmatvec(k, NULL, w, r0, r1, x, y);
        return;
    }
    for (int64_t r = r0; r < r1; r++) y[r - r0] = k->row_dot[w->codec](w, r, x);
}

void mpk_gemm(const mpk_impl *k, mpk_pool *pool, const mpk_mat *w, const float *x, int64_t n, float *y) {
    if (n < 1) return;
    if (n == 1 && grouped(w)) { /* the same bits without the column-pair panels */
        qmatvec(impl_or_scalar(k), pool, w, 0, w->rows, x, y);
        return;
    }
    const int64_t nblocks = (w->rows + MPK_GEMM_ROWS - 1) / MPK_GEMM_ROWS;
    const int64_t tasks = 4 * (int64_t)mpk_pool_threads(pool) < nblocks ? 4 * (int64_t)mpk_pool_threads(pool) : nblocks;
    tgemm_job j = {impl_or_scalar(k), w, x, w->cols, n, (nblocks + tasks - 1) / tasks, y, pool, NULL, 0};
    if (grouped(w)) {
        j.xqs = tq_bytes(w);
        uint8_t *xq = mpk_pool_inputs(pool, j.xqs * (size_t)n);
        const int64_t m = xq ? n : 1; /* no memory for all inputs: one at a time, the same bits */
        if (!xq) xq = mpk_pool_inputs(pool, j.xqs);
        for (int64_t t = 0; t < n; t += m) {
            tgemm_job jt = j;
            jt.x = x + t * w->cols, jt.n = n - t < m ? n - t : m, jt.y = y + t * w->rows, jt.xq = xq;
            if (!xq) { /* not even one input: NaN rows, never numbers that were not computed */
                for (int64_t i = 0; i < jt.n * w->rows; i++) jt.y[i] = mpk_bits_f32(0x7fc00000u);
                continue;
            }
            mpk_pool_run(jt.n * w->cols < 32768 ? NULL : pool, (size_t)((jt.n + TQ_TASK_INPUTS - 1) / TQ_TASK_INPUTS),
                         tq_task, &jt);
            mpk_pool_run(w->rows * w->cols * jt.n < 32768 ? NULL : pool, (size_t)((nblocks + j.per - 1) / j.per),
                         qgemm_task, &jt);
        }
        mpk_pool_inputs_done(pool, xq);
        return;
    }
    float *xp = NULL;
    const int64_t xs = (w->cols + 7) / 8 * 8;
    if (xs != w->cols && (xp = mpk_pool_inputs(pool, (size_t)(n * xs) * sizeof(float))) != NULL) { /* whole vectors */
        for (int64_t t = 0; t < n; t++) {
            memcpy(xp + t * xs, x + t * w->cols, (size_t)w->cols * sizeof(float));
            memset(xp + t * xs + w->cols, 0, (size_t)(xs - w->cols) * sizeof(float));
        }
        j.x = xp;
        j.xs = xs;
    } /* else (no memory): xs == cols % 8 != 0, the tasks go row by row */
    mpk_pool_run(w->rows * w->cols * n < 32768 ? NULL : pool, (size_t)((nblocks + j.per - 1) / j.per), tgemm_task, &j);
    mpk_pool_inputs_done(pool, xp);
}
