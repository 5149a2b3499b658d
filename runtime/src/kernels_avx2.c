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

/* Eight codes of a grouped codec from column c (a multiple of 8) as int32: q8 the int8, q6 the
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
/* the same as floats */
AVX2 static inline __attribute__((always_inline)) __m256 codes8(const uint8_t *q, int64_t c, const int codec,
                                                                 __m256i off4) {
    return _mm256_cvtepi32_ps(codes8i(q, c, codec, off4));
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
AVX2 static inline __attribute__((always_inline)) __m256 q6_codes8_wide(const uint8_t *q, int64_t c) {
    return _mm256_cvtepi32_ps(q6_codes8i_wide(q, c));
}

/* Columns of row r from which q6_codes8_wide's 16-byte load stays inside the matrix: it may be
 * used at every multiple-of-8 column c below this. */
static inline int64_t q6_wide_cols(const mpk_mat *w, int64_t r) {
    const int64_t left = (w->rows - r) * (w->cols_p / 4 * 3); /* code bytes from row r to the end */
    return left < 16 ? 0 : ((left - 16) / 3 + 1) * 4;
}

/* Eight full groups' lane sums, the groups advancing together: eight independent add chains
 * instead of one group's at a time (bound by the add latency); each lane's order is unchanged. */
AVX2 static inline __attribute__((always_inline)) void lanes8x8(const uint8_t *q, const float *x, int64_t c0,
                                                                 int64_t G, const int codec, const int wide,
                                                                 __m256i off4, __m256 L[8]) {
    for (int i = 0; i < 8; i++) L[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < G; k += 8) {
        /* column c0 + k's code bytes and input, opaque to the compiler so that the eight groups'
         * loads are one base plus constant offsets: as eight separately stepped pointers they
         * spilled (16 pointers in 16 registers) */
        const int64_t c = c0 + k;
        const uint8_t *qk = q + (codec == MP_CODEC_Q8 ? c : codec == MP_CODEC_Q6 ? (c >> 2) * 3 : c >> 1);
        const float *xk = x + c;
        __asm__("" : "+r"(qk), "+r"(xk));
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const __m256 v = wide ? q6_codes8_wide(qk, i * G) : codes8(qk, i * G, codec, off4);
            L[i] = _mm256_add_ps(L[i], _mm256_mul_ps(v, _mm256_loadu_ps(xk + i * G)));
        }
    }
}

/* red8 of eight lane vectors at once: lane g is red8(L[g]) in red8's exact order (hadd adds
 * adjacent lanes twice, the last add joins the 128-bit halves). */
