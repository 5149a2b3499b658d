/* Internal: the per-ISA kernel table (scalar in kernels.c, AVX2 in kernels_avx2.c, AVX-512 VBMI
 * in kernels_avx512.c) and the pieces of CODECS.md §3.5 they share. */
#ifndef MP_KERNELS_IMPL_H
#define MP_KERNELS_IMPL_H

#include <string.h>

#include "kernels.h"

/* Where row r's codes start in a grouped trunk matrix (spec/CODECS.md §2: f16 scales [rows][ngroups],
 * q4 zero-point minimums [rows][ngroups], then the codes of each padded row), and one q6 code. */
static inline const uint8_t *mpk_q8_row(const mpk_mat *w, int64_t r) {
    return w->data + (size_t)(w->rows * w->ngroups) * 2 + (size_t)(r * w->cols_p);
}
static inline const uint8_t *mpk_q6_row(const mpk_mat *w, int64_t r) {
    return w->data + (size_t)(w->rows * w->ngroups) * 2 + (size_t)(r * w->cols_p) / 4 * 3;
}
static inline const uint8_t *mpk_q4_row(const mpk_mat *w, int64_t r) {
    return w->data + (w->zero_point ? 2u : 1u) * (size_t)(w->rows * w->ngroups) * 2 + (size_t)(r * w->cols_p) / 2;
}
/* q6 code of column c: 4 codes per 3 bytes, u = b0 | b1<<8 | b2<<16 = k0 | k1<<6 | ... */
static inline int mpk_q6_code(const uint8_t *q, int64_t c) {
    const uint8_t *b = q + (c >> 2) * 3;
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16;
    return (int)((u >> ((c & 3) * 6)) & 63);
}

/* §2.4 step 2: the integer code of column c of a grouped row whose codes start at q (q8 the int8,
 * q6 the code minus 32, q4 the nibble, minus 8 when symmetric) */
static inline int mpk_int_code(const mpk_mat *w, const uint8_t *q, int64_t c) {
    if (w->codec == MP_CODEC_Q8) return (int8_t)q[c];
    if (w->codec == MP_CODEC_Q6) return mpk_q6_code(q, c) - 32;
    return ((q[c >> 1] >> ((c & 1) * 4)) & 15) - (w->zero_point ? 0 : 8);
}
static inline const uint8_t *mpk_grouped_row(const mpk_mat *w, int64_t r) {
    return w->codec == MP_CODEC_Q8 ? mpk_q8_row(w, r) : w->codec == MP_CODEC_Q6 ? mpk_q6_row(w, r) : mpk_q4_row(w, r);
}

/* Trunk kernels come per codec: tables indexed by mp_codec_kind (the trunk codecs are the kinds
 * below MP_CODEC_RVQ), so no kernel branches on the codec; adding a trunk codec is its entry in
 * codecs.c and one function per instruction set here. */
#define MPK_TRUNK_CODECS MP_CODEC_RVQ
typedef float (*mpk_row_dot_fn)(const mpk_mat *w, int64_t r, const float *x);
typedef void (*mpk_row_codes_fn)(const mpk_mat *w, int64_t r, float *out, float *sc, float *mn);

