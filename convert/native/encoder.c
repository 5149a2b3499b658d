/* The rvq encoder's hot loops (converter only; the engine never encodes): see encoder.h. */
#include "encoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define D MP_VQ_DIM

/* Nearest-codeword search uses the expanded distance: score_j = |c_j|^2 - 2 (x . c_j), with
 * dot = x0*c0, then + x1*c1, ... + x7*c7 (f32, in order from the first product) and
 * |c_j|^2 summed the same way; |x - c_j|^2 = |x|^2 + score_j, so ranking by score is ranking by
 * distance. Codebooks are transposed to [D][KP] (KP = k rounded up to 8; padding entries are zero
 * with |c|^2 = +inf so they never win) and 4 vectors are scored against 8 entries at a time with
 * GCC/Clang vector extensions. Every lane performs the scalar definition's operations in the
 * scalar order, and there is no FMA (-ffp-contract=off, no "fma" target), so the AVX2 and the
 * baseline SSE2 clone give identical bits. */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
#define KP(k) (((k) + 7) & ~7)
#define BLK 4 /* vectors scored together */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MP_NO_CLONES)
#define MP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MP_CLONES
#endif

typedef struct {
    int k, kp;
    float cbt[D * 256]; /* [D][kp] */
    float cn[256];      /* |c_j|^2, +inf for padding */
} tcb_t;

static void prepare_cb(const float *cb, int k, tcb_t *t) {
    t->k = k;
    t->kp = KP(k);
    for (int j = 0; j < t->kp; j++) {
        float n = 0.0f;
        for (int d = 0; d < D; d++) {
            float c = j < k ? cb[(size_t)j * D + d] : 0.0f;
            t->cbt[d * t->kp + j] = c;
            n = n + c * c;
        }
        t->cn[j] = j < k ? n : (float)INFINITY;
    }
}

/* scores[v][j] for BLK vectors x[BLK][D] (rows beyond the caller's count are ignored). */
static inline void scores4(const float *x, const tcb_t *t, float *scores) {
    const int kp = t->kp;
    for (int j = 0; j < kp; j += 8) {
        v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, c, n;
        for (int d = 0; d < D; d++) {
            memcpy(&c, t->cbt + d * kp + j, sizeof c);
            a0 = a0 + x[d] * c;
            a1 = a1 + x[D + d] * c;
            a2 = a2 + x[2 * D + d] * c;
            a3 = a3 + x[3 * D + d] * c;
        }
        memcpy(&n, t->cn + j, sizeof n);
        a0 = n - (a0 + a0);
        a1 = n - (a1 + a1);
        a2 = n - (a2 + a2);
        a3 = n - (a3 + a3);
        memcpy(scores + j, &a0, sizeof a0);
        memcpy(scores + kp + j, &a1, sizeof a1);
        memcpy(scores + 2 * kp + j, &a2, sizeof a2);
        memcpy(scores + 3 * kp + j, &a3, sizeof a3);
    }
}

/* Index of the smallest score, ties -> lowest index (lane-wise strict minimum, then the lowest
 * index among lanes holding the minimum: the same answer as a scalar left-to-right scan). */
static inline int argmin(const float *sc, int kp) {
    v8f best, v;
    v8i bi = {0, 1, 2, 3, 4, 5, 6, 7}, ji = bi, eight = {8, 8, 8, 8, 8, 8, 8, 8};
    memcpy(&best, sc, sizeof best);
    for (int j = 8; j < kp; j += 8) {
        ji = ji + eight;
        memcpy(&v, sc + j, sizeof v);
        v8i m = v < best;
        best = (v8f)(((v8i)v & m) | ((v8i)best & ~m));
        bi = (ji & m) | (bi & ~m);
    }
    int b = bi[0];
    float bv = best[0];
    for (int l = 1; l < 8; l++)
        if (best[l] < bv || (best[l] == bv && bi[l] < b)) {
            bv = best[l];
            b = bi[l];
        }
    return b;
}

