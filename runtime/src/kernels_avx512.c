/* AVX-512 kernels for routed experts, bit-identical to the scalar path: the table product
 * (CODECS.md §3.5) with VBMI, the prefill product (§3.6) with VNNI.
 *
 * A (vector, stage) table of 256 int8 entries is four zmm registers; vpermi2b looks 64 codes up
 * in two 128-entry halves at once and a blend on code bit 7 picks the half.  The 64 lanes are the
 * 64 rows of a code tile, so one table load serves a whole tile (several tiles per load here).
 * Trunk matrices use the AVX2 kernels, except q8's decode product. */
#include "kernels_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,fma,bmi2")))
#define AVX512N __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,fma,bmi2")))

/* T for vectors v .. v + NV - 1 (VE x 16 entries per step): each codebook load serves NV fma
 * chains (one vector at a time, loads bound it: 38 -> 26 us for a 1536-column table) */
AVX512 static inline __attribute__((always_inline)) void v_tab_rows(const float *cs, const float *x, int64_t cols,
                                                                    int64_t v, float (*T)[256], __m512i *mx,
                                                                    const int NV, const int VE) {
    const __m512i absm = _mm512_set1_epi32(0x7fffffff);
    __m512 X[4][8];
#pragma GCC unroll 4
    for (int k = 0; k < NV; k++)
#pragma GCC unroll 8
        for (int d = 0; d < 8; d++) X[k][d] = _mm512_set1_ps(8 * (v + k) + d < cols ? x[8 * (v + k) + d] : 0.0f);
    for (int e = 0; e < 256; e += 16 * VE) {
        __m512 a[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < VE; i++) {
            const __m512 c = _mm512_loadu_ps(cs + e + 16 * i);
#pragma GCC unroll 4
            for (int k = 0; k < NV; k++) a[k][i] = _mm512_mul_ps(X[k][0], c);
        }
#pragma GCC unroll 8
        for (int d = 1; d < 8; d++)
#pragma GCC unroll 4
            for (int i = 0; i < VE; i++) {
                const __m512 c = _mm512_loadu_ps(cs + d * 256 + e + 16 * i);
#pragma GCC unroll 4
                for (int k = 0; k < NV; k++) a[k][i] = _mm512_fmadd_ps(X[k][d], c, a[k][i]);
            }
#pragma GCC unroll 4
        for (int k = 0; k < NV; k++)
#pragma GCC unroll 4
            for (int i = 0; i < VE; i++) {
                _mm512_store_ps(&T[k][e + 16 * i], a[k][i]);
                *mx = _mm512_max_epu32(*mx, _mm512_and_si512(_mm512_castps_si512(a[k][i]), absm));
            }
    }
}

/* Same steps as the scalar path: T = x0 * cb0, then an fma per dimension in order, 16 entries
 * per register; max |T| as integer bits; q written directly. */
AVX512 static void v_rvq_tables(const float *cbt, const float *x, mpk_rvq_tab *t, int64_t g, int st) {
    const int S = t->stages;
    const int64_t v0 = g * MPK_RVQ_GROUP;
    const int64_t v1 = v0 + MPK_RVQ_GROUP < t->nv ? v0 + MPK_RVQ_GROUP : t->nv;
    const float *cs = cbt + (size_t)st * 8 * 256;
    float T[MPK_RVQ_GROUP][256] __attribute__((aligned(64)));
    __m512i mx = _mm512_setzero_si512();
    int64_t v = v0;
    for (; v + 4 <= v1; v += 4) v_tab_rows(cs, x, t->cols, v, T + (v - v0), &mx, 4, 2);
    for (; v < v1; v++) v_tab_rows(cs, x, t->cols, v, T + (v - v0), &mx, 1, 4);
    float inv = 0.0f, dd;
    int live = mpk_rvq_scale((uint32_t)_mm512_reduce_max_epu32(mx), 127.0f, &inv, &dd);
    t->d[g * S + st] = dd;
    const __m512 vi = _mm512_set1_ps(inv);
    for (int64_t v = v0; v < v1; v++) {
        int8_t *q = t->q + ((size_t)v * (size_t)S + (size_t)st) * 256;
        for (int e = 0; e < 256; e += 64) {
            /* product rounded to f32, then to the even integer (MXCSR default rounding); |n| <= 127
             * when live, so the saturating packs keep every value (then dword k of 128-bit lane l,
             * entries 16k + 4l.., goes back to dword 4k + l) */
            __m512i n[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                n[i] = live ? _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_load_ps(&T[v - v0][e + 16 * i]), vi))
                            : _mm512_setzero_si512();
            const __m512i b = _mm512_packs_epi16(_mm512_packs_epi32(n[0], n[1]), _mm512_packs_epi32(n[2], n[3]));
            const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
            _mm512_storeu_si512((void *)(q + e), _mm512_permutexvar_epi32(order, b));
        }
    }
}

/* int8 lookups of 64 codes in one (vector, stage) table held in four registers: vpermi2b looks
 * up both 128-entry halves, a blend on code bit 7 picks one. */