struct mpk_impl {
    const char *name;
    const mpk_row_dot_fn *row_dot; /* [MPK_TRUNK_CODECS]: dot(row r of w, x), the float codecs */
    /* y[r - r0] = row_dot(w, r, x) for r0 <= r < r1, several rows at once; NULL: row by row */
    void (*rows_dot)(const mpk_mat *w, int64_t r0, int64_t r1, const float *x, float *y);
    /* §3.5 steps 1-2 for group g, stage st: writes t->q of the group's vectors and t->d[g][st]
     * (NaN when the group's max |T| is NaN or +inf; the driver then sets t->nan). */
    void (*rvq_tables)(const float *cbt, const float *x, mpk_rvq_tab *t, int64_t g, int st);
    /* §3.5 steps 3-4 for tiles [tile0, tile0 + ntiles): acc[64 * ntiles] in row order, before
     * the row scale.  The SIMD paths run tile(-block)-outer, group-inner with a software
     * prefetch one group ahead (measured best with codes in RAM; tables then come from L2). */
    void (*rvq_tiles)(const mpk_rvq *w, const mpk_rvq_tab *t, int64_t tile0, int64_t ntiles,
                      float *acc);
    /* Rows [r0, r1) of a float-codec matrix times many inputs (routers over a prompt chunk),
     * exactly as row_dot computes each (y[t][r]): xt holds the inputs transposed in blocks of
     * MPK_MM_TB tokens [nb][cols][TB] (zero past n); wb is scratch for the rows' values
     * (mpk_mm_wb_floats).  NULL: the driver uses row_dot. */
    void (*mm_rows)(const mpk_mat *w, int64_t r0, int64_t r1, const float *xt, int64_t nb, int64_t n, float *y,
                    float *wb);
    /* The prefill product (CODECS.md §3.6) of the MPK_GEMM_ROWS rows from r0 (a multiple of
     * MPK_GEMM_ROWS: inside one code tile) with the quantised inputs xq + t * xqs for
     * t < n <= MPK_GEMM_INPUTS: writes each (input, row)'s accumulator a (step 4, before the row
     * scale), acc[t][row]. */
    void (*rvq_gemm)(const mpk_rvq *w, const mpk_rvq_icb *cb, const uint8_t *xq, size_t xqs, int64_t n,
                     int64_t r0, float *acc);
    /* NULL, or the same product from inputs in a layout of its own, for calls of at least
     * rvq_gemm_tiles_min inputs: rvq_gemm_xbytes(cols) bytes an input, in blocks of 16 (inputs
     * past n zero), which mpk_rvq_gemm fills once a call with rvq_gemm_xprep from mpk_rvq_xq's
     * layout (xqs then that size), so that every row block shares it. */
    void (*rvq_gemm_tiles)(const mpk_rvq *w, const mpk_rvq_icb *cb, const uint8_t *xb, size_t xbs, int64_t n,
                           int64_t r0, float *acc);
    size_t (*rvq_gemm_xbytes)(int64_t cols);
    void (*rvq_gemm_xprep)(const uint8_t *xq, size_t xqs, int64_t cols, int64_t n, uint8_t *out);
    int rvq_gemm_tiles_min;
    /* Row r of a float-codec matrix as its values, mpk_row's bits. */
    void (*row_values)(const mpk_mat *w, int64_t r, float *out);
    /* The trunk's prefill product (mpk_gemm) of MPK_GEMM_ROWS decoded rows, vector-major
     * (wb[v][row][8], nv vectors: the layout the micro-kernels stream), with inputs x[t * xs ...]
     * for t < n <= MPK_GEMM_INPUTS: acc[t][row][8]. */
    void (*gemm_rows)(const float *wb, int64_t nv, const float *x, int64_t xs, int64_t n, float *acc);
    /* The trunk's integer prefill product (CODECS.md §2.4 steps 2-4) of MPK_GEMM_ROWS rows: wq their
     * integer codes in column pairs [cols_p / 2][row][2], sc their group scales [ng][row] and mn
     * (q4 with a zero point, else NULL) their minimums [ng][row], groups of `group` columns; the
     * inputs at xq + t * xqs (mpk_tq_steps' layout) for t < n <= MPK_GEMM_INPUTS: acc[t][row]. */
    void (*qgemm_rows)(const int16_t *wq, const float *sc, const float *mn, int64_t ng, int64_t group,
                       const uint8_t *xq, size_t xqs, int64_t n, float *acc);
    /* Row r of a grouped matrix as the integer codes qgemm_rows multiplies, out[cols] (q8 the int8,
     * q6 the code minus 32, q4 the nibble, minus 8 when symmetric) */
    void (*row_ints)(const mpk_mat *w, int64_t r, int16_t *out);
    /* §2.4 steps 2-4 for one input: rows [r0, r1) of a grouped matrix read as stored, the input at
     * xq (mpk_tq_steps' layout): y[r - r0], NaNs not yet canonical.  The one-input product
     * (decode), where the prefill kernels' column-pair panels cost more than they save. */
    void (*qdot_rows)(const mpk_mat *w, int64_t r0, int64_t r1, const uint8_t *xq, float *y);
};

extern const mpk_impl mpk_scalar_impl;
extern const mpk_impl mpk_avx2_impl;
extern const mpk_impl mpk_avx512_impl;
extern const mpk_impl mpk_avx512amx_impl;
/* kernels_amx.c: the prefill product on AMX-INT8 tiles, and whether this CPU, OS and process can
 * run it */