AVX2 static inline __m256 red8x8(const __m256 L[8]) {
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(L[0], L[1]), _mm256_hadd_ps(L[2], L[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(L[4], L[5]), _mm256_hadd_ps(L[6], L[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

#define PARTS_MAX 512 /* groups whose parts one pass keeps (2 KiB) */

/* A row's sum: its parts added in group order (row_dot's order) onto acc. */
static inline float parts_sum(const float *p, int64_t n, float acc) {
    for (int64_t i = 0; i < n; i++) acc += p[i];
    return acc;
}

/* Row r of a grouped codec (q8/q6/q4), groups [g0, g1) (g0 a multiple of 8): p[g - g0] = the
 * group's part as row_dot computes it (lane = element mod 8 of the group, multiply then add, red8,
 * times the scale, plus minimum x red8 of the input's lanes), the row's dot being the parts'
 * sum in group order (parts_sum).  Eight full groups at a time: their red8s and scale products in
 * one register (the scalar reduction was most of the time).  While it computes groups
 * g .. g + 7 it adds another row's parts g - g0 .. g - g0 + 7 onto *pacc (prev; NULL: none) and
 * returns how many it added: a row's sum is a chain of dependent adds, and right behind the
 * row's own products it filled the reorder window (docs/RUNTIME.md "Determinism (trunk, decode)"). */
AVX2 static inline __attribute__((always_inline)) int64_t grouped_parts(const mpk_mat *w, int64_t r, const float *x,
                                                                         const int codec, const int64_t GC, int64_t g0,
                                                                         int64_t g1, float *p, const float *prev,
                                                                         float *pacc) {
    const int64_t n = w->cols, G = GC ? GC : w->group, ng = w->ngroups;
    const uint8_t *sc = w->data + (size_t)(r * ng) * 2;
    const int zp = codec == MP_CODEC_Q4 && w->zero_point;
    const uint8_t *mins = w->data + (size_t)(w->rows * ng) * 2 + (size_t)(r * ng) * 2;
    const uint8_t *q = codec == MP_CODEC_Q8 ? mpk_q8_row(w, r) : codec == MP_CODEC_Q6 ? mpk_q6_row(w, r) : mpk_q4_row(w, r);
    const __m256i off4 = _mm256_set1_epi32(zp ? 0 : 8);
    const int64_t wide_end = codec == MP_CODEC_Q6 ? q6_wide_cols(w, r) : 0;
    float pa = prev ? *pacc : 0.0f;
    int64_t g = g0;
    const int64_t blk = codec == MP_CODEC_Q8 ? 8 * G : codec == MP_CODEC_Q6 ? 6 * G : 4 * G; /* 8 groups' bytes */
    for (; g + 8 <= g1 && (g + 8) * G <= n; g += 8) { /* eight full groups (G is a multiple of 8) */
        __m256 L[8], XL[8];
        /* rows are contiguous: fetch MPK_TRUNK_PF bytes ahead, into the next rows (decode streams
         * the trunk from RAM; the hardware prefetcher alone left the loads waiting: q8 4096x4096
         * in RAM 6.0-6.3 -> 8.0 G weights/s, one thread, Xeon 2026-12-03) */
        for (int64_t o = 0; o < blk; o += 64) _mm_prefetch((const char *)(q + g / 8 * blk + MPK_TRUNK_PF + o), _MM_HINT_T0);
        _mm_prefetch((const char *)(sc + 2 * g + MPK_TRUNK_PF / 16), _MM_HINT_T0);
        /* groups together (lanes8x8), measured against one group at a time (Zen 3, best of 5-6
         * alternating rounds): q8 1.0-1.1x, q6 1.2x and with the wide decode 1.45-1.8x, q4
         * 1.25-1.35x (with the one-broadcast decode); q4 with minimums keeps one group at a time
         * (its 16 accumulators) */
        if (codec == MP_CODEC_Q6 && (g + 8) * G - 8 < wide_end) {
            lanes8x8(q, x, g * G, G, MP_CODEC_Q6, 1, off4, L);
        } else if (!zp) {
            lanes8x8(q, x, g * G, G, codec, 0, off4, L);
        } else
            for (int i = 0; i < 8; i++) {
                __m256 l = _mm256_setzero_ps(), xl = _mm256_setzero_ps();
#pragma GCC unroll 4
                for (int64_t c = (g + i) * G; c < (g + i + 1) * G; c += 8) {
                    __m256 xv = _mm256_loadu_ps(x + c);
                    l = _mm256_add_ps(l, _mm256_mul_ps(codes8(q, c, codec, off4), xv));
                    if (zp) xl = _mm256_add_ps(xl, xv);
                }
                L[i] = l;
                XL[i] = xl;
            }
        __m256 part = _mm256_mul_ps(f16x8(sc + 2 * g), red8x8(L));
        if (zp) part = _mm256_add_ps(part, _mm256_mul_ps(f16x8(mins + 2 * g), red8x8(XL)));
        _mm256_storeu_ps(p + (g - g0), part);
        if (prev)
            for (int i = 0; i < 8; i++) pa += prev[g - g0 + i];
    }
    const int64_t added = g - g0;
    for (; g < g1; g++) {
        int64_t c0 = g * G, c1 = c0 + G < n ? c0 + G : n, c = c0;
        __m256 gl = _mm256_setzero_ps(), xl = _mm256_setzero_ps();
        for (; c + 8 <= c1; c += 8) { /* c is a multiple of 8: c0 is a multiple of G */
            __m256 xv = _mm256_loadu_ps(x + c);
            gl = _mm256_add_ps(gl, _mm256_mul_ps(codes8(q, c, codec, off4), xv));
            if (zp) xl = _mm256_add_ps(xl, xv);
        }
        float l[8], lx[8];
        _mm256_storeu_ps(l, gl);
        _mm256_storeu_ps(lx, xl);
        for (; c < c1; c++) {
            float v;
            if (codec == MP_CODEC_Q8) v = (float)((const int8_t *)q)[c];
            else if (codec == MP_CODEC_Q6) v = (float)(mpk_q6_code(q, c) - 32);
            else {
                int nib = (q[c >> 1] >> ((c & 1) * 4)) & 15;
                v = (float)(zp ? nib : nib - 8);
            }
            l[(c - c0) & 7] += v * x[c];
            lx[(c - c0) & 7] += x[c];
        }
        float part = mpk_f16_to_f32(ld16(sc + 2 * g)) * mpk_red8(l);
        if (zp) part += mpk_f16_to_f32(ld16(mins + 2 * g)) * mpk_red8(lx);
        p[g - g0] = part;
    }
    if (prev) *pacc = pa;
    return added;
}

/* Row r of a grouped codec times x (row_dot), PARTS_MAX groups per pass */
AVX2 static inline __attribute__((always_inline)) float grouped_dot(const mpk_mat *w, int64_t r, const float *x,
                                                                     const int codec, const int64_t GC) {
    float p[PARTS_MAX], acc = 0.0f;
    for (int64_t g0 = 0; g0 < w->ngroups; g0 += PARTS_MAX) {
        const int64_t g1 = g0 + PARTS_MAX < w->ngroups ? g0 + PARTS_MAX : w->ngroups;
        grouped_parts(w, r, x, codec, GC, g0, g1, p, NULL, NULL);
        acc = parts_sum(p, g1 - g0, acc);
    }
    return acc;
}

/* Rows [r0, r1) of a grouped codec with at most PARTS_MAX groups: row r's sum advances while
 * row r + 1's parts are computed (grouped_parts), the same bits as grouped_dot. */
AVX2 static inline __attribute__((always_inline)) void grouped_rows(const mpk_mat *w, int64_t r0, int64_t r1,
                                                                     const float *x, float *y, const int codec,
                                                                     const int64_t GC) {
    const int64_t ng = w->ngroups;
    float p[2][PARTS_MAX];
    for (int64_t r = r0; r < r1; r++) {
        float *cur = p[(r - r0) & 1];
        const float *prev = r > r0 ? p[(r - r0 - 1) & 1] : NULL;
        float acc = 0.0f;
        const int64_t added = grouped_parts(w, r, x, codec, GC, 0, ng, cur, prev, &acc);
        if (prev) y[r - 1 - r0] = parts_sum(prev + added, ng - added, acc);
    }
    y[r1 - 1 - r0] = parts_sum(p[(r1 - 1 - r0) & 1], ng, 0.0f);
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

/* q8 with group 32 (the common size): chunk loops unrolled, +10 % (q6/q4 gained nothing) */
AVX2 static float a_dot_q8(const mpk_mat *w, int64_t r, const float *x) {
    return w->group == 32 ? grouped_dot(w, r, x, MP_CODEC_Q8, 32) : grouped_dot(w, r, x, MP_CODEC_Q8, 0);
}
AVX2 static float a_dot_q6(const mpk_mat *w, int64_t r, const float *x) { return grouped_dot(w, r, x, MP_CODEC_Q6, 0); }
AVX2 static float a_dot_q4(const mpk_mat *w, int64_t r, const float *x) { return grouped_dot(w, r, x, MP_CODEC_Q4, 0); }

/* Rows [r0, r1) of an f32 matrix (columns a multiple of 8) eight at a time: a_dot_f32's lanes
 * per row (lane j sums columns j mod 8 in order, multiply then add) and red8x8 for red8, so each
 * row's bits are row_dot's; one row's single chain of cols / 8 dependent adds bound it.
 * q8, q6, q4: grouped_rows; f16, bf16: row by row. */
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
    const int grouped = w->codec == MP_CODEC_Q8 || w->codec == MP_CODEC_Q6 || w->codec == MP_CODEC_Q4;
    if (r < r1 && grouped && w->ngroups <= PARTS_MAX) {
        y += r - r0;
        if (w->codec == MP_CODEC_Q8 && w->group == 32) grouped_rows(w, r, r1, x, y, MP_CODEC_Q8, 32);
        else if (w->codec == MP_CODEC_Q8) grouped_rows(w, r, r1, x, y, MP_CODEC_Q8, 0);
        else if (w->codec == MP_CODEC_Q6) grouped_rows(w, r, r1, x, y, MP_CODEC_Q6, 0);
        else grouped_rows(w, r, r1, x, y, MP_CODEC_Q4, 0);
        return;
    }
    for (; r < r1; r++) y[r - r0] = mpk_avx2_row_dots[w->codec](w, r, x);
}

/* also the AVX-512 table's trunk products */
const mpk_row_dot_fn mpk_avx2_row_dots[MPK_TRUNK_CODECS] = {
    [MP_CODEC_F32] = a_dot_f32, [MP_CODEC_F16] = a_dot_f16, [MP_CODEC_BF16] = a_dot_bf16,
    [MP_CODEC_Q8] = a_dot_q8,   [MP_CODEC_Q6] = a_dot_q6,   [MP_CODEC_Q4] = a_dot_q4};

/* Rows [r0, r1) times many inputs: one input per lane.  Per input this is exactly row_dot's
 * arithmetic (lane j of a group sums elements j mod 8 with separate multiply and add, the lanes
 * are reduced in red8's order, groups scaled and summed in order), done for 8 inputs at once on
 * inputs stored transposed, with each row's codes decoded once per task (mm_decode).
 *
 * The products of RB rows (RB = 1 or 2) with one block of 8 inputs: each input lane follows
 * row_dot's order exactly (8 lanes of element mod 8 per group, red8, group scale).  Two rows share
 * each input load; with AVX-512VL's 32 vector registers their 16 accumulators stay in registers. */
AVX2 static inline __attribute__((always_inline)) void
mm_block(const mpk_mat *w, const float *wr0, const float *sc0, const float *mn0, const float *X,
         const float *xl, int64_t b, int64_t cp, int64_t ng, int grouped, const int RB, __m256 acc[2]) {
    const int64_t C = w->cols, G = grouped ? w->group : C;
    for (int k = 0; k < RB; k++) acc[k] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * G, c1 = c0 + G < C ? c0 + G : C, c = c0;
        __m256 L[2][8];
        #pragma GCC unroll 2
        for (int k = 0; k < RB; k++)
            #pragma GCC unroll 8
            for (int i = 0; i < 8; i++) L[k][i] = _mm256_setzero_ps();
        for (; c + 8 <= c1; c += 8) /* lane i: elements c0 + i mod 8 (c0 % 8 == 0) */
            #pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                __m256 xv = _mm256_loadu_ps(X + (c + i) * 8);
                #pragma GCC unroll 2
                for (int k = 0; k < RB; k++)
                    L[k][i] = _mm256_add_ps(L[k][i], _mm256_mul_ps(_mm256_broadcast_ss(wr0 + k * cp + c + i), xv));
            }
        for (; c < c1; c++)
            #pragma GCC unroll 2
            for (int k = 0; k < RB; k++)
                L[k][(c - c0) & 7] = _mm256_add_ps(L[k][(c - c0) & 7],
                                                   _mm256_mul_ps(_mm256_broadcast_ss(wr0 + k * cp + c), _mm256_loadu_ps(X + c * 8)));
        #pragma GCC unroll 2
        for (int k = 0; k < RB; k++) {
            /* red8: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) */
            __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(L[k][0], L[k][1]), _mm256_add_ps(L[k][2], L[k][3])),
                                     _mm256_add_ps(_mm256_add_ps(L[k][4], L[k][5]), _mm256_add_ps(L[k][6], L[k][7])));
            if (!grouped) {
                acc[k] = s;
                continue;
            }
            __m256 part = _mm256_mul_ps(_mm256_broadcast_ss(sc0 + k * ng + g), s);
            if (w->zero_point)
                part = _mm256_add_ps(part, _mm256_mul_ps(_mm256_broadcast_ss(mn0 + k * ng + g),
                                                         _mm256_loadu_ps(xl + (size_t)(b * ng + g) * 8)));
            acc[k] = _mm256_add_ps(acc[k], part);
        }
    }
}

/* Row r's numbers as row_dot multiplies them (mpk_row_codes), 8 columns per instruction for
 * q8, q6, q4, f16 and bf16; f32 and the tails in scalar. */
AVX2 static void a_codes_q8(const mpk_mat *w, int64_t r, float *o, float *sc, float *mn) {
    const int64_t C = w->cols;
    const uint8_t *q = mpk_q8_row(w, r);
    int64_t c = 0;
    for (; c + 8 <= C; c += 8) _mm256_storeu_ps(o + c, codes8(q, c, MP_CODEC_Q8, _mm256_setzero_si256()));
    for (; c < C; c++) o[c] = (float)((const int8_t *)q)[c];
    mpk_group_scales(w, r, sc, mn);
}

AVX2 static void a_codes_q6(const mpk_mat *w, int64_t r, float *o, float *sc, float *mn) {
    const int64_t C = w->cols;
    const uint8_t *q = mpk_q6_row(w, r);
    const int64_t wide_end = q6_wide_cols(w, r);
    int64_t c = 0;
    for (; c + 8 <= C && c < wide_end; c += 8) _mm256_storeu_ps(o + c, q6_codes8_wide(q, c));
    for (; c < C; c++) o[c] = (float)(mpk_q6_code(q, c) - 32);
    mpk_group_scales(w, r, sc, mn);
}

AVX2 static void a_codes_q4(const mpk_mat *w, int64_t r, float *o, float *sc, float *mn) {
    const int64_t C = w->cols;
    mpk_group_scales(w, r, sc, mn);
    const uint8_t *q = mpk_q4_row(w, r);
    const __m256i off = _mm256_set1_epi32(w->zero_point ? 0 : 8);
    int64_t c = 0;
    for (; c + 8 <= C; c += 8) _mm256_storeu_ps(o + c, codes8(q, c, MP_CODEC_Q4, off));
    for (; c < C; c++) o[c] = (float)(((q[c >> 1] >> ((c & 1) * 4)) & 15) - (w->zero_point ? 0 : 8));
}

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
    [MP_CODEC_F32] = mpk_row_codes, [MP_CODEC_F16] = a_codes_f16, [MP_CODEC_BF16] = a_codes_bf16,
    [MP_CODEC_Q8] = a_codes_q8,     [MP_CODEC_Q6] = a_codes_q6,    [MP_CODEC_Q4] = a_codes_q4};

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