static float sqnorm(const float *r) {
    float n = 0.0f;
    for (int d = 0; d < D; d++) n = n + r[d] * r[d];
    return n;
}

MP_CLONES
static void assign_range(const float *x, size_t n, const tcb_t *t, int32_t *idx, float *dist) {
    float xb[BLK * D], sc[BLK * 256];
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        memset(xb, 0, sizeof xb);
        memcpy(xb, x + i * D, m * D * sizeof(float));
        scores4(xb, t, sc);
        for (size_t v = 0; v < m; v++) {
            int b = argmin(sc + v * t->kp, t->kp);
            idx[i + v] = b;
            if (dist) {
                float e = sqnorm(xb + v * D) + sc[v * t->kp + b];
                dist[i + v] = e > 0.0f ? e : 0.0f;
            }
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MP_NO_CLONES)
#include <immintrin.h>
#define MP_HAVE_AVX2_PATHS 1
static int have_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
}

/* Last step of a blocked argmin: per vector, the lowest lane score (ties to the lowest entry
 * index), and its squared distance |x|^2 + score clamped at 0. bv/bj hold m rows of `lanes`. */
static void finish_block(const float *bv, const int32_t *bj, int lanes, size_t m,
                         const float *xb, int32_t *idx, float *dist) {
    for (size_t v = 0; v < m; v++) {
        const float *sv = bv + v * (size_t)lanes;
        const int32_t *jv = bj + v * (size_t)lanes;
        int b = jv[0];
        float best = sv[0];
        for (int l = 1; l < lanes; l++)
            if (sv[l] < best || (sv[l] == best && jv[l] < b)) {
                best = sv[l];
                b = jv[l];
            }
        idx[v] = b;
        if (dist) {
            float e = sqnorm(xb + v * D) + best;
            dist[v] = e > 0.0f ? e : 0.0f;
        }
    }
}

/* assign_range() without storing the scores: the same scores4() arithmetic (0 + x0*c0 + x1*c1 ...
 * in order, then |c|^2 - (a + a)), the same lane-wise strict minimum over groups of 8 starting
 * from group 0, and the same final lane reduction as argmin(), so the same index and distance. */
__attribute__((target("avx2"))) static void assign_avx2(const float *x, size_t n, const tcb_t *t,
                                                       int32_t *idx, float *dist) {
    const int kp = t->kp;
    float xb[BLK * D], bv[BLK][8];
    int32_t bj[BLK][8];
    const __m256i eight = _mm256_set1_epi32(8);
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        memset(xb, 0, sizeof xb);
        memcpy(xb, x + i * D, m * D * sizeof(float));
        __m256 b0 = _mm256_undefined_ps(), b1 = b0, b2 = b0, b3 = b0;
        __m256i ji = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), i0 = ji, i1 = ji, i2 = ji, i3 = ji;
        for (int j = 0; j < kp; j += 8) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < D; d++) {
                __m256 c = _mm256_loadu_ps(t->cbt + d * kp + j);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_broadcast_ss(xb + d), c));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(_mm256_broadcast_ss(xb + D + d), c));
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(_mm256_broadcast_ss(xb + 2 * D + d), c));
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(_mm256_broadcast_ss(xb + 3 * D + d), c));
            }
            __m256 cn = _mm256_loadu_ps(t->cn + j);
            a0 = _mm256_sub_ps(cn, _mm256_add_ps(a0, a0));
            a1 = _mm256_sub_ps(cn, _mm256_add_ps(a1, a1));
            a2 = _mm256_sub_ps(cn, _mm256_add_ps(a2, a2));
            a3 = _mm256_sub_ps(cn, _mm256_add_ps(a3, a3));
            if (j == 0) {
                b0 = a0, b1 = a1, b2 = a2, b3 = a3;
                continue;
            }
            ji = _mm256_add_epi32(ji, eight);
