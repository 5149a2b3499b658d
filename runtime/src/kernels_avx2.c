/* AVX2 kernels.  Trunk: same lane layout and operation order as the scalar code in kernels.c
 * (multiply then add, lanes = element index mod 8, red8 reduction), so results are
 * bit-identical to it; the speed comes from 8-wide loads and int8/nibble widening.  Routed
 * experts: CODECS.md §3.5 with the scalar path's roundings (FMA chain, int8 tables, exact integer
 * sums, fma combine); 256-entry int8 tables are looked up with vpshufb over 16-entry sub-tables,
 * bit 7 by vpshufb's zeroing and a vpblendvb tree on code bits 4-6 (measured faster than 8-lane
 * gathers on Zen 4). */
#include "kernels_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c,bmi2")))

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

AVX2 static __m256 f16x8(const uint8_t *p) {
    /* F16C conversion is exact, like mpk_f16_to_f32 (every AVX2 CPU has F16C; checked at init) */
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

AVX2 static float hred(__m256 v) {
    float l[8];
    _mm256_storeu_ps(l, v);
    return mpk_red8(l);
}

/* Accumulates lanes of elements [c0, c1) (relative lane = (c - c0) & 7) of a float row. */
AVX2 static __m256 lanes_f32(const float *row, const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= n; c += 8)
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(row + c), _mm256_loadu_ps(x + c)));
    if (c < n) {
        float l[8];
        _mm256_storeu_ps(l, acc);
        for (; c < n; c++) l[c & 7] += row[c] * x[c];
        acc = _mm256_loadu_ps(l);
    }
    return acc;
}

/* Eight codes of a grouped codec from column c (a multiple of 8) as int32 (what row_ints stores): q8 the int8, q6 the
 * 6-bit code minus 32, q4 the nibble (minus 8 when symmetric). */
AVX2 static inline __attribute__((always_inline)) __m256i codes8i(const uint8_t *q, int64_t c, const int codec,
                                                                   __m256i off4) {
    if (codec == MP_CODEC_Q8) return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + c)));
    if (codec == MP_CODEC_Q6) { /* 8 codes = 6 bytes = two 24-bit words k0|k1<<6|k2<<12|k3<<18 */
        uint32_t lo; /* bytes 0..3 and 4..5 (not one 8-byte load: the tensor may end) */
        uint16_t hi;
        memcpy(&lo, q + (c >> 2) * 3, 4);
        memcpy(&hi, q + (c >> 2) * 3 + 4, 2);
        uint64_t v = lo | (uint64_t)hi << 32;
        uint64_t words = (v & 0xffffffu) | (v >> 24) << 32;
        __m256i u = _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(_mm_cvtsi64_si128((long long)words)),
                                                _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
        __m256i k = _mm256_and_si256(_mm256_srlv_epi32(u, _mm256_setr_epi32(0, 6, 12, 18, 0, 6, 12, 18)),
                                     _mm256_set1_epi32(63));
        return _mm256_sub_epi32(k, _mm256_set1_epi32(32));
    }
    int32_t b4; /* q4: nibbles, low nibble = even column: column c + i is bits 4i.. of the word */
    memcpy(&b4, q + (c >> 1), 4);
    __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b4), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                   _mm256_set1_epi32(15));
    return _mm256_sub_epi32(nib, off4);
}

/* q6 codes c..c+7 (c a multiple of 8) from one 16-byte load at byte (c / 4) * 3, which the
 * caller checks lies inside the matrix: each lane takes the two bytes its 6 bits start in. */
AVX2 static inline __attribute__((always_inline)) __m256i q6_codes8i_wide(const uint8_t *q, int64_t c) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q + (c >> 2) * 3)));
    const __m256i pick = _mm256_setr_epi8(0, 1, -1, -1, 0, 1, -1, -1, 1, 2, -1, -1, 2, 3, -1, -1,
                                          3, 4, -1, -1, 3, 4, -1, -1, 4, 5, -1, -1, 5, -1, -1, -1);
    const __m256i k = _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(b, pick),
                                                         _mm256_setr_epi32(0, 6, 4, 2, 0, 6, 4, 2)),
                                       _mm256_set1_epi32(63));
    return _mm256_sub_epi32(k, _mm256_set1_epi32(32));
}

/* Columns of row r from which q6_codes8i_wide's 16-byte load stays inside the matrix: it may be
 * used at every multiple-of-8 column c below this. */
static inline int64_t q6_wide_cols(const mpk_mat *w, int64_t r) {
    const int64_t left = (w->rows - r) * (w->cols_p / 4 * 3); /* code bytes from row r to the end */
    return left < 16 ? 0 : ((left - 16) / 3 + 1) * 4;
}

/* red8 of eight lane vectors at once: lane g is red8(L[g]) in red8's exact order (hadd adds
 * adjacent lanes twice, the last add joins the 128-bit halves). */
AVX2 static inline __m256 red8x8(const __m256 L[8]) {
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(L[0], L[1]), _mm256_hadd_ps(L[2], L[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(L[4], L[5]), _mm256_hadd_ps(L[6], L[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

AVX2 static float a_dot_f32(const mpk_mat *w, int64_t r, const float *x) {
    return hred(lanes_f32((const float *)w->data + r * w->cols, x, w->cols));
}

AVX2 static float a_dot_bf16(const mpk_mat *w, int64_t r, const float *x) {
    const int64_t n = w->cols;
    const uint16_t *row = (const uint16_t *)(w->data) + r * n; /* 2-aligned: tensor offsets are 64-aligned */
    __m256 acc = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(row + c));
        __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(v, _mm256_loadu_ps(x + c)));
    }
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (; c < n; c++) l[c & 7] += mpk_bf16_to_f32(row[c]) * x[c];
    return mpk_red8(l);
}

AVX2 static float a_dot_f16(const mpk_mat *w, int64_t r, const float *x) {
    const int64_t n = w->cols;
    const uint8_t *row = w->data + (size_t)(r * n) * 2;
    __m256 acc = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= n; c += 8)
        acc = _mm256_add_ps(acc, _mm256_mul_ps(f16x8(row + 2 * c), _mm256_loadu_ps(x + c)));
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (; c < n; c++) l[c & 7] += mpk_f16_to_f32(ld16(row + 2 * c)) * x[c];
    return mpk_red8(l);
}

/* Rows [r0, r1) of an f32 matrix (columns a multiple of 8) eight at a time: a_dot_f32's lanes
 * per row (lane j sums columns j mod 8 in order, multiply then add) and red8x8 for red8, so each
 * row's bits are row_dot's; one row's single chain of cols / 8 dependent adds bound it.
 * f16, bf16: row by row. */
AVX2 void mpk_avx2_rows_dot(const mpk_mat *w, int64_t r0, int64_t r1, const float *x, float *y) {
    const int64_t n = w->cols;
    int64_t r = r0;
    if (w->codec == MP_CODEC_F32 && n % 8 == 0)
        for (; r + 8 <= r1; r += 8) {
            const float *row = (const float *)w->data + r * n;
            __m256 L[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) L[k] = _mm256_setzero_ps();
            for (int64_t c = 0; c < n; c += 8) {
                const __m256 xv = _mm256_loadu_ps(x + c);
#pragma GCC unroll 8
                for (int k = 0; k < 8; k++) {
                    if (!(c & 15)) _mm_prefetch((const char *)(row + k * n + c) + MPK_TRUNK_PF, _MM_HINT_T0);
                    L[k] = _mm256_add_ps(L[k], _mm256_mul_ps(_mm256_loadu_ps(row + k * n + c), xv));
                }
            }
            _mm256_storeu_ps(y + (r - r0), red8x8(L));
        }
    for (; r < r1; r++) y[r - r0] = mpk_avx2_row_dots[w->codec](w, r, x);
}

/* also the AVX-512 table's (the float codecs: the grouped ones take §2.4's qdot_rows) */
const mpk_row_dot_fn mpk_avx2_row_dots[MPK_TRUNK_CODECS] = {
    [MP_CODEC_F32] = a_dot_f32, [MP_CODEC_F16] = a_dot_f16, [MP_CODEC_BF16] = a_dot_bf16};

/* Rows [r0, r1) of a float matrix times many inputs: one input per lane.  Per input this is
 * exactly row_dot's arithmetic (lane j sums elements j mod 8 with separate multiply and add, the
 * lanes reduced in red8's order), done for 8 inputs at once on inputs stored transposed, with each
 * row's values decoded once per task.
 *
 * The products of RB rows (RB = 1 or 2) with one block of 8 inputs: two rows share each input
 * load; with AVX-512VL's 32 vector registers their 16 accumulators stay in registers. */
AVX2 static inline __attribute__((always_inline)) void mm_block(int64_t C, const float *wr0, const float *X, int64_t cp,
                                                                 const int RB, __m256 acc[2]) {
    __m256 L[2][8];
#pragma GCC unroll 2
    for (int k = 0; k < RB; k++)
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) L[k][i] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= C; c += 8) /* lane i: elements i mod 8 */
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m256 xv = _mm256_loadu_ps(X + (c + i) * 8);
#pragma GCC unroll 2
            for (int k = 0; k < RB; k++)
                L[k][i] = _mm256_add_ps(L[k][i], _mm256_mul_ps(_mm256_broadcast_ss(wr0 + k * cp + c + i), xv));
        }
    for (; c < C; c++)
