/* AVX2 kernels.  Same lane layout and operation order as the scalar code in kernels.c
 * (multiply then add, lanes = element index mod 8, red8 reduction), so results are
 * bit-identical to it; the speed comes from 8-wide loads, int8/nibble widening and gathers. */
#include "kernels_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

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

AVX2 static float a_row_dot(const mpk_mat *w, int64_t r, const float *x) {
    const int64_t n = w->cols;
    if (w->codec == MPK_F32) return hred(lanes_f32((const float *)w->data + r * n, x, n));
    if (w->codec == MPK_BF16) {
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
    if (w->codec == MPK_F16) {
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
    const int64_t G = w->group, ng = w->ngroups;
    const uint8_t *sc = w->data + (size_t)(r * ng) * 2;
    float acc = 0.0f;
    if (w->codec == MPK_Q8) {
        const int8_t *q = (const int8_t *)(w->data + (size_t)(w->rows * ng) * 2) + r * w->cols_p;
        for (int64_t g = 0; g < ng; g++) {
            int64_t c0 = g * G, c1 = c0 + G < n ? c0 + G : n, c = c0;
            __m256 gl = _mm256_setzero_ps();
            for (; c + 8 <= c1; c += 8) {
                __m128i b = _mm_loadl_epi64((const __m128i *)(q + c));
                __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
                gl = _mm256_add_ps(gl, _mm256_mul_ps(v, _mm256_loadu_ps(x + c)));
            }
            float l[8];
            _mm256_storeu_ps(l, gl);
            for (; c < c1; c++) l[(c - c0) & 7] += (float)q[c] * x[c];
            acc += mpk_f16_to_f32(ld16(sc + 2 * g)) * mpk_red8(l);
        }
        return acc;
    }
    if (w->codec == MPK_Q6) { /* 8 codes = 6 bytes = two 24-bit words k0|k1<<6|k2<<12|k3<<18 */
        const uint8_t *q = w->data + (size_t)(w->rows * ng) * 2 + (size_t)(r * w->cols_p) / 4 * 3;
        const __m256i shifts = _mm256_setr_epi32(0, 6, 12, 18, 0, 6, 12, 18);
        const __m256i pick = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
        for (int64_t g = 0; g < ng; g++) {
            int64_t c0 = g * G, c1 = c0 + G < n ? c0 + G : n, c = c0;
            __m256 gl = _mm256_setzero_ps();
            for (; c + 8 <= c1; c += 8) { /* c is a multiple of 8: c0 is a multiple of G */
                uint32_t lo; /* bytes 0..3 and 4..5 (not one 8-byte load: the tensor may end) */
                uint16_t hi;
                memcpy(&lo, q + (c >> 2) * 3, 4);
                memcpy(&hi, q + (c >> 2) * 3 + 4, 2);
                uint64_t v = lo | (uint64_t)hi << 32;
                uint64_t words = (v & 0xffffffu) | (v >> 24) << 32;
                __m256i u = _mm256_permutevar8x32_epi32(
                    _mm256_castsi128_si256(_mm_cvtsi64_si128((long long)words)), pick);
                __m256i k = _mm256_and_si256(_mm256_srlv_epi32(u, shifts), _mm256_set1_epi32(63));
                __m256 val = _mm256_cvtepi32_ps(_mm256_sub_epi32(k, _mm256_set1_epi32(32)));
                gl = _mm256_add_ps(gl, _mm256_mul_ps(val, _mm256_loadu_ps(x + c)));
            }
            float l[8];
            _mm256_storeu_ps(l, gl);
            for (; c < c1; c++) {
                const uint8_t *b = q + (c >> 2) * 3;
                uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16;
                l[(c - c0) & 7] += (float)((int)((u >> ((c & 3) * 6)) & 63) - 32) * x[c];
            }
            acc += mpk_f16_to_f32(ld16(sc + 2 * g)) * mpk_red8(l);
        }
        return acc;
    }
    /* MPK_Q4: nibbles, low nibble = even column */
    const size_t planes = w->zero_point ? 2 : 1;
    const uint8_t *mins = w->data + (size_t)(w->rows * ng) * 2 + (size_t)(r * ng) * 2;
    const uint8_t *q = w->data + planes * (size_t)(w->rows * ng) * 2 + (size_t)(r * w->cols_p) / 2;
    const __m256i shifts = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    const __m256i pick = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const __m256i off = _mm256_set1_epi32(w->zero_point ? 0 : 8);
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * G, c1 = c0 + G < n ? c0 + G : n, c = c0;
        __m256 gl = _mm256_setzero_ps(), xl = _mm256_setzero_ps();
        for (; c + 8 <= c1; c += 8) { /* c is even: c0 is a multiple of G (a multiple of 8) */
            uint32_t b4;
            memcpy(&b4, q + (c >> 1), 4);
            __m256i bytes = _mm256_permutevar8x32_epi32(
                _mm256_cvtepu8_epi32(_mm_cvtsi32_si128((int)b4)), pick);
            __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(bytes, shifts), _mm256_set1_epi32(15));
            __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(nib, off));
            __m256 xv = _mm256_loadu_ps(x + c);
            gl = _mm256_add_ps(gl, _mm256_mul_ps(v, xv));
            xl = _mm256_add_ps(xl, xv);
        }
        float l[8], lx[8];
        _mm256_storeu_ps(l, gl);
        _mm256_storeu_ps(lx, xl);
        for (; c < c1; c++) {
            int nib = (q[c >> 1] >> ((c & 1) * 4)) & 15;
            l[(c - c0) & 7] += (float)(w->zero_point ? nib : nib - 8) * x[c];
            lx[(c - c0) & 7] += x[c];
        }
        float part = mpk_f16_to_f32(ld16(sc + 2 * g)) * mpk_red8(l);
        if (w->zero_point) part += mpk_f16_to_f32(ld16(mins + 2 * g)) * mpk_red8(lx);
        acc += part;
    }
    return acc;
}