#define MP_TAKE(a, b, bi)                                                                          \
    do {                                                                                           \
        __m256 lt = _mm256_cmp_ps(a, b, _CMP_LT_OQ);                                               \
        b = _mm256_blendv_ps(b, a, lt);                                                            \
        bi = _mm256_castps_si256(                                                                  \
            _mm256_blendv_ps(_mm256_castsi256_ps(bi), _mm256_castsi256_ps(ji), lt));               \
    } while (0)
            MP_TAKE(a0, b0, i0);
            MP_TAKE(a1, b1, i1);
            MP_TAKE(a2, b2, i2);
            MP_TAKE(a3, b3, i3);
#undef MP_TAKE
        }
        _mm256_storeu_ps(bv[0], b0);
        _mm256_storeu_ps(bv[1], b1);
        _mm256_storeu_ps(bv[2], b2);
        _mm256_storeu_ps(bv[3], b3);
        _mm256_storeu_si256((__m256i *)bj[0], i0);
        _mm256_storeu_si256((__m256i *)bj[1], i1);
        _mm256_storeu_si256((__m256i *)bj[2], i2);
        _mm256_storeu_si256((__m256i *)bj[3], i3);
        finish_block(bv[0], bj[0], 8, m, xb, idx + i, dist ? dist + i : NULL);
    }
}
#endif

#ifdef MP_HAVE_AVX2_PATHS
static int have_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
}

/* All |v| < 2^40 (so no score is NaN and the argmin is the first least score in any lane split). */
static int all_finite_small(const float *v, size_t n) {
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= fabsf(v[i]) < 0x1p40f;
    return ok;
}

/* scores4() 16 entries at a time (kp % 16 == 0): every score is the same f32 operations in the
 * same order, so the same bits. */
__attribute__((target("avx512f"), noinline)) static void scores4_avx512(const float *x,
                                                                        const tcb_t *t,
                                                                        float *scores) {
    const int kp = t->kp;
    for (int j = 0; j < kp; j += 16) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < D; d++) {
            __m512 c = _mm512_loadu_ps(t->cbt + d * kp + j);
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_set1_ps(x[d]), c));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_set1_ps(x[D + d]), c));
            a2 = _mm512_add_ps(a2, _mm512_mul_ps(_mm512_set1_ps(x[2 * D + d]), c));
            a3 = _mm512_add_ps(a3, _mm512_mul_ps(_mm512_set1_ps(x[3 * D + d]), c));
        }
        __m512 cn = _mm512_loadu_ps(t->cn + j);
        _mm512_storeu_ps(scores + j, _mm512_sub_ps(cn, _mm512_add_ps(a0, a0)));
        _mm512_storeu_ps(scores + kp + j, _mm512_sub_ps(cn, _mm512_add_ps(a1, a1)));
        _mm512_storeu_ps(scores + 2 * kp + j, _mm512_sub_ps(cn, _mm512_add_ps(a2, a2)));
        _mm512_storeu_ps(scores + 3 * kp + j, _mm512_sub_ps(cn, _mm512_add_ps(a3, a3)));
    }
}
#define SCORES4(x, t, sc, wide) ((wide) ? scores4_avx512(x, t, sc) : scores4(x, t, sc))
#else
#define SCORES4(x, t, sc, wide) ((void)(wide), scores4(x, t, sc))
#endif

#ifdef MP_HAVE_AVX2_PATHS
/* assign_avx2() with 16 entries per lane group (kp % 16 == 0). Each score is the same f32 sum;
 * with no NaN (checked by the caller), "least score, then lowest index" is the same answer for
 * any split of the entries into lanes. */