#pragma GCC unroll 2
        for (int k = 0; k < RB; k++)
            L[k][c & 7] = _mm256_add_ps(L[k][c & 7], _mm256_mul_ps(_mm256_broadcast_ss(wr0 + k * cp + c), _mm256_loadu_ps(X + c * 8)));
#pragma GCC unroll 2
    for (int k = 0; k < RB; k++) /* red8: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) */
        acc[k] = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(L[k][0], L[k][1]), _mm256_add_ps(L[k][2], L[k][3])),
                               _mm256_add_ps(_mm256_add_ps(L[k][4], L[k][5]), _mm256_add_ps(L[k][6], L[k][7])));
}

/* Row r's values as row_dot converts them, 8 columns per instruction for f16 and bf16 */
AVX2 static void a_codes_f16(const mpk_mat *w, int64_t r, float *o, float *sc, float *mn) {
    (void)sc, (void)mn;
    const int64_t C = w->cols;
    const uint8_t *row = w->data + (size_t)(r * C) * 2;
    int64_t c = 0;
    for (; c + 8 <= C; c += 8) _mm256_storeu_ps(o + c, f16x8(row + 2 * c)); /* as row_dot converts */
    for (; c < C; c++) o[c] = mpk_f16_to_f32(ld16(row + 2 * c));
}

AVX2 static void a_codes_bf16(const mpk_mat *w, int64_t r, float *o, float *sc, float *mn) {
    (void)sc, (void)mn;
    const int64_t C = w->cols;
    const uint8_t *row = w->data + (size_t)(r * C) * 2;
    int64_t c = 0;
    for (; c + 8 <= C; c += 8)
        _mm256_storeu_ps(o + c, _mm256_castsi256_ps(_mm256_slli_epi32(
                                    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * c))), 16)));
    for (; c < C; c++) o[c] = mpk_bf16_to_f32(ld16(row + 2 * c));
}

static const mpk_row_codes_fn a_row_codes[MPK_TRUNK_CODECS] = {
    [MP_CODEC_F32] = mpk_row_codes, [MP_CODEC_F16] = a_codes_f16, [MP_CODEC_BF16] = a_codes_bf16};

/* Row r's integer codes (the trunk's integer prefill product, CODECS.md §2.4) 8 columns at a
 * time, as int16; the tails in scalar */
AVX2 static void st8_i16(int16_t *o, __m256i v) {
    _mm_storeu_si128((__m128i *)o, _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}
AVX2 void mpk_avx2_row_ints(const mpk_mat *w, int64_t r, int16_t *out) {
    const int64_t C = w->cols;
    int64_t c = 0;
    if (w->codec == MP_CODEC_Q8) {
        const uint8_t *q = mpk_q8_row(w, r);
        for (; c + 8 <= C; c += 8) st8_i16(out + c, codes8i(q, c, MP_CODEC_Q8, _mm256_setzero_si256()));
    } else if (w->codec == MP_CODEC_Q6) {
        const uint8_t *q = mpk_q6_row(w, r);
        const int64_t wide_end = q6_wide_cols(w, r);
        for (; c + 8 <= C && c < wide_end; c += 8) st8_i16(out + c, q6_codes8i_wide(q, c));
    } else if (w->codec == MP_CODEC_Q4) {
        const uint8_t *q = mpk_q4_row(w, r);
        const __m256i off = _mm256_set1_epi32(w->zero_point ? 0 : 8);
        for (; c + 8 <= C; c += 8) st8_i16(out + c, codes8i(q, c, MP_CODEC_Q4, off));
    }
    mpk_row_ints_from(w, r, c, out);
}

/* mpk_row's values 8-wide (the float codecs) */
AVX2 void mpk_avx2_row_values(const mpk_mat *w, int64_t r, float *out) { a_row_codes[w->codec](w, r, out, NULL, NULL); }

AVX2 static inline __attribute__((always_inline)) void mm_rows_body(const mpk_mat *w, int64_t r0, int64_t r1,
                                                                     const float *xt, int64_t nb, int64_t n, float *y,
                                                                     float *wb) {
    const int64_t C = w->cols, cp = w->cols_p;
    for (int64_t r = r0; r < r1; r++) a_row_codes[w->codec](w, r, wb + (size_t)((r - r0) * cp), NULL, NULL);
    for (int64_t b = 0; b < nb; b++) {
        const float *X = xt + (size_t)(b * C) * 8;
        for (int64_t r = r0; r < r1;) {
            const float *wr = wb + (size_t)((r - r0) * cp);
            __m256 acc[2];
            const int rb = r + 1 < r1 ? 2 : 1;
            if (rb == 2) mm_block(C, wr, X, cp, 2, acc);
            else mm_block(C, wr, X, cp, 1, acc);
            for (int k = 0; k < rb; k++) {
                float v[8];
                _mm256_storeu_ps(v, acc[k]);
                for (int64_t t = 0; t < 8 && b * 8 + t < n; t++) y[(b * 8 + t) * w->rows + r + k] = v[t];
            }
            r += rb;
        }
    }
}

AVX2 void mpk_avx2_mm_rows(const mpk_mat *w, int64_t r0, int64_t r1, const float *xt, int64_t nb, int64_t n, float *y,
                           float *wb) {
    mm_rows_body(w, r0, r1, xt, nb, n, y, wb);
}

/* The same code where AVX-512VL gives 32 vector registers (the AVX-512 table's trunk product). */
__attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512vl"))) void
mpk_avx512vl_mm_rows(const mpk_mat *w, int64_t r0, int64_t r1, const float *xt, int64_t nb, int64_t n, float *y,
                     float *wb) {
    mm_rows_body(w, r0, r1, xt, nb, n, y, wb);
}

AVX2 static void a_rvq_tables(const float *cbt, const float *x, mpk_rvq_tab *t, int64_t g, int st) {
    const int S = t->stages;
    const int64_t v0 = g * MPK_RVQ_GROUP;
    const int64_t v1 = v0 + MPK_RVQ_GROUP < t->nv ? v0 + MPK_RVQ_GROUP : t->nv;
    const float *cs = cbt + (size_t)st * 8 * 256;
    float T[MPK_RVQ_GROUP][256] __attribute__((aligned(32)));
    const __m256i absm = _mm256_set1_epi32(0x7fffffff);
    __m256i mx = _mm256_setzero_si256();
    for (int64_t v = v0; v < v1; v++) {
        __m256 X[8];
        #pragma GCC unroll 8
        for (int d = 0; d < 8; d++) X[d] = _mm256_set1_ps(8 * v + d < t->cols ? x[8 * v + d] : 0.0f);
        for (int e = 0; e < 256; e += 32) { /* four independent FMA chains */
            __m256 a[4];
            #pragma GCC unroll 8
            for (int i = 0; i < 4; i++) a[i] = _mm256_mul_ps(X[0], _mm256_loadu_ps(cs + e + 8 * i));
            #pragma GCC unroll 8
            for (int d = 1; d < 8; d++)
                #pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
                    a[i] = _mm256_fmadd_ps(X[d], _mm256_loadu_ps(cs + d * 256 + e + 8 * i), a[i]);
            #pragma GCC unroll 8
            for (int i = 0; i < 4; i++) {
                _mm256_store_ps(&T[v - v0][e + 8 * i], a[i]);
                mx = _mm256_max_epu32(mx, _mm256_and_si256(_mm256_castps_si256(a[i]), absm));
            }
        }
    }
    uint32_t l[8], mb = 0;
    _mm256_storeu_si256((__m256i *)l, mx);
    for (int i = 0; i < 8; i++) mb = l[i] > mb ? l[i] : mb;
    float inv = 0.0f, dd;
    int live = mpk_rvq_scale(mb, 127.0f, &inv, &dd);
    t->d[g * S + st] = dd;
    const __m256 vi = _mm256_set1_ps(inv);
    const __m256i fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undo packs' lane interleave */
    for (int64_t v = v0; v < v1; v++) {
        int8_t *q = t->q + ((size_t)v * (size_t)S + (size_t)st) * 256;
        if (!live) {
            memset(q, 0, 256);
            continue;
        }
        for (int e = 0; e < 256; e += 32) {
            __m256i n[4];
            #pragma GCC unroll 8
            for (int i = 0; i < 4; i++) /* product rounded to f32, then to even integer (MXCSR default) */
                n[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(&T[v - v0][e + 8 * i]), vi));
            __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
            _mm256_store_si256((__m256i *)(q + e), _mm256_permutevar8x32_epi32(b, fix));
        }
    }
}