size_t mpk_amx_xbytes(int64_t cols);
void mpk_amx_xprep(const uint8_t *xq, size_t xqs, int64_t cols, int64_t n, uint8_t *out);
void mpk_amx_rvq_gemm(const mpk_rvq *w, const mpk_rvq_icb *cb, const uint8_t *xb, size_t xbs, int64_t n,
                      int64_t r0, float *acc);
int mpk_amx_usable(void);
/* kernels_amx.c's input layout: bytes an input per 512-column group (8 steps x 2 byte planes x 64
 * columns, and the group's step) */
#define MPK_AMX_GROUP_BYTES 1028

float mpk_red8(const float l[8]);

#define MPK_MM_TB 8     /* inputs per SIMD block of the multi-input trunk kernel (one per lane) */
#define MPK_MM_ROWS 16  /* rows per task: decoded once, used by every input block */
/* Floats of mm_rows scratch for MPK_MM_ROWS rows of w: their values [rows][cols_p]. */
size_t mpk_mm_wb_floats(const mpk_mat *w);
/* Row r of w as its stored numbers: out[cols] = the int8/6/4-bit code as a float (q4 symmetric
 * minus 8) or the f16/bf16/f32 value converted, sc[ngroups] the group scales, mn[ngroups] the q4
 * zero-point minimums (grouped codecs only; mpk_row applies them). */
void mpk_row_codes(const mpk_mat *w, int64_t r, float *out, float *sc, float *mn);
/* The group scales (and q4 zero-point minimums, when mn is not NULL) of row r; nothing when sc is
 * NULL. */
void mpk_group_scales(const mpk_mat *w, int64_t r, float *sc, float *mn);
/* AVX2 trunk kernels, shared with the AVX-512 table. */
extern const mpk_row_dot_fn mpk_avx2_row_dots[MPK_TRUNK_CODECS];
/* mpk_row_ints for columns [c0, cols): the scalar path and the SIMD tails */
void mpk_row_ints_from(const mpk_mat *w, int64_t r, int64_t c0, int16_t *out);
void mpk_avx2_row_ints(const mpk_mat *w, int64_t r, int16_t *out);
void mpk_avx2_qdot_rows(const mpk_mat *w, int64_t r0, int64_t r1, const uint8_t *xq, float *y);
void mpk_avx2_rows_dot(const mpk_mat *w, int64_t r0, int64_t r1, const float *x, float *y);
void mpk_avx2_mm_rows(const mpk_mat *w, int64_t r0, int64_t r1, const float *xt, int64_t nb, int64_t n, float *y,
                      float *wb);
void mpk_avx512vl_mm_rows(const mpk_mat *w, int64_t r0, int64_t r1, const float *xt, int64_t nb, int64_t n, float *y,
                          float *wb);

/* mpk_dot / mpk_axpy 8-wide (the same bits; x86 only) */
float mpk_avx2_dot(const float *a, const float *b, int64_t n);
/* X(K) with K a compile-time constant equal to n, for n in 1..8 (kernels specialised on a small
 * count: heads of an attention group, rows of a block) */
#define MPK_SWITCH8(n, X)                                                                       \
    switch (n) {                                                                                \
    case 8: X(8) break;                                                                         \
    case 7: X(7) break;                                                                         \
    case 6: X(6) break;                                                                         \
    case 5: X(5) break;                                                                         \
    case 4: X(4) break;                                                                         \
    case 3: X(3) break;                                                                         \
    case 2: X(2) break;                                                                         \
    default: X(1) break;                                                                        \
    }
void mpk_avx2_dots(const float *x, const float *rows, int64_t stride, int nr, int64_t n, float *out);
void mpk_avx2_dots_f16(const void *x, const float *rows, int64_t stride, int nr, int64_t n, float *out);
/* wide: the CPU has AVX-512VL (its 32 registers: two keys a step) */
void mpk_avx2_dots_keys(const void *x, size_t xs, int nk, int f16, const float *rows, int64_t stride, int nr,
                        int64_t n, float *out, int64_t os, int wide);