/* mpk_row's values 8-wide: the codes as floats, then code x scale (+ minimum), the same
 * operations; sc, mn: ngroups floats of scratch */
AVX2 void mpk_avx2_row_values(const mpk_mat *w, int64_t r, float *out, float *sc, float *mn) {
    a_row_codes[w->codec](w, r, out, w->group ? sc : NULL, mn);
    if (!w->group) return;
    const int64_t G = w->group, C = w->cols;
    for (int64_t g = 0; g < w->ngroups; g++) {
        const int64_t c1 = (g + 1) * G < C ? (g + 1) * G : C;
        const __m256 s = _mm256_set1_ps(sc[g]), m = _mm256_set1_ps(w->zero_point ? mn[g] : 0.0f);
        int64_t c = g * G;
        for (; c + 8 <= c1; c += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(out + c), s);
            _mm256_storeu_ps(out + c, w->zero_point ? _mm256_add_ps(v, m) : v);
        }
        for (; c < c1; c++) out[c] = w->zero_point ? out[c] * sc[g] + mn[g] : out[c] * sc[g];
    }
}

AVX2 static inline __attribute__((always_inline)) void
mm_rows_body(const mpk_mat *w, int64_t r0, int64_t r1, const float *xt, const float *xl, int64_t nb,
             int64_t n, float *y, float *wb) {
    const int64_t C = w->cols, cp = w->cols_p, R = r1 - r0;
    const int grouped = w->group != 0;
    const int64_t ng = grouped ? w->ngroups : 1;
    float *sc = wb + (size_t)(R * cp), *mn = sc + (size_t)(R * ng);
    for (int64_t r = r0; r < r1; r++)
        a_row_codes[w->codec](w, r, wb + (size_t)((r - r0) * cp), sc + (r - r0) * ng, mn + (r - r0) * ng);
    for (int64_t b = 0; b < nb; b++) {
        const float *X = xt + (size_t)(b * C) * 8;
        for (int64_t r = r0; r < r1;) {
            const int64_t i = r - r0;
            __m256 acc[2];
            int rb = r + 1 < r1 ? 2 : 1;
            if (rb == 2)
                mm_block(w, wb + (size_t)(i * cp), sc + i * ng, mn + i * ng, X, xl, b, cp, ng, grouped, 2, acc);
            else
                mm_block(w, wb + (size_t)(i * cp), sc + i * ng, mn + i * ng, X, xl, b, cp, ng, grouped, 1, acc);
            for (int k = 0; k < rb; k++) {
                float v[8];
                _mm256_storeu_ps(v, acc[k]);
                for (int64_t t = 0; t < 8 && b * 8 + t < n; t++) y[(b * 8 + t) * w->rows + r + k] = v[t];
            }
            r += rb;
        }
    }
}