/* vpblendvb as written: on a computed mask GCC emits a compare before each blend (one more
 * vector op), although the instruction reads only the mask's sign bits. */
AVX2 static inline __m256i blend_sign(__m256i a, __m256i b, __m256i m) {
    __m256i r;
    __asm__("vpblendvb %3, %2, %1, %0" : "=x"(r) : "x"(a), "x"(b), "x"(m));
    return r;
}

/* 32 int8 lookups q[code] of one (vector, stage) table.  vpshufb picks from a 16-entry sub-table
 * by the low nibble and gives 0 where the index's bit 7 is set, so sub-tables h and h + 8 looked
 * up by the code and by the code with bit 7 flipped, or'ed, select on bit 7 without a blend; a
 * vpblendvb tree on bits 4, 5, 6 (moved to the sign bit by byte adds, which run on every vector
 * port while shifts share the shuffle ports) selects among the eight. */
AVX2 static inline __attribute__((always_inline)) __m256i lookup32(const int8_t *tab, __m256i c) {
    const __m256i cx = _mm256_xor_si256(c, _mm256_set1_epi8((char)0x80));
    const __m256i b6 = _mm256_add_epi8(c, c), b5 = _mm256_add_epi8(b6, b6), b4 = _mm256_add_epi8(b5, b5);
#define LEAF(h) _mm256_or_si256( \
        _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(tab + 16 * (h)))), c), \
        _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(tab + 16 * (h) + 128))), cx))
#define PAIR(h) blend_sign(LEAF(h), LEAF((h) + 1), b4)
    const __m256i q0 = blend_sign(PAIR(0), PAIR(2), b5);
    const __m256i q1 = blend_sign(PAIR(4), PAIR(6), b5);
    return blend_sign(q0, q1, b6);
#undef PAIR
#undef LEAF
}

#ifndef A_PF
#define A_PF 24 /* code lines prefetched ahead of the tile's read position */
#endif

/* Per tile and group, for each vector every stage in turn, so the tile's codes are read strictly
 * in storage order (one sequential stream; per stage a stride-S walk measured slower with codes
 * in RAM, LEARNED.md).  Int8 lookups are summed per stage in int16 lanes split into even and odd
 * rows (|n| <= 32 * 127 fits; the S x 4 sums live in L1: 16 ymm registers do not hold them and
 * the lookup), then per stage in order f32(n) fma'd into accumulators kept in the order the
 * widening produces: p[tile][half][k][8] with k = 0 even rows 0-14, 1 even rows 16-30, 2 odd
 * rows 1-15, 3 odd rows 17-31 (of the half); reordered to rows at the end. */
AVX2 static void a_rvq_acc(const mpk_rvq *w, const mpk_rvq_tab *t, int64_t tile0, int64_t ntiles,
                           int64_t g0, int64_t g1, float *pf) {
    const int S = w->stages;
    const int64_t nv = w->nv, J = nv * S;
    float (*p)[2][4][8] = (float (*)[2][4][8])pf;
    __m256i ev[8][2], od[8][2]; /* stages <= 8 (CODECS.md §3) */
    for (int64_t i = 0; i < ntiles; i++) {
        const uint8_t *c = w->codes + (size_t)((tile0 + i) * J) * 64;
        for (int64_t g = g0; g < g1; g++) {
            int64_t v0 = g * MPK_RVQ_GROUP, v1 = v0 + MPK_RVQ_GROUP < nv ? v0 + MPK_RVQ_GROUP : nv;
            for (int st = 0; st < S; st++) ev[st][0] = ev[st][1] = od[st][0] = od[st][1] = _mm256_setzero_si256();
            for (int64_t v = v0; v < v1; v++)
                for (int st = 0; st < S; st++) {
                    const size_t j = (size_t)(v * S + st);
                    _mm_prefetch((const char *)(c + (j + A_PF) * 64), _MM_HINT_T0);
#pragma GCC unroll 2
                    for (int h = 0; h < 2; h++) {
                        /* each half broadcasts its sub-tables afresh from L1: with one pointer GCC
                         * kept the first half's 16 for the second and spilled 8 of them */
                        const int8_t *tab = t->q + j * 256;
                        __asm__ volatile("" : "+r"(tab));
                        const __m256i r = lookup32(tab, _mm256_loadu_si256((const __m256i *)(c + j * 64 + 32 * h)));
                        /* even and odd rows' bytes sign-extended to int16 (vpmaddubsw by 1 and 0) */
                        ev[st][h] = _mm256_add_epi16(ev[st][h], _mm256_maddubs_epi16(_mm256_set1_epi16(0x0001), r));
                        od[st][h] = _mm256_add_epi16(od[st][h], _mm256_maddubs_epi16(_mm256_set1_epi16(0x0100), r));
                    }
                }
            for (int st = 0; st < S; st++) {
                const __m256 d = _mm256_set1_ps(t->d[g * S + st]);
                for (int h = 0; h < 2; h++) {
                    __m256i n[4] = {_mm256_cvtepi16_epi32(_mm256_castsi256_si128(ev[st][h])),
                                    _mm256_cvtepi16_epi32(_mm256_extracti128_si256(ev[st][h], 1)),
                                    _mm256_cvtepi16_epi32(_mm256_castsi256_si128(od[st][h])),
                                    _mm256_cvtepi16_epi32(_mm256_extracti128_si256(od[st][h], 1))};
                    #pragma GCC unroll 8
                    for (int k = 0; k < 4; k++)
                        _mm256_storeu_ps(p[i][h][k], _mm256_fmadd_ps(_mm256_cvtepi32_ps(n[k]), d,
                                                                     _mm256_loadu_ps(p[i][h][k])));
                }
            }
        }
    }
}

static void a_rvq_unperm(const float *pf, int64_t ntiles, float *acc) {
    const float (*p)[2][4][8] = (const float (*)[2][4][8])pf;
    for (int64_t i = 0; i < ntiles; i++)
        for (int h = 0; h < 2; h++)
            for (int m = 0; m < 8; m++) {
                float *o = acc + i * 64 + 32 * h;
                o[2 * m] = p[i][h][0][m];
                o[16 + 2 * m] = p[i][h][1][m];
                o[2 * m + 1] = p[i][h][2][m];
                o[17 + 2 * m] = p[i][h][3][m];
            }
}

/* a_rvq_acc over every group, then rows in order (a_rvq_unperm) */
AVX2 static void a_rvq_tiles(const mpk_rvq *w, const mpk_rvq_tab *t, int64_t tile0, int64_t ntiles,
                             float *acc) {
    float p[MPK_RVQ_MAX_TILES * 64] __attribute__((aligned(32)));
    memset(p, 0, sizeof p);
    a_rvq_acc(w, t, tile0, ntiles, 0, t->ngroups, p);
    a_rvq_unperm(p, ntiles, acc);
}

AVX2 float mpk_avx2_dot(const float *a, const float *b, int64_t n) {
    return hred(lanes_f32(a, b, n));
}

/* out[i] = mpk_avx2_dot(rows + i * stride, x, n) for i < NR <= 8, NR add chains side by side (one
 * dot's chain is add-latency bound: attention scores ran at ~2 multiply-adds per cycle).  x is
 * f32, or f16 (XH) converted in registers (exact): a converted copy stored and loaded back cost
 * about a fifth more per key.  A tail (n not a multiple of 8) goes through lane arrays, apart
 * from the whole-vector case: with them GCC kept every chain on the stack. */
AVX2 static inline __attribute__((always_inline)) void dots_body(const void *x, const float *rows, int64_t stride,
                                                                int64_t n, float *out, const int NR, const int XH,
                                                                const int tail) {
    const float *xf = x;
    const uint8_t *xh = x;
    __m256 L[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) L[i] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256 xv = XH ? f16x8(xh + 2 * c) : _mm256_loadu_ps(xf + c);
#pragma GCC unroll 8
        for (int i = 0; i < NR; i++) L[i] = _mm256_add_ps(L[i], _mm256_mul_ps(_mm256_loadu_ps(rows + i * stride + c), xv));
    }
    if (tail)
        for (int i = 0; i < NR; i++) { /* the tail as lanes_f32 adds it */
            float l[8];
            _mm256_storeu_ps(l, L[i]);
            for (int64_t t = c; t < n; t++) l[t & 7] += rows[i * stride + t] * (XH ? mpk_f16_to_f32(ld16(xh + 2 * t)) : xf[t]);
            L[i] = _mm256_loadu_ps(l);
        }
    if (NR == 8) {
        _mm256_storeu_ps(out, red8x8(L));
    } else {
        float o[8];
        _mm256_storeu_ps(o, red8x8(L));
        for (int i = 0; i < NR; i++) out[i] = o[i];
    }
}