AVX512 static inline __attribute__((always_inline)) __m512i
v_look(const __m512i t[4], __m512i code) {
    __mmask64 hi = _mm512_movepi8_mask(code);
    return _mm512_mask_blend_epi8(hi, _mm512_permutex2var_epi8(t[0], code, t[1]),
                                  _mm512_permutex2var_epi8(t[2], code, t[3]));
}

/* Tuning (override with -D to measure): code lines prefetched ahead of each tile's read
 * position, stages per pass, tiles per table load.  With codes in RAM, four tiles read as four
 * strictly sequential streams ran 1.7-2.3x the previous group-hopping order (LEARNED.md).
 * The prefetches go to L2 (T1): into L1 (T0) they ran slower, 64 lines ahead or 24 alike
 * (Zen 4, rvq3 4096x1536 in RAM, one thread: 34 -> 44-47 G weights/s; likely L1's few miss
 * buffers, not measured). */
#ifndef V_PF
#define V_PF 64
#endif

/* Stages [s0, s0 + SC) of one group for NB tiles: for each vector, every stage of the chunk in
 * turn, so each tile's codes are read strictly in storage order (one sequential stream per
 * tile); int8 lookups summed in int16 lanes split into even and odd rows (|n| <= 32 * 127
 * fits), then per stage in order f32(n) fma'd with d into p[tile][k][16]: k = 0 even rows 0-30,
 * 1 even rows 32-62, 2 odd rows 1-31, 3 odd rows 33-63 (the order cvtepi16_epi32 widens to). */
AVX512 static inline __attribute__((always_inline)) void
v_stages(const int8_t *q, const uint8_t *c, size_t tile_bytes, int64_t v0, int64_t v1, int S,
         int s0, const float *d, float (*p)[4][16], const int NB, const int SC) {
    __m512i ev[8][4], od[8][4];
#pragma GCC unroll 8
    for (int b = 0; b < NB; b++)
#pragma GCC unroll 4
        for (int s = 0; s < SC; s++) ev[b][s] = od[b][s] = _mm512_setzero_si512();
    for (int64_t v = v0; v < v1; v++) {
#pragma GCC unroll 4
        for (int s = 0; s < SC; s++) {
            size_t j = (size_t)(v * S + s0 + s);
            const int8_t *tab = q + j * 256;
            const __m512i t[4] = {_mm512_load_si512(tab), _mm512_load_si512(tab + 64),
                                  _mm512_load_si512(tab + 128), _mm512_load_si512(tab + 192)};
#pragma GCC unroll 8
            for (int b = 0; b < NB; b++) {
                const uint8_t *cl = c + b * tile_bytes + j * 64;
                _mm_prefetch((const char *)(cl + V_PF * 64), _MM_HINT_T1);
                __m512i r = v_look(t, _mm512_loadu_si512(cl));
                ev[b][s] = _mm512_add_epi16(ev[b][s], _mm512_srai_epi16(_mm512_slli_epi16(r, 8), 8));
                od[b][s] = _mm512_add_epi16(od[b][s], _mm512_srai_epi16(r, 8));
            }
        }
    }
#pragma GCC unroll 4
    for (int s = 0; s < SC; s++) {
        const __m512 dv = _mm512_set1_ps(d[s0 + s]);
#pragma GCC unroll 8
        for (int b = 0; b < NB; b++) {
            __m512i n[4] = {_mm512_cvtepi16_epi32(_mm512_castsi512_si256(ev[b][s])),
                            _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(ev[b][s], 1)),
                            _mm512_cvtepi16_epi32(_mm512_castsi512_si256(od[b][s])),
                            _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(od[b][s], 1))};
#pragma GCC unroll 8
            for (int k = 0; k < 4; k++)
                _mm512_storeu_ps(p[b][k], _mm512_fmadd_ps(_mm512_cvtepi32_ps(n[k]), dv, _mm512_loadu_ps(p[b][k])));
        }
    }
}

#ifndef V_SC
#define V_SC 4
#endif
#ifndef V_NB
#define V_NB 4
#endif

/* Stages in passes of up to V_SC (V_NB x 2 x V_SC int16 accumulators, 4 table registers). */
AVX512 static void v_group(const int8_t *q, const uint8_t *c, size_t tile_bytes, int64_t v0, int64_t v1,
                           int S, const float *d, float (*p)[4][16], int64_t nb) {
    for (int s0 = 0; s0 < S;) {
        int sc = S - s0 <= V_SC ? S - s0 : V_SC;
#define V_CASES(NB)                                                                          \
        switch (sc) {                                                                        \
        case 4: v_stages(q, c, tile_bytes, v0, v1, S, s0, d, p, NB, 4); break;               \
        case 3: v_stages(q, c, tile_bytes, v0, v1, S, s0, d, p, NB, 3); break;               \
        case 2: v_stages(q, c, tile_bytes, v0, v1, S, s0, d, p, NB, 2); break;               \
        default: v_stages(q, c, tile_bytes, v0, v1, S, s0, d, p, NB, 1); break;              \
        }
        if (nb == V_NB) {
            V_CASES(V_NB)
        } else if (nb == 2) {
            V_CASES(2)
        } else {
            V_CASES(1)
        }
#undef V_CASES
        s0 += sc;
    }
}