void mpk_avx2_axpy(float *y, float a, const float *x, int64_t n);
void mpk_avx2_wsum(float *out, int64_t os, int nh, const float *w, int64_t ws, const void *rows, size_t rs, int f16,
                   int64_t nt, int64_t n);
void mpk_avx512_wsum(float *out, int64_t os, int nh, const float *w, int64_t ws, const void *rows, size_t rs,
                     int f16, int64_t nt, int64_t n);
/* mpk_softmax's e^x (kernels.h), one lane of it: x = n ln2 + r with n = rint(x log2 e) and r
 * from Cody-Waite's two-part ln2, e^r by Cephes' degree-6 polynomial, then p 2^n as two exact
 * power-of-two products and one rounding (n below -126: into the subnormals).  Binary32 multiply
 * and add only, no FMA, so the eight-wide parts (kernels_avx2.c's exp8) give these bits. */
#define MPK_EXP_LO -104.0f     /* e^x below 2^-150: rounds to +0 */
#define MPK_EXP_HI 88.7228394f /* e^x above FLT_MAX: +inf */
#define MPK_EXP_LOG2E 1.44269504088896341f
#define MPK_EXP_C1 0.693359375f /* ln2's high part: n C1 exact for |n| <= 2^14 */
#define MPK_EXP_C2 -2.12194440e-4f
#define MPK_EXP_P0 1.9875691500e-4f
#define MPK_EXP_P1 1.3981999507e-3f
#define MPK_EXP_P2 8.3334519073e-3f
#define MPK_EXP_P3 4.1665795894e-2f
#define MPK_EXP_P4 1.6666665459e-1f
#define MPK_EXP_P5 5.0000001201e-1f
static inline float mpk_pow2i(int e) { /* 2^e, -126 <= e <= 127 */
    uint32_t b = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &b, 4);
    return f;
}
static inline float mpk_exp(float x) {
    if (x != x) return x;
    if (x < MPK_EXP_LO) return 0.0f;
    if (x > MPK_EXP_HI) return __builtin_inff();
    const float n = (x * MPK_EXP_LOG2E + 0x1.8p23f) - 0x1.8p23f; /* to nearest even */
    const float r = (x - n * MPK_EXP_C1) - n * MPK_EXP_C2;
    float y = MPK_EXP_P0 * r + MPK_EXP_P1;
    y = y * r + MPK_EXP_P2;
    y = y * r + MPK_EXP_P3;
    y = y * r + MPK_EXP_P4;
    y = y * r + MPK_EXP_P5;
    y = (y * (r * r) + r) + 1.0f;
    const int ni = (int)n, na = ni < -126 ? -126 : ni > 127 ? 127 : ni; /* ni - na in -24 .. 1 */
    return (y * mpk_pow2i(ni - na)) * mpk_pow2i(na);
}
/* The eight-wide parts of xq_group, mpk_softmax and mpk_swiglu (kernels.c): each handles the
 * leading whole vectors of its array and returns how many elements it took. */
int64_t mpk_avx2_absmax_bits(const float *x, int64_t n, uint32_t *mb); /* *mb = max(*mb, those) */
int64_t mpk_avx2_round_i16(const float *x, int64_t n, float inv, int16_t *q);
int64_t mpk_avx2_max(const float *x, int64_t n, float *m); /* n >= 8 */
int64_t mpk_avx2_softmax_exp(float *x, int64_t n, float m, double l[8]);
int64_t mpk_avx2_scale(float *x, int64_t n, float a);
int64_t mpk_avx2_swiglu(float *g, const float *u, int64_t n);
/* mpk_wsum's scalar definition for columns [c0, n): the scalar path and the SIMD tails */
void mpk_wsum_cols(float *out, int64_t os, int nh, const float *w, int64_t ws, const void *rows, size_t rs,
                   int f16, int64_t nt, int64_t c0, int64_t n);

#define MPK_TRUNK_PF 4096 /* bytes ahead of a trunk row's codes the decode products prefetch */
#define MPK_GEMM_ROWS 16   /* rows per rvq_gemm call: decoded once for all its inputs */
/* Inputs per rvq_gemm call (its sums live on the caller's stack, 16 KiB): the rows are decoded
 * once per call, so an expert with more tokens decodes again per 256 (at 64 a call, 128 tokens
 * cost 0.0054 ns a weight x token on AMX, 0.0041-0.0043 at 256; Intel Xeon, 2026-12-05). */