AVX2 static inline __attribute__((always_inline)) void dots_any(const void *x, const float *rows, int64_t stride,
                                                               int nr, int64_t n, float *out, const int XH) {
    for (int i = 0; i < nr; i += 8, rows += 8 * stride, out += 8) {
#define DOTS_NR(NR)                                                                     \
    if (n & 7) dots_body(x, rows, stride, n, out, NR, XH, 1);                           \
    else dots_body(x, rows, stride, n, out, NR, XH, 0);
        MPK_SWITCH8(nr - i < 8 ? nr - i : 8, DOTS_NR)
#undef DOTS_NR
    }
}

/* mpk_dots_keys: for each set of eight rows, the keys one after another through dots_body (the
 * row count's dispatch once per set, not per key) */
AVX2 static inline __attribute__((always_inline)) void dots_keys_set(const uint8_t *x, size_t xs, int nk,
                                                                    const float *rows, int64_t stride, int64_t n,
                                                                    float *out, int64_t os, const int NR, const int XH) {
    for (int k = 0; k < nk; k++) {
        if (n & 7) dots_body(x + (size_t)k * xs, rows, stride, n, out + k * os, NR, XH, 1);
        else dots_body(x + (size_t)k * xs, rows, stride, n, out + k * os, NR, XH, 0);
    }
}

/* Two keys a step where AVX-512VL gives 32 vector registers (their 2 x NR chains, the two keys
 * and a row): each row's load serves both keys.  n a multiple of 8; dots_body's operations per
 * dot, so its bits. */
#define AVX2VL __attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512vl")))
AVX2VL static inline __attribute__((always_inline)) void dots_keys_pairs(const uint8_t *x, size_t xs, int nk,
                                                                        const float *rows, int64_t stride, int64_t n,
                                                                        float *out, int64_t os, const int NR,
                                                                        const int XH) {
    int k = 0;
    for (; k + 2 <= nk; k += 2) {
        const uint8_t *x0 = x + (size_t)k * xs, *x1 = x0 + xs;
        __m256 A[8], B[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) A[i] = B[i] = _mm256_setzero_ps();
        for (int64_t c = 0; c < n; c += 8) {
            const __m256 xa = XH ? f16x8(x0 + 2 * c) : _mm256_loadu_ps((const float *)(const void *)x0 + c);
            const __m256 xb = XH ? f16x8(x1 + 2 * c) : _mm256_loadu_ps((const float *)(const void *)x1 + c);
#pragma GCC unroll 8
            for (int i = 0; i < NR; i++) {
                const __m256 r = _mm256_loadu_ps(rows + i * stride + c);
                A[i] = _mm256_add_ps(A[i], _mm256_mul_ps(r, xa));
                B[i] = _mm256_add_ps(B[i], _mm256_mul_ps(r, xb));
            }
        }
        float o[2][8];
        _mm256_storeu_ps(o[0], red8x8(A));
        _mm256_storeu_ps(o[1], red8x8(B));
        for (int i = 0; i < NR; i++) out[k * os + i] = o[0][i], out[(k + 1) * os + i] = o[1][i];
    }
    if (k < nk) dots_body(x + (size_t)k * xs, rows, stride, n, out + k * os, NR, XH, 0);
}

/* one set of nr <= 8 rows (a call across the target attributes: it cannot be inlined) */
AVX2VL static void dots_keys_wide(const void *x, size_t xs, int nk, int f16, const float *rows, int64_t stride,
                                  int nr, int64_t n, float *out, int64_t os) {
#define PAIRS_NR(NR)                                                                    \
    if (f16) dots_keys_pairs(x, xs, nk, rows, stride, n, out, os, NR, 1);               \
    else dots_keys_pairs(x, xs, nk, rows, stride, n, out, os, NR, 0);
    MPK_SWITCH8(nr, PAIRS_NR)
#undef PAIRS_NR
}

AVX2 void mpk_avx2_dots_keys(const void *x, size_t xs, int nk, int f16, const float *rows, int64_t stride, int nr,
                             int64_t n, float *out, int64_t os, int wide) {
    for (int i = 0; i < nr; i += 8, rows += 8 * stride, out += 8) {
        const int set = nr - i < 8 ? nr - i : 8;
        if (wide && !(n & 7)) {
            dots_keys_wide(x, xs, nk, f16, rows, stride, set, n, out, os);
            continue;
        }
#define KEYS_NR(NR)                                                                     \
    if (f16) dots_keys_set(x, xs, nk, rows, stride, n, out, os, NR, 1);                 \
    else dots_keys_set(x, xs, nk, rows, stride, n, out, os, NR, 0);
        MPK_SWITCH8(set, KEYS_NR)
#undef KEYS_NR
    }
}

AVX2 void mpk_avx2_dots(const float *x, const float *rows, int64_t stride, int nr, int64_t n, float *out) {
    dots_any(x, rows, stride, nr, n, out, 0);
}

AVX2 void mpk_avx2_dots_f16(const void *x, const float *rows, int64_t stride, int nr, int64_t n, float *out) {
    dots_any(x, rows, stride, nr, n, out, 1);
}

AVX2 void mpk_avx2_axpy(float *y, float a, const float *x, int64_t n) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(av, _mm256_loadu_ps(x + i))));
    for (; i < n; i++) y[i] += a * x[i];
}

/* mpk_exp in eight lanes: the same operations, the special cases blended in at the end */
AVX2 static inline __m256 exp8(__m256 x) {
    const __m256 magic = _mm256_set1_ps(0x1.8p23f);
    const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(MPK_EXP_LOG2E)), magic), magic);
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(MPK_EXP_C1))),
                                   _mm256_mul_ps(n, _mm256_set1_ps(MPK_EXP_C2)));
    __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(MPK_EXP_P0), r), _mm256_set1_ps(MPK_EXP_P1));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(MPK_EXP_P2));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(MPK_EXP_P3));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(MPK_EXP_P4));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(MPK_EXP_P5));
    y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
    /* n as an integer (exact; clamped first so that out-of-range lanes, blended away below, stay
     * harmless) and its two power-of-two factors */
    const __m256i ni = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(n, _mm256_set1_ps(200.0f)), _mm256_set1_ps(-200.0f)));
    const __m256i na = _mm256_max_epi32(_mm256_min_epi32(ni, _mm256_set1_epi32(127)), _mm256_set1_epi32(-126));
    const __m256i e1 = _mm256_add_epi32(_mm256_sub_epi32(ni, na), _mm256_set1_epi32(127));
    const __m256i e2 = _mm256_add_epi32(na, _mm256_set1_epi32(127));
    const __m256i lo = _mm256_max_epi32(e1, _mm256_setzero_si256()); /* out-of-range lanes only */
    y = _mm256_mul_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(lo, 23))),
                      _mm256_castsi256_ps(_mm256_slli_epi32(e2, 23)));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(MPK_EXP_LO), _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, _mm256_set1_ps(MPK_EXP_HI), _CMP_GT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* The eight-wide parts of kernels.c's xq_group, mpk_softmax and mpk_swiglu: each takes the
 * leading whole vectors of its array with the scalar definition's operations and returns how many
 * elements it took; kernels.c finishes the rest. */

/* the largest |x| as bits (the exact maximum, in any order) */
AVX2 int64_t mpk_avx2_absmax_bits(const float *x, int64_t n, uint32_t *mb) {
    const __m256i am = _mm256_set1_epi32(0x7fffffff);
    __m256i mv = _mm256_setzero_si256();
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) mv = _mm256_max_epu32(mv, _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(x + c)), am));
    uint32_t l[8];
    _mm256_storeu_si256((__m256i *)l, mv);
    for (int k = 0; k < 8; k++) *mb = l[k] > *mb ? l[k] : *mb;
    return c;
}

/* q = the even integer nearest f32(x inv) (|q| <= 2^15 - 1: the conversions are exact) */
AVX2 int64_t mpk_avx2_round_i16(const float *x, int64_t n, float inv, int16_t *q) {
    const __m256 vi = _mm256_set1_ps(inv), mg = _mm256_set1_ps(0x1.8p23f);
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        const __m256 a = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), vi), mg), mg);
        const __m256 b = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c + 8), vi), mg), mg);
        const __m256i p = _mm256_packs_epi32(_mm256_cvttps_epi32(a), _mm256_cvttps_epi32(b));
        _mm256_storeu_si256((__m256i *)(q + c), _mm256_permute4x64_epi64(p, 0xd8));
    }
    return c;
}