AVX512 static void v_rvq_acc(const mpk_rvq *w, const mpk_rvq_tab *t, int64_t tile0, int64_t ntiles,
                             int64_t g0, int64_t g1, float *pf) {
    const int S = w->stages;
    const int64_t nv = w->nv, J = nv * S;
    const size_t tile_bytes = (size_t)J * 64;
    float (*p)[4][16] = (float (*)[4][16])pf;
    for (int64_t i = 0; i < ntiles;) {
        int64_t nb = ntiles - i >= V_NB ? V_NB : ntiles - i >= 2 ? 2 : 1;
        const uint8_t *c = w->codes + (size_t)(tile0 + i) * tile_bytes;
        for (int64_t g = g0; g < g1; g++) {
            int64_t v0 = g * MPK_RVQ_GROUP, v1 = v0 + MPK_RVQ_GROUP < nv ? v0 + MPK_RVQ_GROUP : nv;
            v_group(t->q, c, tile_bytes, v0, v1, S, t->d + g * S, p + i, nb);
        }
        i += nb;
    }
}

static void v_rvq_unperm(const float *pf, int64_t ntiles, float *acc) {
    const float (*p)[4][16] = (const float (*)[4][16])pf;
    for (int64_t i = 0; i < ntiles; i++)
        for (int m = 0; m < 16; m++) {
            float *o = acc + i * 64;
            o[2 * m] = p[i][0][m];
            o[32 + 2 * m] = p[i][1][m];
            o[2 * m + 1] = p[i][2][m];
            o[33 + 2 * m] = p[i][3][m];
        }
}

AVX512 static void v_rvq_tiles(const mpk_rvq *w, const mpk_rvq_tab *t, int64_t tile0, int64_t ntiles,
                               float *acc) {
    float p[MPK_RVQ_MAX_TILES * 64] __attribute__((aligned(64)));
    memset(p, 0, sizeof p);
    v_rvq_acc(w, t, tile0, ntiles, 0, t->ngroups, p);
    v_rvq_unperm(p, ntiles, acc);
}

/* ---- the prefill product (§3.6) with VNNI ----
 * One row a lane: the panel holds each column pair of the 16 rows in one zmm (wp[pair][row][2]),
 * and vpdpwssd adds a pair's two products into each row's int32 lane, the input's pair broadcast
 * by the instruction.  A lane takes 64 products (32 pairs, below 2^31, exact) before its sums go
 * to binary64 (exact), so a group's sum needs no reduction across lanes. */
#define VG_SEG 32 /* column pairs a lane sums before they go to binary64 */

/* §3.6's decoded weights of kp vectors of the 16 rows from their codes (c, S stages) in column
 * pairs: per vector the 16 rows' stage sums (8 int16 each, as mpk_rvq_decode_rows) transposed
 * into its four pairs' registers */
AVX512N static inline __attribute__((always_inline)) void vg_decode(const uint8_t *c, const mpk_rvq_icb *cb,
                                                                    int64_t kp, const int S, int16_t *wp) {
    for (int64_t v = 0; v < kp; v++, c += (size_t)S * 64) {
        uint64_t cw[MPK_RVQ_MAX_STAGES][2];
        mpk_rvq_vector_codes(c, S, cw);
        __m128i sum[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) sum[i] = mpk_rvq_row_sum((const uint64_t (*)[2])cw, cb, S, i);
        /* z[k] lane m = row 4m + k; a 4 x 4 transpose of 32-bit pairs in every 128-bit lane then
         * gives pair j of rows 0..15 in order */
        __m512i z[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            z[k] = _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(sum[k]), sum[4 + k], 1),
                                                         sum[8 + k], 2), sum[12 + k], 3);
        const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
        const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
        int16_t *o = wp + (size_t)v * 4 * 32;
        _mm512_store_si512(o, _mm512_unpacklo_epi64(t0, t2));
        _mm512_store_si512(o + 32, _mm512_unpackhi_epi64(t0, t2));
        _mm512_store_si512(o + 64, _mm512_unpacklo_epi64(t1, t3));
        _mm512_store_si512(o + 96, _mm512_unpackhi_epi64(t1, t3));
    }
}

/* §3.6 steps 3-4 for the 16 rows and NT <= 8 inputs over npairs column pairs of one group:
 * acc[t][row] = fma(f32(n), dg[t], acc) (first group: onto +0) */