AVX2 static void a_rvq_lut_block(const float *cbt, int stages, const float *x, int64_t cols,
                                 int64_t v, float *lut) {
    float xv[8];
    for (int d = 0; d < 8; d++) xv[d] = 8 * v + d < cols ? x[8 * v + d] : 0.0f;
    for (int s = 0; s < stages; s++) {
        const float *cs = cbt + (size_t)s * 8 * 256;
        float *out = lut + ((size_t)v * (size_t)stages + (size_t)s) * 256;
        for (int e = 0; e < 256; e += 8) {
            __m256 a = _mm256_mul_ps(_mm256_set1_ps(xv[0]), _mm256_loadu_ps(cs + e));
            for (int d = 1; d < 8; d++)
                a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(xv[d]), _mm256_loadu_ps(cs + d * 256 + e)));
            _mm256_storeu_ps(out + e, a);
        }
    }
}

/* Position j of a row's code string selects lut[j*256 + code[j]]: 8 gathers at once.  Rows are
 * processed together over column blocks so the LUT slice stays in L1/L2 (the whole table of a
 * 4096-wide input is 1.5 MB); per row and lane the additions still run in increasing j, so the
 * result equals the scalar order. */
#define RVQ_JB 32 /* codes per block: 32 KiB of LUT (measured best of 32/64/256/1024) */
#define RVQ_MAXR 16

AVX2 static void a_rvq_rows(const uint8_t *codes, int64_t n, int64_t rows, const float *lut,
                            float *out) {
    const __m256i base = _mm256_setr_epi32(0, 256, 512, 768, 1024, 1280, 1536, 1792);
    __m256 acc[RVQ_MAXR];
    int64_t nfull = n & ~(int64_t)7;
    for (int64_t r0 = 0; r0 < rows; r0 += RVQ_MAXR) {
        int64_t nr = rows - r0 < RVQ_MAXR ? rows - r0 : RVQ_MAXR;
        for (int64_t r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t j0 = 0; j0 < nfull; j0 += RVQ_JB) {
            int64_t j1 = j0 + RVQ_JB < nfull ? j0 + RVQ_JB : nfull;
            for (int64_t r = 0; r < nr; r++) {
                const uint8_t *c = codes + (r0 + r) * n;
                __m256 a = acc[r];
                for (int64_t j = j0; j < j1; j += 8) {
                    __m128i b = _mm_loadl_epi64((const __m128i *)(c + j));
                    __m256i idx = _mm256_add_epi32(base, _mm256_cvtepu8_epi32(b));
                    a = _mm256_add_ps(a, _mm256_i32gather_ps(lut + (size_t)j * 256, idx, 4));
                }
                acc[r] = a;
            }
        }
        for (int64_t r = 0; r < nr; r++) {
            const uint8_t *c = codes + (r0 + r) * n;
            float l[8];
            _mm256_storeu_ps(l, acc[r]);
            for (int64_t j = nfull; j < n; j++) l[j & 7] += lut[(size_t)j * 256 + c[j]];
            out[r0 + r] = mpk_red8(l);
        }
    }
}

const mpk_impl mpk_avx2_impl = {"avx2", a_row_dot, a_rvq_lut_block, a_rvq_rows};

#else
const mpk_impl mpk_avx2_impl = {"avx2", 0, 0, 0};
#endif