AVX2 int64_t mpk_avx2_swiglu(float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f))); /* -x, the sign flipped as C's negation */
        const __m256 s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    return i;
}

/* mpk_softmax's maximum (exact in any order), n >= 8 */
AVX2 int64_t mpk_avx2_max(const float *x, int64_t n, float *m) {
    __m256 mv = _mm256_loadu_ps(x);
    int64_t i = 8;
    for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    float l[8];
    _mm256_storeu_ps(l, mv);
    *m = l[0];
    for (int k = 1; k < 8; k++) *m = l[k] > *m ? l[k] : *m;
    return i;
}

/* mpk_softmax's exponentials in place, added into its eight binary64 lane sums l */
AVX2 int64_t mpk_avx2_softmax_exp(float *x, int64_t n, float m, double l[8]) {
    const __m256 mb = _mm256_set1_ps(m);
    __m256d a = _mm256_loadu_pd(l), b = _mm256_loadu_pd(l + 4);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mb));
        _mm256_storeu_ps(x + i, e);
        a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    _mm256_storeu_pd(l, a);
    _mm256_storeu_pd(l + 4, b);
    return i;
}

/* x *= a */
AVX2 int64_t mpk_avx2_scale(float *x, int64_t n, float a) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), av));
    return i;
}

/* mpk_wsum: eight columns of heads h0 .. h0 + HN in registers over all rows (the output is
 * written once instead of loaded and stored per row); the same operations per element.  HN and
 * F16 fixed, so that the loop carries no per-head test. */
AVX2 static inline __attribute__((always_inline)) void
wsum8(float *out, int64_t os, const float *w, int64_t ws, const void *rows, size_t rs, int64_t nt, int64_t c,
      const int HN, const int F16) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < HN; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t t = 0; t < nt; t++) {
        const uint8_t *r = (const uint8_t *)rows + (size_t)t * rs;
        if (t + MPK_ROWS_AHEAD < nt)
            _mm_prefetch((const char *)(r + MPK_ROWS_AHEAD * rs + c * (F16 ? 2 : 4)), _MM_HINT_T0);
        const __m256 v = F16 ? f16x8(r + 2 * c) : _mm256_loadu_ps((const float *)(const void *)r + c);
#pragma GCC unroll 8
        for (int i = 0; i < HN; i++) acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(_mm256_set1_ps(w[i * ws + t]), v));
    }
#pragma GCC unroll 8
    for (int i = 0; i < HN; i++) _mm256_storeu_ps(out + i * os + c, acc[i]);
}

AVX2 void mpk_avx2_wsum(float *out, int64_t os, int nh, const float *w, int64_t ws, const void *rows, size_t rs,
                        int f16, int64_t nt, int64_t n) {
    int64_t c = 0;
    for (; c + 8 <= n; c += 8)
        for (int h0 = 0; h0 < nh; h0 += 8) {
            float *o = out + h0 * os;
            const float *wh = w + h0 * ws;
#define WSUM_HN(HN)                                                                     \
    if (f16) wsum8(o, os, wh, ws, rows, rs, nt, c, HN, 1);                              \
    else wsum8(o, os, wh, ws, rows, rs, nt, c, HN, 0);
            MPK_SWITCH8(nh - h0 < 8 ? nh - h0 : 8, WSUM_HN)
#undef WSUM_HN
        }
    mpk_wsum_cols(out, os, nh, w, ws, rows, rs, f16, nt, c, n); /* the last columns */
}

/* rows q..q+3 (wq: their decoded pairs) times one group of two inputs (two == 0: one): exact
 * int32 lane sums s<row><input> (64 products a lane: below 2^31), then per input the rows' group
 * sums into a[t][row] (igemm_put; first group: onto +0).  Eight accumulators: with twelve
 * they spill on AVX2's 16 registers. */
#define IG_WP(r) ((const __m256i *)(wq + ((size_t)k * MPK_GEMM_ROWS + (r)) * 16))
#define IG_W(r) _mm256_load_si256(IG_WP(r))
/* one multiply-add per asm statement through a fixed temporary: written as intrinsics, GCC
 * computed all eight products first and copied every sum back (35 instructions a step, not 22) */
#define IG_MAC(acc, w, x) \
    __asm__("vpmaddwd %2, %1, %%ymm15\n\tvpaddd %%ymm15, %0, %0" : "+x"(acc) : "x"(w), "x"(x) : "xmm15")
/* a lane sum's eight int32 in binary64, added in pairs (exact) */
AVX2 static inline __attribute__((always_inline)) __m256d lanes_f64(__m256i s) {
    return _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(s)), _mm256_cvtepi32_pd(_mm256_extracti128_si256(s, 1)));
}
/* §3.6 steps 3-4 for rows q..q+3 of one input from their stored lane sums sb[0..3] (eight int32
 * lanes each, each exact, below 2^31): the lanes added in binary64 (exact: integers below 2^53),
 * each row's group sum rounded once to binary32, a[0..3] = fma(f32(n), d, a) (first group: onto
 * +0).  Not inlined: its temporaries made GCC spill the kernels' accumulators inside their loops
 * (AVX2 prefill product 25-30 % slower, Xeon, 2026-12-05). */
AVX2 static __attribute__((noinline)) void igemm_put(float *a, const __m256i *sb, float d, int first) {
    const __m256d d0 = lanes_f64(_mm256_load_si256(sb)), d1 = lanes_f64(_mm256_load_si256(sb + 1));
    const __m256d d2 = lanes_f64(_mm256_load_si256(sb + 2)), d3 = lanes_f64(_mm256_load_si256(sb + 3));
    const __m256d h01 = _mm256_add_pd(_mm256_unpacklo_pd(d0, d1), _mm256_unpackhi_pd(d0, d1));
    const __m256d h23 = _mm256_add_pd(_mm256_unpacklo_pd(d2, d3), _mm256_unpackhi_pd(d2, d3));
    const __m256d n = _mm256_add_pd(_mm256_permute2f128_pd(h01, h23, 0x20), _mm256_permute2f128_pd(h01, h23, 0x31));
    const __m128 prev = first ? _mm_setzero_ps() : _mm_loadu_ps(a);
    _mm_storeu_ps(a, _mm_fmadd_ps(_mm256_cvtpd_ps(n), _mm_set1_ps(d), prev));
}

AVX2 static void igemm_rows4x2(const int16_t *wq, const int16_t *const *xq, const float *dg, int64_t np,
                               int first, float *a0, int two) {
    __m256i s00 = _mm256_setzero_si256(), s01 = s00, s10 = s00, s11 = s00;
    __m256i s20 = s00, s21 = s00, s30 = s00, s31 = s00;
    const int16_t *xb[2] = {xq[0], two ? xq[1] : xq[0]};
    for (int64_t k = 0; k < np; k++) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xb[0] + 16 * k));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xb[1] + 16 * k));
        __m256i w = IG_W(0);
        IG_MAC(s00, w, x0);
        IG_MAC(s01, w, x1);
        w = IG_W(1);
        IG_MAC(s10, w, x0);
        IG_MAC(s11, w, x1);
        w = IG_W(2);
        IG_MAC(s20, w, x0);
        IG_MAC(s21, w, x1);
        w = IG_W(3);
        IG_MAC(s30, w, x0);
        IG_MAC(s31, w, x1);
    }
    __m256i sb[8] __attribute__((aligned(32))); /* the sums leave the registers for igemm_put */
    _mm256_store_si256(sb, s00), _mm256_store_si256(sb + 1, s10), _mm256_store_si256(sb + 2, s20);
    _mm256_store_si256(sb + 3, s30), _mm256_store_si256(sb + 4, s01), _mm256_store_si256(sb + 5, s11);
    _mm256_store_si256(sb + 6, s21), _mm256_store_si256(sb + 7, s31);
    igemm_put(a0, sb, dg[0], first);
    if (two) igemm_put(a0 + MPK_GEMM_ROWS, sb + 4, dg[1], first);
}
/* rows q..q+3 times three inputs held in registers: twelve sums, each weight the multiply's
 * memory operand (2.5 instructions a multiply-add; two rows x four inputs with the weights in
 * registers took 3.25 and measured 3-5 % slower, Zen 3) */
#define IG_MACM(acc, x, r) \
    __asm__("vpmaddwd %2, %1, %%ymm15\n\tvpaddd %%ymm15, %0, %0" \
            : "+x"(acc) : "x"(x), "m"(*IG_WP(r)) : "xmm15")