AVX2 void mpk_avx2_mm_rows(const mpk_mat *w, int64_t r0, int64_t r1, const float *xt, const float *xl,
                           int64_t nb, int64_t n, float *y, float *wb) {
    mm_rows_body(w, r0, r1, xt, xl, nb, n, y, wb);
}

/* The same code where AVX-512VL gives 32 vector registers (the AVX-512 table's trunk product). */
__attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512vl"))) void
mpk_avx512vl_mm_rows(const mpk_mat *w, int64_t r0, int64_t r1, const float *xt, const float *xl, int64_t nb,
                     int64_t n, float *y, float *wb) {
    mm_rows_body(w, r0, r1, xt, xl, nb, n, y, wb);
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

const mpk_impl mpk_avx2_impl = {.name = "avx2", .row_dot = mpk_avx2_row_dots, .rvq_tables = a_rvq_tables,
                                .rvq_tiles = a_rvq_tiles, .mm_rows = mpk_avx2_mm_rows,
                                .rvq_gemm = mpk_avx2_rvq_gemm, .row_values = mpk_avx2_row_values,
                                .gemm_rows = mpk_avx2_gemm_rows, .rows_dot = mpk_avx2_rows_dot,
                                .qgemm_rows = a_qgemm_rows, .row_ints = mpk_avx2_row_ints};

#else
const mpk_impl mpk_avx2_impl = {.name = "avx2"};
const mpk_row_dot_fn mpk_avx2_row_dots[MPK_TRUNK_CODECS];
#endif