__attribute__((target("avx512f"))) static void assign_avx512(const float *x, size_t n,
                                                             const tcb_t *t, int32_t *idx,
                                                             float *dist) {
    const int kp = t->kp;
    float xb[BLK * D], bv[BLK][16];
    int32_t bj[BLK][16];
    const __m512i sixteen = _mm512_set1_epi32(16);
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        memset(xb, 0, sizeof xb);
        memcpy(xb, x + i * D, m * D * sizeof(float));
        __m512 b0 = _mm512_set1_ps(INFINITY), b1 = b0, b2 = b0, b3 = b0;
        __m512i ji = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512i i0 = ji, i1 = ji, i2 = ji, i3 = ji;
        for (int j = 0; j < kp; j += 16) {
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < D; d++) {
                __m512 c = _mm512_loadu_ps(t->cbt + d * kp + j);
                a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_set1_ps(xb[d]), c));
                a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_set1_ps(xb[D + d]), c));
                a2 = _mm512_add_ps(a2, _mm512_mul_ps(_mm512_set1_ps(xb[2 * D + d]), c));
                a3 = _mm512_add_ps(a3, _mm512_mul_ps(_mm512_set1_ps(xb[3 * D + d]), c));
            }
            __m512 cn = _mm512_loadu_ps(t->cn + j);
            a0 = _mm512_sub_ps(cn, _mm512_add_ps(a0, a0));
            a1 = _mm512_sub_ps(cn, _mm512_add_ps(a1, a1));
            a2 = _mm512_sub_ps(cn, _mm512_add_ps(a2, a2));
            a3 = _mm512_sub_ps(cn, _mm512_add_ps(a3, a3));
            if (j == 0) {
                b0 = a0, b1 = a1, b2 = a2, b3 = a3;
                continue;
            }
            ji = _mm512_add_epi32(ji, sixteen);
#define MP_TAKE(a, b, bi)                                                                          \
    do {                                                                                           \
        __mmask16 lt = _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ);                                       \
        b = _mm512_mask_mov_ps(b, lt, a);                                                          \
        bi = _mm512_mask_mov_epi32(bi, lt, ji);                                                    \
    } while (0)
            MP_TAKE(a0, b0, i0);
            MP_TAKE(a1, b1, i1);
            MP_TAKE(a2, b2, i2);
            MP_TAKE(a3, b3, i3);
#undef MP_TAKE
        }
        _mm512_storeu_ps(bv[0], b0);
        _mm512_storeu_ps(bv[1], b1);
        _mm512_storeu_ps(bv[2], b2);
        _mm512_storeu_ps(bv[3], b3);
        _mm512_storeu_si512(bj[0], i0);
        _mm512_storeu_si512(bj[1], i1);
        _mm512_storeu_si512(bj[2], i2);
        _mm512_storeu_si512(bj[3], i3);
        finish_block(bv[0], bj[0], 16, m, xb, idx + i, dist ? dist + i : NULL);
    }
}
#endif

int mp_vq_assign(const float *x, size_t n, const float *cb, int k, int32_t *idx, float *dist) {
    tcb_t t;
    if (k < 1 || k > 256) return -1;
    prepare_cb(cb, k, &t);
#ifdef MP_HAVE_AVX2_PATHS
    if (t.kp % 16 == 0 && have_avx512() && all_finite_small(cb, (size_t)k * D) &&
        all_finite_small(x, n * D)) {
        assign_avx512(x, n, &t, idx, dist);
        return 0;
    }
    if (have_avx2()) {
        assign_avx2(x, n, &t, idx, dist);
        return 0;
    }
#endif
    assign_range(x, n, &t, idx, dist);
    return 0;
}

#ifdef MP_HAVE_AVX2_PATHS
/* 8 vectors at a time: the squared differences are transposed so that lane l holds vector l's,
 * then summed d = 0..7 in order from 0 (the scalar order); min(acc, d) is the scalar
 * `acc < d ? acc : d`, NaN included. The f64 total is summed in index order as below. */
__attribute__((target("avx2"))) static size_t mindist_avx2(const float *x, size_t n,
                                                           const float *c, float *d,
                                                           double *total) {
    const __m256 cv = _mm256_loadu_ps(c);
    double tot = 0.0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 r[8];
        for (int l = 0; l < 8; l++) {
            __m256 t = _mm256_sub_ps(_mm256_loadu_ps(x + (i + l) * D), cv);
            r[l] = _mm256_mul_ps(t, t);
        }
        __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
        __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
        __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
        __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
        __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
        __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        __m256 col[8] = {
            _mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
            _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
            _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
            _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < D; j++) acc = _mm256_add_ps(acc, col[j]);
        __m256 dv = _mm256_min_ps(acc, _mm256_loadu_ps(d + i));
        _mm256_storeu_ps(d + i, dv);
        for (int l = 0; l < 8; l++) tot += (double)d[i + l];
    }
    *total = tot;
    return i;
}
#endif