AVX512N static inline __attribute__((always_inline)) void
vg_rows(const int16_t *wp, const int16_t *const *xp, const float *dg, int64_t npairs, int first, float *acc,
        const int NT) {
    __m512d lo[8], hi[8];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm512_setzero_pd();
    for (int64_t k0 = 0; k0 < npairs; k0 += VG_SEG) {
        const int64_t k1 = k0 + VG_SEG < npairs ? k0 + VG_SEG : npairs;
        __m512i s[8];
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) s[t] = _mm512_setzero_si512();
        for (int64_t k = k0; k < k1; k++) {
            const __m512i w = _mm512_load_si512(wp + k * 32);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) /* in place: as an intrinsic GCC copied every sum twice a step */
                __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(s[t]) : "v"(w), "m"(*(const int32_t *)(xp[t] + 2 * k)));
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            lo[t] = _mm512_add_pd(lo[t], _mm512_cvtepi32_pd(_mm512_castsi512_si256(s[t])));
            hi[t] = _mm512_add_pd(hi[t], _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(s[t], 1)));
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) { /* each group sum rounded once to binary32 */
        const __m512 n = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm512_cvtpd_ps(lo[t]))),
                                                             _mm256_castps_pd(_mm512_cvtpd_ps(hi[t])), 1));
        const __m512 prev = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + t * MPK_GEMM_ROWS);
        _mm512_storeu_ps(acc + t * MPK_GEMM_ROWS, _mm512_fmadd_ps(n, _mm512_set1_ps(dg[t]), prev));
    }
}

AVX512N static void v_rvq_gemm(const mpk_rvq *w, const mpk_rvq_icb *cb, const uint8_t *xq, size_t xqs, int64_t n,
                               int64_t r0, float *acc) {
    const int S = w->stages;
    const int64_t nv = w->nv;
    const uint8_t *codes = w->codes + (size_t)((r0 / 64) * nv * S) * 64 + (size_t)(r0 % 64);
    int16_t wp[MPK_GEMM_ROWS * MPK_RVQ_XGROUP * 8] __attribute__((aligned(64)));
    for (int64_t v0 = 0, g = 0; v0 < nv; v0 += MPK_RVQ_XGROUP, g++) { /* one panel per group */
        const int64_t kp = nv - v0 < MPK_RVQ_XGROUP ? nv - v0 : MPK_RVQ_XGROUP;
        const uint8_t *c = codes + (size_t)(v0 * S) * 64;
        switch (S) { /* the common stage counts unrolled */
        case 2: vg_decode(c, cb, kp, 2, wp); break;
        case 3: vg_decode(c, cb, kp, 3, wp); break;
        case 4: vg_decode(c, cb, kp, 4, wp); break;
        default: vg_decode(c, cb, kp, S, wp);
        }
        for (int64_t t = 0; t < n; t += 8) { /* inputs by eight, then the last one to seven */
            const int nt = n - t >= 8 ? 8 : (int)(n - t);
            const int16_t *xp[8];
            float dg[8];
            mpk_rvq_gemm_inputs(xq, xqs, w->cols, t, nt, v0, g, xp, dg);
#define VG(NT) vg_rows(wp, xp, dg, 4 * kp, v0 == 0, acc + t * MPK_GEMM_ROWS, NT);
            MPK_SWITCH8(nt, VG)
#undef VG
        }
    }
}

/* ---- the trunk's prefill product (mpk_gemm) ----
 * AVX2's gemm_rows with two rows per zmm: the panel wb[v][row][8] holds rows 2m, 2m + 1 of vector
 * v in one 64-byte line and each input's vector is broadcast to both halves, so one fma serves
 * two rows; every lane keeps its own fma chain in vector order, so the bits are AVX2's. */
#define VGEMM_KP 32
/* the 16 rows times NT <= 3 inputs (24 accumulators) over the panel's kp vectors */
AVX512 static inline __attribute__((always_inline)) void vgemm_rows16(const float *wb, const float *x, int64_t xs,
                                                                     int64_t kp, int first, float *a, const int NT) {
    __m512 c[3][8];
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++)
            c[t][m] = first ? _mm512_setzero_ps() : _mm512_load_ps(a + ((size_t)t * MPK_GEMM_ROWS + 2 * (size_t)m) * 8);
    for (int64_t v = 0; v < kp; v++) {
        __m512 xb[3];
        if (!(v & 1)) /* the next inputs' line at this column: x comes from L2 in short runs */
#pragma GCC unroll 3
            for (int t = 0; t < NT; t++) _mm_prefetch((const char *)(x + (size_t)(NT + t) * (size_t)xs + 8 * v), _MM_HINT_T0);
#pragma GCC unroll 3
        for (int t = 0; t < NT; t++) /* 256 bits to both halves; f64x4: AVX512F (f32x8 needs DQ) */
            xb[t] = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)(x + (size_t)t * (size_t)xs + 8 * v))));
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) {
            __m512 w = _mm512_load_ps(wb + ((size_t)v * MPK_GEMM_ROWS + 2 * (size_t)m) * 8);
            /* in a register: GCC folds the load into each of the NT fmas, 3 loads per weight
             * (Zen 5, one thread: 53-64 -> 68-76 G multiply-adds/s) */
            __asm__("" : "+v"(w));
#pragma GCC unroll 3
            for (int t = 0; t < NT; t++) c[t][m] = _mm512_fmadd_ps(w, xb[t], c[t][m]);
        }
    }
#pragma GCC unroll 3
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 8
        for (int m = 0; m < 8; m++) _mm512_store_ps(a + ((size_t)t * MPK_GEMM_ROWS + 2 * (size_t)m) * 8, c[t][m]);
}