AVX2 static void igemm_rows4x3(const int16_t *wq, const int16_t *const *xq, const float *dg, int64_t np,
                               int first, float *a0) {
    __m256i s00 = _mm256_setzero_si256(), s01 = s00, s02 = s00, s10 = s00, s11 = s00, s12 = s00;
    __m256i s20 = s00, s21 = s00, s22 = s00, s30 = s00, s31 = s00, s32 = s00;
    for (int64_t k = 0; k < np; k++) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq[0] + 16 * k));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(xq[1] + 16 * k));
        const __m256i x2 = _mm256_loadu_si256((const __m256i *)(xq[2] + 16 * k));
        IG_MACM(s00, x0, 0); IG_MACM(s01, x1, 0); IG_MACM(s02, x2, 0);
        IG_MACM(s10, x0, 1); IG_MACM(s11, x1, 1); IG_MACM(s12, x2, 1);
        IG_MACM(s20, x0, 2); IG_MACM(s21, x1, 2); IG_MACM(s22, x2, 2);
        IG_MACM(s30, x0, 3); IG_MACM(s31, x1, 3); IG_MACM(s32, x2, 3);
    }
    __m256i sb[12] __attribute__((aligned(32))); /* as igemm_rows4x2 */
    _mm256_store_si256(sb, s00), _mm256_store_si256(sb + 1, s10), _mm256_store_si256(sb + 2, s20);
    _mm256_store_si256(sb + 3, s30), _mm256_store_si256(sb + 4, s01), _mm256_store_si256(sb + 5, s11);
    _mm256_store_si256(sb + 6, s21), _mm256_store_si256(sb + 7, s31), _mm256_store_si256(sb + 8, s02);
    _mm256_store_si256(sb + 9, s12), _mm256_store_si256(sb + 10, s22), _mm256_store_si256(sb + 11, s32);
    igemm_put(a0, sb, dg[0], first);
    igemm_put(a0 + MPK_GEMM_ROWS, sb + 4, dg[1], first);
    igemm_put(a0 + 2 * MPK_GEMM_ROWS, sb + 8, dg[2], first);
}
#undef IG_MACM
#undef IG_W
#undef IG_WP
#undef IG_MAC

AVX2 void mpk_avx2_rvq_gemm(const mpk_rvq *w, const mpk_rvq_icb *cb, const uint8_t *xq, size_t xqs, int64_t n,
                            int64_t r0, float *acc) {
    const int S = w->stages;
    const int64_t nv = w->nv;
    const uint8_t *codes = w->codes + (size_t)((r0 / 64) * nv * S) * 64 + (size_t)(r0 % 64);
    int16_t wb[MPK_GEMM_ROWS * MPK_RVQ_XGROUP * 8] __attribute__((aligned(32)));
    for (int64_t v0 = 0, g = 0; v0 < nv; v0 += MPK_RVQ_XGROUP, g++) { /* one panel per group */
        const int64_t kp = nv - v0 < MPK_RVQ_XGROUP ? nv - v0 : MPK_RVQ_XGROUP, np = (kp + 1) / 2;
        mpk_rvq_decode_panel(codes + (size_t)(v0 * S) * 64, cb, kp, S, 2, wb); /* wb[pair][row][16] */
        for (int64_t t = 0; t < n;) { /* inputs by three, the last one or two together */
            const int nt = n - t >= 3 ? 3 : n - t >= 2 ? 2 : 1;
            const int16_t *xp[3];
            float dg[3];
            mpk_rvq_gemm_inputs(xq, xqs, w->cols, t, nt, v0, g, xp, dg);
            float *a0 = acc + (size_t)t * MPK_GEMM_ROWS;
            if (nt == 3)
                for (int q = 0; q < MPK_GEMM_ROWS; q += 4) igemm_rows4x3(wb + (size_t)q * 16, xp, dg, np, v0 == 0, a0 + q);
            else
                for (int q = 0; q < MPK_GEMM_ROWS; q += 4)
                    igemm_rows4x2(wb + (size_t)q * 16, xp, dg, np, v0 == 0, a0 + q, nt == 2);
            t += nt;
        }
    }
}

/* The trunk's prefill product in panels of GEMM_KP vectors of the block's 16 decoded rows (16 KiB,
 * read from L1 after the first input set), three inputs times four rows per step (twelve accumulators, one fma
 * chain per lane as the scalar code; the last one or two inputs in pairs), kept in acc between
 * panels. */
#define GEMM_KP 32
#define WS (MPK_GEMM_ROWS * 8) /* floats from one vector's decoded rows to the next's */

/* rows q..q+3 (wq: their decoded panel) times one input pair (xb NULL: one input) */
AVX2 static void gemm_rows4(const float *wq, const float *xa, const float *xb, int64_t kp, int first,
                            float *a0, float *a1) {
    const float *w1 = wq + 8, *w2 = wq + 16, *w3 = wq + 24;
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    if (!first) {
        c0 = _mm256_load_ps(a0), c1 = _mm256_load_ps(a0 + 8), c2 = _mm256_load_ps(a0 + 16);
        c3 = _mm256_load_ps(a0 + 24);
    }
    if (!xb) {
        for (int64_t v = 0; v < kp; v++) {
            const __m256 x0 = _mm256_loadu_ps(xa + 8 * v);
            c0 = _mm256_fmadd_ps(_mm256_load_ps(wq + WS * v), x0, c0);
            c1 = _mm256_fmadd_ps(_mm256_load_ps(w1 + WS * v), x0, c1);
            c2 = _mm256_fmadd_ps(_mm256_load_ps(w2 + WS * v), x0, c2);
            c3 = _mm256_fmadd_ps(_mm256_load_ps(w3 + WS * v), x0, c3);
        }
    } else {
        __m256 d0 = _mm256_setzero_ps(), d1 = d0, d2 = d0, d3 = d0;
        if (!first) {
            d0 = _mm256_load_ps(a1), d1 = _mm256_load_ps(a1 + 8), d2 = _mm256_load_ps(a1 + 16);
            d3 = _mm256_load_ps(a1 + 24);
        }
        for (int64_t v = 0; v < kp; v++) {
            const __m256 x0 = _mm256_loadu_ps(xa + 8 * v), x1 = _mm256_loadu_ps(xb + 8 * v);
            __m256 wv = _mm256_load_ps(wq + WS * v);
            c0 = _mm256_fmadd_ps(wv, x0, c0);
            d0 = _mm256_fmadd_ps(wv, x1, d0);
            wv = _mm256_load_ps(w1 + WS * v);
            c1 = _mm256_fmadd_ps(wv, x0, c1);
            d1 = _mm256_fmadd_ps(wv, x1, d1);
            wv = _mm256_load_ps(w2 + WS * v);
            c2 = _mm256_fmadd_ps(wv, x0, c2);
            d2 = _mm256_fmadd_ps(wv, x1, d2);
            wv = _mm256_load_ps(w3 + WS * v);
            c3 = _mm256_fmadd_ps(wv, x0, c3);
            d3 = _mm256_fmadd_ps(wv, x1, d3);
        }
        _mm256_store_ps(a1, d0), _mm256_store_ps(a1 + 8, d1), _mm256_store_ps(a1 + 16, d2);
        _mm256_store_ps(a1 + 24, d3);
    }
    _mm256_store_ps(a0, c0), _mm256_store_ps(a0 + 8, c1), _mm256_store_ps(a0 + 16, c2);
    _mm256_store_ps(a0 + 24, c3);
}