double mp_vq_mindist_update(const float *x, size_t n, const float *c, float *d) {
    double total = 0.0;
    size_t i0 = 0;
#ifdef MP_HAVE_AVX2_PATHS
    if (have_avx2()) i0 = mindist_avx2(x, n, c, d, &total);
#endif
    for (size_t i = i0; i < n; i++) {
        float acc = 0.0f;
        for (int j = 0; j < D; j++) {
            float t = x[i * D + j] - c[j];
            acc = acc + t * t;
        }
        if (acc < d[i]) d[i] = acc;
        total += (double)d[i];
    }
    return total;
}

size_t mp_vq_pick(const float *d, size_t n, double target) {
    double cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += (double)d[i];
        if (cum > target) return i;
    }
    return n - 1;
}

int mp_vq_update(const float *x, size_t n, const int32_t *idx, int k, float *cb) {
    double sum[256 * D];
    size_t cnt[256];
    if (k < 1 || k > 256) return -1;
    memset(sum, 0, sizeof(double) * (size_t)k * D);
    memset(cnt, 0, sizeof(size_t) * (size_t)k);
    for (size_t i = 0; i < n; i++) {
        int j = idx[i];
        if (j < 0 || j >= k) return -1;
        cnt[j]++;
        for (int d = 0; d < D; d++) sum[(size_t)j * D + d] += (double)x[i * D + d];
    }
    int empty = 0;
    for (int j = 0; j < k; j++) {
        if (!cnt[j]) {
            empty++;
            continue;
        }
        for (int d = 0; d < D; d++)
            cb[(size_t)j * D + d] = (float)(sum[(size_t)j * D + d] / (double)cnt[j]);
    }
    return empty;
}

/* Greedy RVQ: BLK vectors in lock-step, stage by stage, residual -= chosen codeword. */
MP_CLONES
static void greedy_range(const float *x, size_t n, const float *cb, const tcb_t *t, int stages,
                         uint8_t *codes) {
    float res[BLK * D], sc[BLK * 256];
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        memset(res, 0, sizeof res);
        memcpy(res, x + i * D, m * D * sizeof(float));
        for (int s = 0; s < stages; s++) {
            const float *cbs = cb + (size_t)s * t[s].k * D;
            scores4(res, &t[s], sc);
            for (size_t v = 0; v < BLK; v++) {
                int b = argmin(sc + v * t[s].kp, t[s].kp);
                if (v < m) codes[(i + v) * stages + s] = (uint8_t)b;
                for (int d = 0; d < D; d++) res[v * D + d] = res[v * D + d] - cbs[b * D + d];
            }
        }
    }
}

#ifdef MP_HAVE_AVX2_PATHS
/* greedy_range() with each stage's nearest entry found by assign_avx512() (the same scores and the
 * same first least one) when the block's residuals are finite and small (so no NaN can arise),
 * else by the baseline scores4() + argmin(). Residual updates are the same f32 subtractions. */
static void greedy_avx512(const float *x, size_t n, const float *cb, const tcb_t *t, int stages,
                          uint8_t *codes) {
    float res[BLK * D], sc[BLK * 256];
    int32_t b4[BLK];
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        memset(res, 0, sizeof res);
        memcpy(res, x + i * D, m * D * sizeof(float));
        for (int s = 0; s < stages; s++) {
            const float *cbs = cb + (size_t)s * t[s].k * D;
            if (all_finite_small(res, BLK * D)) {
                assign_avx512(res, BLK, &t[s], b4, NULL);
            } else {
                scores4(res, &t[s], sc);
                for (int v = 0; v < BLK; v++) b4[v] = argmin(sc + v * t[s].kp, t[s].kp);
            }
            for (size_t v = 0; v < BLK; v++) {
                int b = b4[v];
                if (v < m) codes[(i + v) * stages + s] = (uint8_t)b;
                for (int d = 0; d < D; d++) res[v * D + d] = res[v * D + d] - cbs[b * D + d];
            }
        }
    }
}
#endif