AVX512 static void v_gemm_rows(const float *wb, int64_t nv, const float *x, int64_t xs, int64_t n, float *acc) {
    for (int64_t v0 = 0; v0 < nv; v0 += VGEMM_KP) {
        const int64_t kp = nv - v0 < VGEMM_KP ? nv - v0 : VGEMM_KP;
        const float *wp = wb + (size_t)v0 * MPK_GEMM_ROWS * 8, *xv = x + v0 * 8;
        int64_t t = 0;
        for (; t + 3 <= n; t += 3) vgemm_rows16(wp, xv + t * xs, xs, kp, v0 == 0, acc + (size_t)t * MPK_GEMM_ROWS * 8, 3);
        if (n - t == 2) vgemm_rows16(wp, xv + t * xs, xs, kp, v0 == 0, acc + (size_t)t * MPK_GEMM_ROWS * 8, 2);
        if (n - t == 1) vgemm_rows16(wp, xv + t * xs, xs, kp, v0 == 0, acc + (size_t)t * MPK_GEMM_ROWS * 8, 1);
    }
}

/* ---- the trunk's integer prefill product (CODECS.md §2.4) ----
 * AVX2's with the block's sixteen rows in one register and vpdpwssd (a column pair's two products
 * added into each row's int32 lane, exact) for NT <= 8 inputs, each input's pair broadcast from
 * memory by the instruction itself. */
AVX512N static inline __attribute__((always_inline)) void
vqg_rows(const int16_t *wq, const float *sc, const float *mn, int64_t ng, int64_t group, const uint8_t *xq, size_t xqs,
         float *acc, const int NT) {
    const int16_t *q[8];
    const float *d[8];
    mpk_tq_inputs(xq, xqs, ng * group, NT, q, d);
    __m512 f[8];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) f[t] = _mm512_setzero_ps();
    const int64_t np = group / 2;
    for (int64_t g = 0; g < ng; g++) {
        __m512i s[8];
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) s[t] = _mm512_setzero_si512();
        const int16_t *wg = wq + (size_t)(g * np) * MPK_GEMM_ROWS * 2;
        for (int64_t k = 0; k < np; k++) {
            const __m512i w = _mm512_load_si512(wg + k * 32);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) /* in place, as vg_tile's */
                __asm__("vpdpwssd %2%{1to16%}, %1, %0"
                        : "+v"(s[t])
                        : "v"(w), "m"(*(const int32_t *)(q[t] + g * group + 2 * k)));
        }
        const __m512 s0 = _mm512_loadu_ps(sc + g * MPK_GEMM_ROWS);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++)
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(s0, _mm512_set1_ps(d[t][g])), f[t]);
        if (mn) {
            const __m512 m0 = _mm512_loadu_ps(mn + g * MPK_GEMM_ROWS);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                f[t] = _mm512_fmadd_ps(_mm512_set1_ps(d[t][ng + g]), _mm512_mul_ps(m0, _mm512_set1_ps(d[t][g])), f[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(acc + t * MPK_GEMM_ROWS, f[t]);
}

AVX512N static void v_qgemm_rows(const int16_t *wq, const float *sc, const float *mn, int64_t ng, int64_t group,
                                 const uint8_t *xq, size_t xqs, int64_t n, float *acc) {
    for (int64_t t = 0; t < n; t += 8) {
        const uint8_t *x = xq + (size_t)t * xqs;
        float *a = acc + t * MPK_GEMM_ROWS;
#define VIG(NT) vqg_rows(wq, sc, mn, ng, group, x, xqs, a, NT);
        MPK_SWITCH8(n - t >= 8 ? 8 : (int)(n - t), VIG)
#undef VIG
    }
}

/* ---- the trunk's one-input integer product (CODECS.md §2.4: decode, the lm_head) ----
 * Sixteen rows a block, read as stored: each (row, group)'s codes widened to int16 and multiplied
 * with the group's integer input by vpdpwssd into the row's own register, then one transpose-and-
 * add tree turns the sixteen registers into the sixteen rows' group sums (exact in any order), and
 * the combine runs with a row a lane in group order, as §2.4 step 4 writes it. */

/* q6: for word k of 32 codes, the two bytes (of the 24) its 6 bits start in */
static const uint8_t vq_q6_pick[64] __attribute__((aligned(64))) = {
    0, 1, 0, 1, 1, 2, 2, 2, 3, 4, 3, 4, 4, 5, 5, 5, 6, 7, 6, 7, 7, 8, 8, 8, 9, 10, 9, 10, 10, 11, 11, 11,
    12, 13, 12, 13, 13, 14, 14, 14, 15, 16, 15, 16, 16, 17, 17, 17, 18, 19, 18, 19, 19, 20, 20, 20, 21, 22, 21, 22, 22, 23, 23, 23};

/* 32 codes from column c of a row whose codes start at q, in column order, as stored: q8 the int8,
 * q6 the 6-bit code and q4 the nibble without their offsets (vqd_block takes those off once per
 * group); with CW < 32 (groups of 8 or 16) only columns c .. c + CW - 1, the rest zero, and no
 * byte read past them */
AVX512N static inline __attribute__((always_inline)) __m512i vq_codes(const uint8_t *q, int64_t c, const int codec,
                                                                       const int CW) {
    __m512i v;
    if (codec == MP_CODEC_Q8) {
        return _mm512_cvtepi8_epi16(CW < 32 ? _mm256_maskz_loadu_epi8((1u << CW) - 1, q + c)
                                            : _mm256_loadu_si256((const __m256i *)(q + c)));
    } else if (codec == MP_CODEC_Q6) { /* word k takes the two bytes its 6 bits start in */
        const __m512i b = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8((1u << (CW / 4 * 3)) - 1, q + c / 4 * 3));
        const __m512i pick = _mm512_loadu_si512(vq_q6_pick);
        const __m512i sh = _mm512_set4_epi32(0x00020004, 0x00060000, 0x00020004, 0x00060000);
        v = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi8(pick, b), sh), _mm512_set1_epi16(63));
    } else { /* q4: byte j -> the dword (low nibble, high nibble) of columns c + 2j, c + 2j + 1 */
        const __m512i d = _mm512_cvtepu8_epi32(CW < 32 ? _mm_maskz_loadu_epi8((1u << (CW / 2)) - 1, q + c / 2)
                                                       : _mm_loadu_si128((const __m128i *)(q + c / 2)));
        v = _mm512_ternarylogic_epi32(d, _mm512_slli_epi32(d, 12), _mm512_set1_epi32(0x000f000f), 0xa8);
    }
    return CW < 32 ? _mm512_maskz_mov_epi16((1u << CW) - 1, v) : v;
}