/* rows q..q+3 times three inputs: twelve fma chains */
AVX2 static void gemm_rows4x3(const float *wq, const float *xa, int64_t xs, int64_t kp, int first, float *a0) {
    const float *w1 = wq + 8, *w2 = wq + 16, *w3 = wq + 24;
    const float *xb = xa + xs, *xc = xb + xs;
    float *a1 = a0 + MPK_GEMM_ROWS * 8, *a2 = a1 + MPK_GEMM_ROWS * 8;
    __m256 c0, c1, c2, c3, d0, d1, d2, d3, e0, e1, e2, e3;
    if (first) {
        c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = e0 = e1 = e2 = e3 = _mm256_setzero_ps();
    } else {
        c0 = _mm256_load_ps(a0), c1 = _mm256_load_ps(a0 + 8), c2 = _mm256_load_ps(a0 + 16), c3 = _mm256_load_ps(a0 + 24);
        d0 = _mm256_load_ps(a1), d1 = _mm256_load_ps(a1 + 8), d2 = _mm256_load_ps(a1 + 16), d3 = _mm256_load_ps(a1 + 24);
        e0 = _mm256_load_ps(a2), e1 = _mm256_load_ps(a2 + 8), e2 = _mm256_load_ps(a2 + 16), e3 = _mm256_load_ps(a2 + 24);
    }
    for (int64_t v = 0; v < kp; v++) {
        const __m256 x0 = _mm256_loadu_ps(xa + 8 * v), x1 = _mm256_loadu_ps(xb + 8 * v), x2 = _mm256_loadu_ps(xc + 8 * v);
        __m256 wv = _mm256_load_ps(wq + WS * v);
        c0 = _mm256_fmadd_ps(wv, x0, c0), d0 = _mm256_fmadd_ps(wv, x1, d0), e0 = _mm256_fmadd_ps(wv, x2, e0);
        wv = _mm256_load_ps(w1 + WS * v);
        c1 = _mm256_fmadd_ps(wv, x0, c1), d1 = _mm256_fmadd_ps(wv, x1, d1), e1 = _mm256_fmadd_ps(wv, x2, e1);
        wv = _mm256_load_ps(w2 + WS * v);
        c2 = _mm256_fmadd_ps(wv, x0, c2), d2 = _mm256_fmadd_ps(wv, x1, d2), e2 = _mm256_fmadd_ps(wv, x2, e2);
        wv = _mm256_load_ps(w3 + WS * v);
        c3 = _mm256_fmadd_ps(wv, x0, c3), d3 = _mm256_fmadd_ps(wv, x1, d3), e3 = _mm256_fmadd_ps(wv, x2, e3);
    }
    _mm256_store_ps(a0, c0), _mm256_store_ps(a0 + 8, c1), _mm256_store_ps(a0 + 16, c2), _mm256_store_ps(a0 + 24, c3);
    _mm256_store_ps(a1, d0), _mm256_store_ps(a1 + 8, d1), _mm256_store_ps(a1 + 16, d2), _mm256_store_ps(a1 + 24, d3);
    _mm256_store_ps(a2, e0), _mm256_store_ps(a2 + 8, e1), _mm256_store_ps(a2 + 16, e2), _mm256_store_ps(a2 + 24, e3);
}

/* acc[t][16][8] (first panel: =, else +=) the panel wb (vectors v0 .. v0 + kp) times inputs
 * [0, n): three inputs per step, the last one or two in a pair or alone */
AVX2 static void gemm_panel(const float *wb, const float *x, int64_t xs, int64_t n, int64_t v0, int64_t kp,
                            float *acc) {
    int64_t t = 0;
    for (; t + 3 <= n; t += 3)
        for (int q = 0; q < MPK_GEMM_ROWS; q += 4)
            gemm_rows4x3(wb + (size_t)q * 8, x + t * xs + v0 * 8, xs, kp, v0 == 0,
                         acc + ((size_t)t * MPK_GEMM_ROWS + (size_t)q) * 8);
    for (; t < n; t += 2) {
        const float *xa = x + t * xs + v0 * 8, *xb = t + 1 < n ? xa + xs : NULL;
        for (int q = 0; q < MPK_GEMM_ROWS; q += 4) {
            float *a0 = acc + ((size_t)t * MPK_GEMM_ROWS + (size_t)q) * 8;
            gemm_rows4(wb + (size_t)q * 8, xa, xb, kp, v0 == 0, a0, a0 + MPK_GEMM_ROWS * 8);
        }
    }
}

/* The trunk's prefill product (mpk_gemm): the block's rows decoded, vector-major, streamed panel
 * by panel. */
AVX2 void mpk_avx2_gemm_rows(const float *wb, int64_t nv, const float *x, int64_t xs, int64_t n, float *acc) {
    for (int64_t v0 = 0; v0 < nv; v0 += GEMM_KP)
        gemm_panel(wb + (size_t)v0 * WS, x, xs, n, v0, nv - v0 < GEMM_KP ? nv - v0 : GEMM_KP, acc);
}

/* The trunk's integer prefill product (CODECS.md §2.4): eight rows a register (lanes = rows), each
 * step one column pair of NT <= 3 inputs (vpmaddwd: the pair's two products, exact; then vpaddd),
 * and at each group's end the exact int32 sums converted and combined with one fma, in group order */
AVX2 static inline __attribute__((always_inline)) void
qg_rows(const int16_t *wq, const float *sc, const float *mn, int64_t ng, int64_t group, const uint8_t *xq, size_t xqs,
        float *acc, const int NT) {
    const int16_t *q[3];
    const float *d[3];
    mpk_tq_inputs(xq, xqs, ng * group, NT, q, d);
    __m256 f[3][2];
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++) f[t][0] = f[t][1] = _mm256_setzero_ps();
    const int64_t np = group / 2;
    for (int64_t g = 0; g < ng; g++) {
        __m256i s[3][2];
    #pragma GCC unroll 3
    for (int t = 0; t < NT; t++) s[t][0] = s[t][1] = _mm256_setzero_si256();
        const int16_t *wg = wq + (size_t)(g * np) * MPK_GEMM_ROWS * 2;
        for (int64_t k = 0; k < np; k++) {
            const __m256i w0 = _mm256_load_si256((const __m256i *)(wg + k * 32));
            const __m256i w1 = _mm256_load_si256((const __m256i *)(wg + k * 32 + 16));
        #pragma GCC unroll 3
    for (int t = 0; t < NT; t++) {
                int32_t pair;
                memcpy(&pair, q[t] + g * group + 2 * k, 4);
                const __m256i x = _mm256_set1_epi32(pair);
                const __m256i p0 = _mm256_madd_epi16(w0, x), p1 = _mm256_madd_epi16(w1, x);
                /* in place: as an intrinsic GCC added into the product's register, then copied */
                __asm__("vpaddd %1, %0, %0" : "+x"(s[t][0]) : "x"(p0));
                __asm__("vpaddd %1, %0, %0" : "+x"(s[t][1]) : "x"(p1));
            }
        }
        const __m256 s0 = _mm256_loadu_ps(sc + g * MPK_GEMM_ROWS), s1 = _mm256_loadu_ps(sc + g * MPK_GEMM_ROWS + 8);
    #pragma GCC unroll 3
    for (int t = 0; t < NT; t++) {
            const __m256 dd = _mm256_set1_ps(d[t][g]);
            f[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][0]), _mm256_mul_ps(s0, dd), f[t][0]);
            f[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t][1]), _mm256_mul_ps(s1, dd), f[t][1]);
        }
        if (mn) {
            const __m256 m0 = _mm256_loadu_ps(mn + g * MPK_GEMM_ROWS), m1 = _mm256_loadu_ps(mn + g * MPK_GEMM_ROWS + 8);
        #pragma GCC unroll 3
    for (int t = 0; t < NT; t++) {
                const __m256 dd = _mm256_set1_ps(d[t][g]), z = _mm256_set1_ps(d[t][ng + g]);
                f[t][0] = _mm256_fmadd_ps(z, _mm256_mul_ps(m0, dd), f[t][0]);
                f[t][1] = _mm256_fmadd_ps(z, _mm256_mul_ps(m1, dd), f[t][1]);
            }
        }
    }
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++) {
        _mm256_storeu_ps(acc + t * MPK_GEMM_ROWS, f[t][0]);
        _mm256_storeu_ps(acc + t * MPK_GEMM_ROWS + 8, f[t][1]);
    }
}

AVX2 static void a_qgemm_rows(const int16_t *wq, const float *sc, const float *mn, int64_t ng, int64_t group,
                              const uint8_t *xq, size_t xqs, int64_t n, float *acc) {
    int64_t t = 0;
    for (; t + 3 <= n; t += 3) qg_rows(wq, sc, mn, ng, group, xq + (size_t)t * xqs, xqs, acc + t * MPK_GEMM_ROWS, 3);
    if (n - t == 2) qg_rows(wq, sc, mn, ng, group, xq + (size_t)t * xqs, xqs, acc + t * MPK_GEMM_ROWS, 2);
    if (n - t == 1) qg_rows(wq, sc, mn, ng, group, xq + (size_t)t * xqs, xqs, acc + t * MPK_GEMM_ROWS, 1);
}

/* ---- the trunk's one-input integer product (CODECS.md §2.4: decode, the lm_head) ----
 * AVX-512's with eight rows a block: each (row, group)'s codes widened to int16, vpmaddwd with the
 * group's integer input and vpaddd into the row's register, one transpose-and-add tree to the
 * eight rows' group sums (exact), the combine with a row a lane in group order. */

/* 16 codes from column c of a row whose codes start at q, in column order, as stored: q8 the int8,
 * q6 the 6-bit code and q4 the nibble without their offsets (aqd_block takes those off once per
 * group); q6: twelve bytes, each word shifted left until its code's top bit is bit 15, then back
 * down */