/* Beam search. A path: total squared error so far (|r|^2 of its residual, kept as
 * |r_parent|^2 + score), residual, codes. Candidates (parent p, entry j) are offered in (p, j)
 * order to a sorted list of the `beam` best; equal errors go after existing ones, so ties keep
 * the earlier path, then the lower entry. */
typedef struct {
    float err;
    float res[D];
    uint8_t code[8];
} path_t;

typedef struct {
    float err;
    int parent, code;
} cand_t;

static inline void push(cand_t *top, int *nt, int beam, float err, int parent, int code) {
    if (*nt == beam && !(err < top[beam - 1].err)) return;
    int i = *nt < beam ? (*nt)++ : beam - 1;
    while (i > 0 && err < top[i - 1].err) {
        top[i] = top[i - 1];
        i--;
    }
    top[i].err = err;
    top[i].parent = parent;
    top[i].code = code;
}

/* push() every candidate (perr + sc[j], parent, j), j = 0..k-1 in order. Once the list is full,
 * groups of 8 entries none of which beats the current worst are skipped: push() would reject
 * each of them, so the result is the same. */
static inline void offer(cand_t *top, int *nt, int beam, float perr, const float *sc, int k,
                         int parent) {
    for (int j0 = 0; j0 < k; j0 += 8) {
        if (*nt == beam) {
            v8f e, pe = {perr, perr, perr, perr, perr, perr, perr, perr};
            memcpy(&e, sc + j0, sizeof e);
            e = pe + e;
            float w = top[beam - 1].err;
            v8i m = e < (v8f){w, w, w, w, w, w, w, w};
            if (!(m[0] | m[1] | m[2] | m[3] | m[4] | m[5] | m[6] | m[7])) continue;
        }
        int j1 = j0 + 8 < k ? j0 + 8 : k;
        for (int j = j0; j < j1; j++) push(top, nt, beam, perr + sc[j], parent, j);
    }
}

/* offer() with the same result, faster: AVX2 only, for finite scores and beam <= 8 (the caller
 * checks that no error can be NaN). The final list is the `beam` least candidates by (err, offer
 * order), so candidates that cannot be among them may be left out as long as the rest are offered
 * in order. The 8 lane minima of this path's errors belong to 8 distinct candidates; a candidate
 * whose error exceeds the beam-th least of them has `beam` strictly better ones from this path and
 * is dropped (ties are kept). When the list is full, candidates not below its worst are dropped
 * too. The errors are the same f32 sums perr + sc[j] as offer()'s. */