#define MPK_GEMM_INPUTS 256
void mpk_avx2_rvq_gemm(const mpk_rvq *w, const mpk_rvq_icb *cb, const uint8_t *xq, size_t xqs, int64_t n,
                       int64_t r0, float *acc);
/* An input of the trunk's integer product (§2.4 step 1), as mpk_gemm and mpk_matvec round it: int16
 * q[cols_p] (zero past cols), from the next 64-byte boundary f32 d[ng] (the group steps), then f32
 * z[ng] (each group's sum of q, an exact integer: q4's zero-point term, and the one-input kernels
 * take the q6 and symmetric q4 code offsets off with it once per group). */
static inline size_t mpk_tq_qbytes(int64_t cols_p) { return (2 * (size_t)cols_p + 63) / 64 * 64; }
static inline const float *mpk_tq_steps(const uint8_t *xq, int64_t cols_p) {
    return (const float *)(xq + mpk_tq_qbytes(cols_p));
}
/* The trunk integer product kernels' inputs 0 .. nt - 1 at xq + t * xqs: their integers (q) and
 * group steps (d) */
static inline void mpk_tq_inputs(const uint8_t *xq, size_t xqs, int64_t cols_p, int nt, const int16_t **q,
                                 const float **d) {
    for (int t = 0; t < nt; t++) {
        q[t] = (const int16_t *)(xq + (size_t)t * xqs);
        d[t] = mpk_tq_steps(xq + (size_t)t * xqs, cols_p);
    }
}
/* the quantised input's group steps (d, after q) */
static inline const float *mpk_rvq_xq_steps(const uint8_t *xq, int64_t cols) {
    return (const float *)(xq + 2 * (size_t)((cols + 15) / 16 * 16));
}
/* The SIMD prefill drivers' inputs t .. t + nt - 1 at panel v0 (group g): where their quantised
 * columns start (xp) and their group steps (dg). */
static inline void mpk_rvq_gemm_inputs(const uint8_t *xq, size_t xqs, int64_t cols, int64_t t, int nt, int64_t v0,
                                       int64_t g, const int16_t **xp, float *dg) {
    for (int u = 0; u < nt; u++) {
        const uint8_t *x = xq + (size_t)(t + u) * xqs;
        xp[u] = (const int16_t *)x + v0 * 8;
        dg[u] = mpk_rvq_xq_steps(x, cols)[g];
    }
}
#if defined(__SSE2__)
#include <emmintrin.h>
/* Byte b of w times 16 (a codebook entry's offset): a rotate putting it at bits 4..11 (one BMI2
 * rorx where the caller's target has BMI2) and a mask. */
static inline size_t mpk_code_x16(uint64_t w, int b) {
    const int sh = (8 * b + 60) % 64; /* never 0 */
    return (size_t)((w >> sh | w << (64 - sh)) & 0xff0u);
}
/* §3.6's decoded weights of one panel of the SIMD prefill drivers: for each of its kp vectors
 * (codes c, S stages) the MPK_GEMM_ROWS rows' stage entries summed (exact in any order), stored
 * wb[block][row][8 * per] with per vectors a block (2: one 256-bit register, 4: one 512-bit),
 * zeros from the last vector to the end of its block. */
/* One vector's codes of the 16 rows (c: S stages of 64 lanes): each stage's 16 codes as two
 * 8-byte words, a code's entry offset then taken by a rotate and a mask instead of a byte load each
 * (the loads bounded the decode); the codes come from RAM, so their lines 8 vectors ahead are
 * prefetched. */