AVX2 static inline __attribute__((always_inline)) __m256i aq_codes(const uint8_t *q, int64_t c, const int codec) {
    if (codec == MP_CODEC_Q8) return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + c)));
    if (codec == MP_CODEC_Q6) {
        const __m128i b = _mm_maskload_epi32((const int *)(const void *)(q + c / 4 * 3), _mm_setr_epi32(-1, -1, -1, 0));
        const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 1, 2, 2, 2, 3, 4, 3, 4, 4, 5, 5, 5,
                                              6, 7, 6, 7, 7, 8, 8, 8, 9, 10, 9, 10, 10, 11, 11, 11);
        const __m256i up = _mm256_setr_epi16(1024, 16, 64, 256, 1024, 16, 64, 256, 1024, 16, 64, 256, 1024, 16, 64, 256);
        return _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(b), pick), up), 10);
    }
    const __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + c / 2)));
    return _mm256_and_si256(_mm256_or_si256(d, _mm256_slli_epi32(d, 12)), _mm256_set1_epi32(0x000f000f));
}

/* lane i = the sum of a[i]'s eight lanes */
AVX2 static inline __attribute__((always_inline)) __m256i a_sum8x8(const __m256i a[8]) {
    __m256i b[4], c[2];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        b[j] = _mm256_add_epi32(_mm256_unpacklo_epi32(a[2 * j], a[2 * j + 1]), _mm256_unpackhi_epi32(a[2 * j], a[2 * j + 1]));
    for (int m = 0; m < 2; m++) /* per 128-bit lane: rows 4m .. 4m + 3 */
        c[m] = _mm256_add_epi32(_mm256_unpacklo_epi64(b[2 * m], b[2 * m + 1]), _mm256_unpackhi_epi64(b[2 * m], b[2 * m + 1]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(c[0], c[1], 0x20), _mm256_permute2x128_si256(c[0], c[1], 0x31));
}

/* out[j][i] = the f16 at p + i * ps + 2 (g0 + j) for eight rows' groups g0 .. g0 + 7 (zero past
 * ng): an 8 x 8 transpose of 16-bit values in three unpack steps */
AVX2 static inline __attribute__((always_inline)) void aq_f16_t8(const uint8_t *p, size_t ps, int64_t ng, int64_t g0,
                                                                  uint16_t out[8][8]) {
    __m128i a[8], b[8];
    for (int i = 0; i < 8; i++) {
        if (ng - g0 >= 8) {
            a[i] = _mm_loadu_si128((const __m128i *)(p + i * ps + 2 * g0));
        } else {
            uint16_t v[8] = {0};
            memcpy(v, p + i * ps + 2 * g0, (size_t)(ng - g0) * 2);
            a[i] = _mm_loadu_si128((const __m128i *)v);
        }
    }
    for (int i = 0; i < 4; i++) {
        b[i] = _mm_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
        b[i + 4] = _mm_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 2; i++) {
            a[4 * h + i] = _mm_unpacklo_epi32(b[4 * h + 2 * i], b[4 * h + 2 * i + 1]);
            a[4 * h + i + 2] = _mm_unpackhi_epi32(b[4 * h + 2 * i], b[4 * h + 2 * i + 1]);
        }
    for (int q = 0; q < 4; q++) { /* group 2q, then 2q + 1, rows in order */
        _mm_store_si128((__m128i *)out[2 * q], _mm_unpacklo_epi64(a[2 * q], a[2 * q + 1]));
        _mm_store_si128((__m128i *)out[2 * q + 1], _mm_unpackhi_epi64(a[2 * q], a[2 * q + 1]));
    }
}

/* rows r .. r + 7, to out[8]; NCH chunks of 16 columns a group; the codes prefetched (to L2) a
 * block of rows ahead as AVX-512's */
AVX2 static inline __attribute__((always_inline)) void aqd_block(const mpk_mat *w, int64_t r, const uint8_t *xq,
                                                                  float *out, const int codec, const int zp,
                                                                  const int NCH) {
    const int64_t ng = w->ngroups, G = 16 * NCH;
    const int64_t bpg = codec == MP_CODEC_Q8 ? G : codec == MP_CODEC_Q6 ? G / 4 * 3 : G / 2; /* code bytes a group */
    const size_t rs = (size_t)(ng * bpg), ss = (size_t)ng * 2; /* row strides of the codes and the scales */
    const uint8_t *k0 = mpk_grouped_row(w, r);
    const uint8_t *s0 = w->data + (size_t)(r * ng) * 2, *m0 = s0 + (size_t)(w->rows * ng) * 2;
    uint16_t st[8][8] __attribute__((aligned(16))), mt[8][8] __attribute__((aligned(16)));
    const int16_t *q = (const int16_t *)xq;
    const float *d = mpk_tq_steps(xq, w->cols_p), *z = d + ng;
    __m256 a = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *kg = k0 + g * bpg;
        if ((g * bpg) % 64 < bpg)
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) _mm_prefetch((const char *)(kg + (8 + i) * rs), _MM_HINT_T1);
        if (g % 8 == 0) { /* the next eight groups' scales (and minimums) with a row a lane */
            aq_f16_t8(s0, ss, ng, g, st);
            if (zp) aq_f16_t8(m0, ss, ng, g, mt);
        }
        __m256i acc[8];
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(q + g * G));
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) acc[i] = _mm256_madd_epi16(aq_codes(kg + i * rs, 0, codec), x0);
#pragma GCC unroll 16
        for (int h = 1; h < NCH; h++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(q + g * G + h * 16));
            const uint8_t *kc = kg + h * (bpg / NCH);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(aq_codes(kc + i * rs, 0, codec), xv));
        }
        /* the codes' offset (q6 32, symmetric q4 8) once per group: n = sum (k + off) q - off sum q */
        const int off = codec == MP_CODEC_Q6 ? 32 : codec == MP_CODEC_Q4 && !zp ? 8 : 0;
        __m256i ni = a_sum8x8(acc);
        if (off) ni = _mm256_sub_epi32(ni, _mm256_set1_epi32(off * (int32_t)z[g]));
        const __m256 n = _mm256_cvtepi32_ps(ni), dg = _mm256_set1_ps(d[g]);
        a = _mm256_fmadd_ps(n, _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)st[g % 8])), dg), a);
        if (zp)
            a = _mm256_fmadd_ps(_mm256_set1_ps(z[g]),
                                _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)mt[g % 8])), dg), a);
    }
    _mm256_storeu_ps(out, a);
}

/* Blocks of eight rows; a last short block is the matrix's eight rows ending there, matrices of
 * fewer rows the scalar kernel's. */
AVX2 void mpk_avx2_qdot_rows(const mpk_mat *w, int64_t r0, int64_t r1, const uint8_t *xq, float *y) {
    const int64_t G = w->group;
    if (w->rows < 8 || G % 16) { /* groups of 8: only the C API makes them */
        mpk_scalar_impl.qdot_rows(w, r0, r1, xq, y);
        return;
    }
    for (int64_t r = r0; r < r1; r += 8) {
        const int64_t rb = r + 8 <= w->rows ? r : w->rows - 8;
        float out[8];
#define AQD(CODEC, ZP)                                                                                       \
    switch (G) {                                                                                             \
    case 16: aqd_block(w, rb, xq, out, CODEC, ZP, 1); break;                                                \
    case 32: aqd_block(w, rb, xq, out, CODEC, ZP, 2); break;                                                \
    case 64: aqd_block(w, rb, xq, out, CODEC, ZP, 4); break;                                                \
    default: aqd_block(w, rb, xq, out, CODEC, ZP, (int)(G / 16));                                           \
    }
        if (w->codec == MP_CODEC_Q8) {
            AQD(MP_CODEC_Q8, 0)
        } else if (w->codec == MP_CODEC_Q6) {
            AQD(MP_CODEC_Q6, 0)
        } else if (w->zero_point) {
            AQD(MP_CODEC_Q4, 1)
        } else {
            AQD(MP_CODEC_Q4, 0)
        }
#undef AQD
        const int64_t n = r1 - r < 8 ? r1 - r : 8;
        memcpy(y + (r - r0), out + (r - rb), (size_t)n * sizeof(float));
    }
}

const mpk_impl mpk_avx2_impl = {.name = "avx2", .row_dot = mpk_avx2_row_dots, .rvq_tables = a_rvq_tables,
                                .rvq_tiles = a_rvq_tiles, .mm_rows = mpk_avx2_mm_rows,
                                .rvq_gemm = mpk_avx2_rvq_gemm, .row_values = mpk_avx2_row_values,
                                .gemm_rows = mpk_avx2_gemm_rows, .rows_dot = mpk_avx2_rows_dot,
                                .qgemm_rows = a_qgemm_rows, .row_ints = mpk_avx2_row_ints,
                                .qdot_rows = mpk_avx2_qdot_rows};

#else
const mpk_impl mpk_avx2_impl = {.name = "avx2"};
const mpk_row_dot_fn mpk_avx2_row_dots[MPK_TRUNK_CODECS];
#endif