#ifdef MP_HAVE_AVX2_PATHS
#define MP_OFFER_AVX2 1
__attribute__((target("avx2"), noinline)) static void offer_avx2(cand_t *top, int *nt, int beam,
                                                                 float perr, const float *sc,
                                                                 int kp, int k, int parent) {
    /* lane minima (-0/+0 make no difference: they are only compared), 4 independent chains */
    __m256 pe = _mm256_set1_ps(perr), mn = _mm256_add_ps(pe, _mm256_loadu_ps(sc));
    int j0 = 8;
    if (kp >= 32) {
        __m256 m1 = _mm256_add_ps(pe, _mm256_loadu_ps(sc + 8));
        __m256 m2 = _mm256_add_ps(pe, _mm256_loadu_ps(sc + 16));
        __m256 m3 = _mm256_add_ps(pe, _mm256_loadu_ps(sc + 24));
        for (j0 = 32; j0 + 32 <= kp; j0 += 32) {
            mn = _mm256_min_ps(_mm256_add_ps(pe, _mm256_loadu_ps(sc + j0)), mn);
            m1 = _mm256_min_ps(_mm256_add_ps(pe, _mm256_loadu_ps(sc + j0 + 8)), m1);
            m2 = _mm256_min_ps(_mm256_add_ps(pe, _mm256_loadu_ps(sc + j0 + 16)), m2);
            m3 = _mm256_min_ps(_mm256_add_ps(pe, _mm256_loadu_ps(sc + j0 + 24)), m3);
        }
        mn = _mm256_min_ps(_mm256_min_ps(mn, m1), _mm256_min_ps(m2, m3));
    }
    for (; j0 < kp; j0 += 8)
        mn = _mm256_min_ps(_mm256_add_ps(pe, _mm256_loadu_ps(sc + j0)), mn);
    if (*nt == beam && !_mm256_movemask_ps(_mm256_cmp_ps(mn, _mm256_set1_ps(top[beam - 1].err),
                                                         _CMP_LT_OQ)))
        return; /* nothing of this path beats the worst kept */
    /* Halve the lane minima by pairwise min while at least `beam` remain: each is still a
     * distinct candidate's error, so their max is >= the beam-th least error of this path. */
    __m128 h = _mm256_castps256_ps128(mn), t;
    if (beam <= 4) {
        h = _mm_min_ps(h, _mm256_extractf128_ps(mn, 1));
        if (beam <= 2) h = _mm_min_ps(h, _mm_movehl_ps(h, h));
        if (beam <= 1) h = _mm_min_ss(h, _mm_shuffle_ps(h, h, 1));
    } else {
        h = _mm_max_ps(h, _mm256_extractf128_ps(mn, 1));
    }
    t = beam > 2 ? _mm_max_ps(h, _mm_movehl_ps(h, h)) : h;     /* lanes 0..3 -> 0,1 */
    if (beam > 1) t = _mm_max_ps(t, _mm_shuffle_ps(t, t, 1)); /* lanes 0,1 -> 0 */
    __m256 tv = _mm256_broadcastss_ps(t);
    int n = *nt;
    for (j0 = 0; j0 < kp; j0 += 8) {
        __m256 v = _mm256_add_ps(pe, _mm256_loadu_ps(sc + j0));
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, tv, _CMP_LE_OQ));
        if (!m) continue;
        if (n == beam)
            m &= (unsigned)_mm256_movemask_ps(
                _mm256_cmp_ps(v, _mm256_set1_ps(top[beam - 1].err), _CMP_LT_OQ));
        while (m) {
            int j = j0 + __builtin_ctz(m);
            m &= m - 1;
            if (j < k) push(top, &n, beam, perr + sc[j], parent, j);
        }
    }
    *nt = n;
}
#endif

/* Replace the np paths in cur by the best children (parent path + entry of stage s); sc holds
 * the paths' scores [np][kp] when precomputed (stage 0), else NULL. Returns the new count. */
__attribute__((always_inline)) static inline int beam_stage(path_t *cur, int np, const float *cb,
                                                            const tcb_t *t, int s, int beam,
                                                            const float *sc0, int fast,
                                                            int wide) {
    path_t nxt[MP_VQ_MAX_BEAM];
    cand_t top[MP_VQ_MAX_BEAM];
    float rb[BLK * D], sc[BLK * 256];
    const float *cbs = cb + (size_t)s * t->k * D;
    int nt = 0;
    (void)fast;
    for (int p0 = 0; p0 < np; p0 += BLK) { /* score up to BLK paths at once */
        int m = np - p0 < BLK ? np - p0 : BLK;
        const float *scp = sc0;
        if (!sc0) {
            memset(rb, 0, sizeof rb);
            for (int v = 0; v < m; v++) memcpy(rb + v * D, cur[p0 + v].res, sizeof(float) * D);
            SCORES4(rb, t, sc, wide);
            scp = sc;
        }
        for (int v = 0; v < m; v++)
#ifdef MP_OFFER_AVX2
            if (fast)
                offer_avx2(top, &nt, beam, cur[p0 + v].err, scp + v * t->kp, t->kp, t->k, p0 + v);
            else
#endif
                offer(top, &nt, beam, cur[p0 + v].err, scp + v * t->kp, t->k, p0 + v);
    }
    for (int q = 0; q < nt; q++) {
        const path_t *par = &cur[top[q].parent];
        const float *c = cbs + (size_t)top[q].code * D;
        nxt[q] = *par;
        nxt[q].err = top[q].err;
        nxt[q].code[s] = (uint8_t)top[q].code;
        for (int d = 0; d < D; d++) nxt[q].res[d] = par->res[d] - c[d];
    }
    memcpy(cur, nxt, sizeof(path_t) * (size_t)nt);
    return nt;
}