/* lane i = the sum of a[i]'s sixteen lanes */
AVX512 static inline __attribute__((always_inline)) __m512i v_sum16x16(const __m512i a[16]) {
    __m512i b[8], c[4], e[2];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) /* per 128-bit lane: (a0 + a2, b0 + b2, a1 + a3, b1 + b3) */
        b[j] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * j], a[2 * j + 1]), _mm512_unpackhi_epi32(a[2 * j], a[2 * j + 1]));
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) /* per 128-bit lane: rows 4m .. 4m + 3 */
        c[m] = _mm512_add_epi32(_mm512_unpacklo_epi64(b[2 * m], b[2 * m + 1]), _mm512_unpackhi_epi64(b[2 * m], b[2 * m + 1]));
    for (int h = 0; h < 2; h++)
        e[h] = _mm512_add_epi32(_mm512_shuffle_i32x4(c[2 * h], c[2 * h + 1], 0x88),
                                _mm512_shuffle_i32x4(c[2 * h], c[2 * h + 1], 0xdd));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(e[0], e[1], 0x88), _mm512_shuffle_i32x4(e[0], e[1], 0xdd));
}

/* out[j][i] = the f16 at p + i * ps + 2 (g0 + j) for sixteen rows' groups g0 .. g0 + 15 (zero past
 * ng): a 16 x 16 transpose of 16-bit values in four unpack steps (one 32-bit gather a group took
 * a third of the product on Zen 4) */
AVX512 static inline __attribute__((always_inline)) void vq_f16_t16(const uint8_t *p, size_t ps, int64_t ng,
                                                                    int64_t g0, uint16_t out[16][16]) {
    const __mmask16 live = ng - g0 >= 16 ? 0xffff : (__mmask16)((1u << (ng - g0)) - 1);
    __m256i a[16], b[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) a[i] = _mm256_maskz_loadu_epi16(live, p + i * ps + 2 * g0);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        b[i] = _mm256_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
        b[i + 8] = _mm256_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            a[8 * h + i] = _mm256_unpacklo_epi32(b[8 * h + 2 * i], b[8 * h + 2 * i + 1]);
            a[8 * h + i + 4] = _mm256_unpackhi_epi32(b[8 * h + 2 * i], b[8 * h + 2 * i + 1]);
        }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++)
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++) {
            b[4 * q + i] = _mm256_unpacklo_epi64(a[4 * q + 2 * i], a[4 * q + 2 * i + 1]);
            b[4 * q + i + 2] = _mm256_unpackhi_epi64(a[4 * q + 2 * i], a[4 * q + 2 * i + 1]);
        }
    /* now b[2j] holds rows 0-7 of group j (low lane) and of group j + 8 (high lane), b[2j + 1]
     * rows 8-15 of the same two groups */
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        _mm_store_si128((__m128i *)out[j], _mm256_castsi256_si128(b[2 * j]));
        _mm_store_si128((__m128i *)out[j] + 1, _mm256_castsi256_si128(b[2 * j + 1]));
        _mm_store_si128((__m128i *)out[j + 8], _mm256_extracti128_si256(b[2 * j], 1));
        _mm_store_si128((__m128i *)out[j + 8] + 1, _mm256_extracti128_si256(b[2 * j + 1], 1));
    }
}

/* Each row's codes are prefetched (to L2) a block of rows ahead as its group starts a line: two
 * threads each streaming sixteen rows left the loads waiting (q8 2048 x 7168 in RAM, one thread,
 * Zen 4: 14.7 -> 17.4 G weights/s; 1-row and 256 B - 4 KiB distances, or L1, measured no better). */