static inline __attribute__((always_inline)) void mpk_rvq_vector_codes(const uint8_t *c, int S,
                                                                       uint64_t (*cw)[2]) {
    for (int st = 0; st < S; st++) _mm_prefetch((const char *)(c + (size_t)(8 * S + st) * 64), _MM_HINT_T0);
    memcpy(cw[0], c, 16); /* S >= 1, which GCC cannot see */
#pragma GCC unroll 8
    for (int st = 1; st < S; st++) memcpy(cw[st], c + st * 64, 16);
}
/* row i's decoded vector: its S stage entries summed (exact) */
static inline __attribute__((always_inline)) __m128i mpk_rvq_row_sum(const uint64_t (*cw)[2], const mpk_rvq_icb *cb,
                                                                     int S, int i) {
    __m128i sum = _mm_loadu_si128((const __m128i *)((const char *)cb->q[0] + mpk_code_x16(cw[0][i >> 3], i & 7)));
#pragma GCC unroll 8
    for (int st = 1; st < S; st++)
        sum = _mm_add_epi16(sum, _mm_loadu_si128((const __m128i *)((const char *)cb->q[st] +
                                                                   mpk_code_x16(cw[st][i >> 3], i & 7))));
    return sum;
}
static inline __attribute__((always_inline)) void mpk_rvq_decode_rows(const uint8_t *c, const mpk_rvq_icb *cb,
                                                                      int64_t kp, int S, const int per, int16_t *wb) {
    for (int64_t v = 0; v < kp; v++, c += (size_t)S * 64) {
        uint64_t cw[MPK_RVQ_MAX_STAGES][2];
        mpk_rvq_vector_codes(c, S, cw);
#pragma GCC unroll 16 /* the rows unrolled: constant code offsets, no loop counter (+20-25 %) */
        for (int i = 0; i < MPK_GEMM_ROWS; i++)
            _mm_store_si128((__m128i *)(wb + ((size_t)(v / per) * MPK_GEMM_ROWS + (size_t)i) * 8 * per + (v % per) * 8),
                            mpk_rvq_row_sum((const uint64_t (*)[2])cw, cb, S, i));
    }
    for (int64_t v = kp; v % per; v++)
        for (int i = 0; i < MPK_GEMM_ROWS; i++)
            _mm_store_si128((__m128i *)(wb + ((size_t)(v / per) * MPK_GEMM_ROWS + (size_t)i) * 8 * per + (v % per) * 8),
                            _mm_setzero_si128());
}
/* the same with the common stage counts unrolled (GCC does not unroll a runtime trip count) */
static inline __attribute__((always_inline)) void mpk_rvq_decode_panel(const uint8_t *c, const mpk_rvq_icb *cb,
                                                                       int64_t kp, int S, const int per, int16_t *wb) {
    switch (S) {
    case 2: mpk_rvq_decode_rows(c, cb, kp, 2, per, wb); break;
    case 3: mpk_rvq_decode_rows(c, cb, kp, 3, per, wb); break;
    case 4: mpk_rvq_decode_rows(c, cb, kp, 4, per, wb); break;
    default: mpk_rvq_decode_rows(c, cb, kp, S, per, wb);
    }
}
#endif
void mpk_avx2_row_values(const mpk_mat *w, int64_t r, float *out);
void mpk_avx2_gemm_rows(const float *wb, int64_t nv, const float *x, int64_t xs, int64_t n, float *acc);


/* The most tiles one rvq_tiles call gets (its accumulator lives on the caller's stack). */
#define MPK_RVQ_MAX_TILES 16
#define MPK_RVQ_TINY 0x1p-96f /* below this a group's tables are all zero (§3.5 step 2) */

/* Largest |T| as bits: for |T| bit patterns, integer order is float order and NaNs sort above
 * +inf, so one unsigned max gives m, NaN included, on every path. */
static inline uint32_t mpk_absbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u & 0x7fffffffu;
}
static inline float mpk_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* The canonical quiet NaN for every NaN result, so that every path and libm give the same bits */
static inline float mpk_canon(float v) { return v == v ? v : mpk_bits_f32(0x7fc00000u); }
/* A group's rounding to integers in -qmax .. qmax (§3.5 step 2: tables, qmax 127; §3.6 step 2:
 * activations, qmax 2047): returns 0 when q must be all zero (d set to 0, or to NaN when m is NaN
 * or +inf), else 1 with inv = qmax / m and d = m / qmax. */
static inline int mpk_rvq_scale(uint32_t mbits, float qmax, float *inv, float *d) {
    if (mbits >= 0x7f800000u) {
        *d = mpk_bits_f32(0x7fc00000u);
        return 0;
    }
    float m = mpk_bits_f32(mbits);
    if (m < MPK_RVQ_TINY) {
        *d = 0.0f;
        return 0;
    }
    *inv = qmax / m;
    *d = m / qmax;
    return 1;
}

#endif