/* |v_d| < 2^40 for all d (so no score can be NaN or overflow); NaN fails the test. */
static inline int finite_small(const float *v) {
    for (int d = 0; d < D; d++)
        if (!(fabsf(v[d]) < 0x1p40f)) return 0;
    return 1;
}

/* Beam search, BLK vectors at a time: their stage-0 scores are computed together (each vector
 * starts with one path), later stages score each vector's paths together. */
MP_CLONES
static void beam_range(const float *x, size_t n, const float *cb, const tcb_t *t, int stages,
                       int beam, int cb_ok, int wide, uint8_t *codes) {
    path_t cur[MP_VQ_MAX_BEAM];
    float xb[BLK * D], sc0[BLK * 256];
    for (size_t i = 0; i < n; i += BLK) {
        size_t m = n - i < BLK ? n - i : BLK;
        memset(xb, 0, sizeof xb);
        memcpy(xb, x + i * D, m * D * sizeof(float));
        SCORES4(xb, &t[0], sc0, wide);
        for (size_t v = 0; v < m; v++) {
            memcpy(cur[0].res, xb + v * D, sizeof(float) * D);
            cur[0].err = sqnorm(cur[0].res);
            /* Only the best final path is kept, and it is the same with a 1-wide last stage (the
             * first offered of the least error either way, when no error is NaN). */
            int fast = cb_ok && beam <= 8 && finite_small(cur[0].res);
            int last = stages - 1;
            int np = beam_stage(cur, 1, cb, &t[0], 0, last || !fast ? beam : 1, sc0 + v * t[0].kp,
                                fast, wide);
            for (int s = 1; s < stages; s++)
                np = beam_stage(cur, np, cb, &t[s], s, s < last || !fast ? beam : 1, NULL, fast,
                                wide);
            memcpy(codes + (i + v) * stages, cur[0].code, (size_t)stages); /* least error */
        }
    }
}

int mp_rvq_encode(const float *x, size_t n, const float *cb, int stages, int k, int beam,
                  uint8_t *codes) {
    static const size_t tsz = sizeof(tcb_t);
    if (stages < 1 || stages > 8 || k < 1 || k > 256 || beam < 1 || beam > MP_VQ_MAX_BEAM)
        return -1;
    tcb_t *t = malloc(tsz * (size_t)stages);
    if (!t) return -1;
    for (int s = 0; s < stages; s++) prepare_cb(cb + (size_t)s * k * D, k, &t[s]);
    if (beam == 1) {
#ifdef MP_HAVE_AVX2_PATHS
        if (KP(k) % 16 == 0 && have_avx512() && all_finite_small(cb, (size_t)stages * k * D)) {
            greedy_avx512(x, n, cb, t, stages, codes);
            free(t);
            return 0;
        }
#endif
        greedy_range(x, n, cb, t, stages, codes);
    } else {
        int cb_ok = 0, wide = 0;
#ifdef MP_OFFER_AVX2
        cb_ok = have_avx2();
        wide = KP(k) % 16 == 0 && have_avx512();
#endif
        for (size_t i = 0; i < (size_t)stages * k; i++) cb_ok &= finite_small(cb + i * D);
        beam_range(x, n, cb, t, stages, beam, cb_ok, wide, codes);
    }
    free(t);
    return 0;
}