#define VQ_PF_ROWS 16

/* rows r .. r + 15, to out[16]; NCH chunks of CW <= 32 columns a group (the group size NCH x CW) */
AVX512N static inline __attribute__((always_inline)) void vqd_block(const mpk_mat *w, int64_t r, const uint8_t *xq,
                                                                     float *out, const int codec, const int zp,
                                                                     const int CW, const int NCH) {
    const int64_t ng = w->ngroups, G = (int64_t)CW * NCH;
    const int64_t bpg = codec == MP_CODEC_Q8 ? G : codec == MP_CODEC_Q6 ? G / 4 * 3 : G / 2; /* code bytes a group */
    const size_t rs = (size_t)(ng * bpg), ss = (size_t)ng * 2; /* row strides of the codes and the scales */
    const uint8_t *k0 = mpk_grouped_row(w, r);
    const uint8_t *s0 = w->data + (size_t)(r * ng) * 2, *m0 = s0 + (size_t)(w->rows * ng) * 2;
    uint16_t st[16][16] __attribute__((aligned(32))), mt[16][16] __attribute__((aligned(32)));
    const int16_t *q = (const int16_t *)xq;
    const float *d = mpk_tq_steps(xq, w->cols_p), *z = d + ng;
    __m512 a = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *kg = k0 + g * bpg;
        if ((g * bpg) % 64 < bpg)
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) _mm_prefetch((const char *)(kg + (VQ_PF_ROWS + i) * rs), _MM_HINT_T1);
        if (g % 16 == 0) { /* the next sixteen groups' scales (and minimums) with a row a lane */
            vq_f16_t16(s0, ss, ng, g, st);
            if (zp) vq_f16_t16(m0, ss, ng, g, mt);
        }
        __m512i acc[16];
        const __m512i x0 = _mm512_loadu_si512(q + g * G); /* past CW columns it meets zero codes */
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) acc[i] = _mm512_madd_epi16(vq_codes(kg + i * rs, 0, codec, CW), x0);
#pragma GCC unroll 8
        for (int h = 1; h < NCH; h++) {
            const __m512i xv = _mm512_loadu_si512(q + g * G + h * 32);
            const uint8_t *kc = kg + h * (bpg / NCH);
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) acc[i] = _mm512_dpwssd_epi32(acc[i], vq_codes(kc + i * rs, 0, codec, CW), xv);
        }
        /* the codes' offset (q6 32, symmetric q4 8) once per group: n = sum (k + off) q - off sum q */
        const int off = codec == MP_CODEC_Q6 ? 32 : codec == MP_CODEC_Q4 && !zp ? 8 : 0;
        __m512i ni = v_sum16x16(acc);
        if (off) ni = _mm512_sub_epi32(ni, _mm512_set1_epi32(off * (int32_t)z[g]));
        const __m512 n = _mm512_cvtepi32_ps(ni), dg = _mm512_set1_ps(d[g]);
        const __m512 sv = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)st[g % 16]));
        a = _mm512_fmadd_ps(n, _mm512_mul_ps(sv, dg), a);
        if (zp) {
            const __m512 mv = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)mt[g % 16]));
            a = _mm512_fmadd_ps(_mm512_set1_ps(z[g]), _mm512_mul_ps(mv, dg), a);
        }
    }
    _mm512_storeu_ps(out, a);
}

/* Blocks of sixteen rows; a last short block is the matrix's sixteen rows ending there (rows
 * computed twice give the same bits), matrices of fewer rows the scalar kernel's. */
AVX512N static void v_qdot_rows(const mpk_mat *w, int64_t r0, int64_t r1, const uint8_t *xq, float *y) {
    const int64_t G = w->group;
    if (w->codec == MP_CODEC_Q8) {
        mpk_avx2_qdot_rows(w, r0, r1, xq, y);
        return;
    }
    if (w->rows < 16 || (G != 8 && G != 16 && G % 32)) { /* such groups: only the C API makes them */
        mpk_scalar_impl.qdot_rows(w, r0, r1, xq, y);
        return;
    }
    for (int64_t r = r0; r < r1; r += 16) {
        const int64_t rb = r + 16 <= w->rows ? r : w->rows - 16;
        float out[16];
#define VQD(CODEC, ZP)                                                                                       \
    switch (G) {                                                                                             \
    case 8: vqd_block(w, rb, xq, out, CODEC, ZP, 8, 1); break;                                              \
    case 16: vqd_block(w, rb, xq, out, CODEC, ZP, 16, 1); break;                                            \
    case 32: vqd_block(w, rb, xq, out, CODEC, ZP, 32, 1); break;                                            \
    case 64: vqd_block(w, rb, xq, out, CODEC, ZP, 32, 2); break;                                            \
    default: vqd_block(w, rb, xq, out, CODEC, ZP, 32, (int)(G / 32));                                       \
    }
        if (w->codec == MP_CODEC_Q8) {
            VQD(MP_CODEC_Q8, 0)
        } else if (w->codec == MP_CODEC_Q6) {
            VQD(MP_CODEC_Q6, 0)
        } else if (w->zero_point) {
            VQD(MP_CODEC_Q4, 1)
        } else {
            VQD(MP_CODEC_Q4, 0)
        }
#undef VQD
        const int64_t n = r1 - r < 16 ? r1 - r : 16;
        memcpy(y + (r - r0), out + (r - rb), (size_t)n * sizeof(float));
    }
}

/* mpk_wsum sixteen columns a zmm (AVX2's eight heads x eight columns per step, twice the columns
 * per instruction; each element the same multiply then add over the rows in order, so the same
 * bits); the last columns AVX2's */
/* 16 columns from c of heads h0 .. h0 + HN: their sums in registers over all rows (HN and F16
 * fixed, so that the loop carries no per-head test) */
AVX512 static inline __attribute__((always_inline)) void
wsum16(float *out, int64_t os, const float *w, int64_t ws, const void *rows, size_t rs, int64_t nt, int64_t c,
       const int HN, const int F16) {
    __m512 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < HN; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t t = 0; t < nt; t++) {
        const uint8_t *r = (const uint8_t *)rows + (size_t)t * rs;
        if (t + MPK_ROWS_AHEAD < nt)
            _mm_prefetch((const char *)(r + MPK_ROWS_AHEAD * rs + c * (F16 ? 2 : 4)), _MM_HINT_T0);
        const __m512 v = F16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + 2 * c)))
                             : _mm512_loadu_ps((const float *)(const void *)r + c);
#pragma GCC unroll 8
        for (int i = 0; i < HN; i++) acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(_mm512_set1_ps(w[i * ws + t]), v));
    }
#pragma GCC unroll 8
    for (int i = 0; i < HN; i++) _mm512_storeu_ps(out + i * os + c, acc[i]);
}

AVX512 void mpk_avx512_wsum(float *out, int64_t os, int nh, const float *w, int64_t ws, const void *rows, size_t rs,
                            int f16, int64_t nt, int64_t n) {
    int64_t c = 0;
    for (; c + 16 <= n; c += 16)
        for (int h0 = 0; h0 < nh; h0 += 8) {
            float *o = out + h0 * os;
            const float *wh = w + h0 * ws;
#define WSUM_HN(HN)                                                                     \
    if (f16) wsum16(o, os, wh, ws, rows, rs, nt, c, HN, 1);                             \
    else wsum16(o, os, wh, ws, rows, rs, nt, c, HN, 0);
            MPK_SWITCH8(nh - h0 < 8 ? nh - h0 : 8, WSUM_HN)
#undef WSUM_HN
        }
    if (c < n)
        mpk_avx2_wsum(out + c, os, nh, w, ws, (const uint8_t *)rows + (size_t)c * (f16 ? 2 : 4), rs, f16, nt, n - c);
}

const mpk_impl mpk_avx512_impl = {.name = "avx512vbmi", .row_dot = mpk_avx2_row_dots, .rows_dot = mpk_avx2_rows_dot, .rvq_tables = v_rvq_tables,
                                  .rvq_tiles = v_rvq_tiles, .mm_rows = mpk_avx512vl_mm_rows,
                                  .rvq_gemm = v_rvq_gemm,
                                  .row_values = mpk_avx2_row_values, .gemm_rows = v_gemm_rows,
                                  .qgemm_rows = v_qgemm_rows, .row_ints = mpk_avx2_row_ints,
                                  .qdot_rows = v_qdot_rows};
/* the same, with the prefill product on AMX tiles (kernels_amx.c) for calls of 16 inputs (one
 * tile block) or more: below that VNNI's is faster (Intel Xeon, 2026-12-05, one thread,
 * 4096 x 1536 and 1536 x 4096, three stages, ns a weight x input, AMX vs VNNI: 12 inputs
 * 0.0166-0.0173 vs 0.0154-0.0159, 16 inputs 0.0126-0.0129 vs 0.0134-0.0139) */
const mpk_impl mpk_avx512amx_impl = {.name = "avx512amx", .row_dot = mpk_avx2_row_dots, .rows_dot = mpk_avx2_rows_dot,
                                     .rvq_tables = v_rvq_tables, .rvq_tiles = v_rvq_tiles,
                                     .mm_rows = mpk_avx512vl_mm_rows, .rvq_gemm = v_rvq_gemm,
                                     .rvq_gemm_tiles = mpk_amx_rvq_gemm, .rvq_gemm_xbytes = mpk_amx_xbytes,
                                     .rvq_gemm_xprep = mpk_amx_xprep, .rvq_gemm_tiles_min = 16,
                                     .row_values = mpk_avx2_row_values, .gemm_rows = v_gemm_rows,
                                  .qgemm_rows = v_qgemm_rows, .row_ints = mpk_avx2_row_ints,
                                  .qdot_rows = v_qdot_rows};

#else
const mpk_impl mpk_avx512_impl = {.name = "avx512vbmi"};
const mpk_impl mpk_avx512amx_impl = {.name = "avx512amx"};
#endif
