/* The prefill product (CODECS.md §3.6) on AMX-INT8 tiles, bit-identical to the other paths.
 *
 * §3.6 sums 15-bit weights times 12-bit activations exactly, one sum per 512-column group; AMX
 * multiplies bytes.  With W = 256 Wh + Wl and x = 256 xh + xl (Wl, xl unsigned bytes, Wh, xh
 * signed) n = 65536 hh + 256 (hl + lh) + ll: four tile products (16 rows x 16 inputs x 64 bytes)
 * per 64 columns into three int32 tiles (none can overflow over a group), which stay in the tiles
 * for the group's eight 64-column steps, leave them once, and are combined exactly in integers,
 * rounded once and accumulated with one fma per group as §3.6 step 4 says.  Weights are tile A
 * (16 rows, 64 columns a row, one byte plane each), decoded as on the other SIMD paths 64
 * columns at a time, then split into planes; inputs are tile B (16 rows of 4-column steps x 16
 * inputs), re-laid once per mpk_rvq_gemm call (mpk_amx_xprep) for every row block to share. */
#define _GNU_SOURCE /* syscall */
#include "kernels_impl.h"

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__))
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512vbmi,avx512vnni,fma,bmi2,amx-tile,amx-int8")))

enum { XG = MPK_RVQ_XGROUP * 8 /* columns a group */, TB = 16 /* inputs a tile */, KS = 8 /* 64-column steps a group */ };
#define TILE_BYTES 1024 /* 16 rows of 64 bytes */
/* one block of 16 inputs: the B tiles [group][step][plane] then the steps dx [group][16] */
static size_t block_bytes(int64_t ng) { return (size_t)ng * (KS * 2 * TILE_BYTES + TB * 4); }
_Static_assert((KS * 2 * TILE_BYTES + TB * 4) == TB * MPK_AMX_GROUP_BYTES, "kernels_impl.h's layout size");
size_t mpk_amx_xbytes(int64_t cols) { return block_bytes((cols + XG - 1) / XG) / TB; }

/* byte k of the lo (hi) plane = the low (high) byte of int16 k of a:b (64 int16) */
static const uint8_t plane_idx[64] __attribute__((aligned(64))) = {
#define P4(k) 2 * (k), 2 * (k) + 2, 2 * (k) + 4, 2 * (k) + 6
    P4(0), P4(4), P4(8), P4(12), P4(16), P4(20), P4(24), P4(28),
    P4(32), P4(36), P4(40), P4(44), P4(48), P4(52), P4(56), P4(60)
#undef P4
};

/* out[k] dword i = r[i] dword k: a 16 x 16 transpose of 32-bit elements */
AMX static inline __attribute__((always_inline)) void t16(const __m512i r[16], __m512i out[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int m = 0; m < 4; m++) { /* u[4i + m] lane L: element 4L + m of rows 4i .. 4i + 3 */
        const __m512i v0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44), v1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xee);
        const __m512i w0 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44), w1 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xee);
        out[m] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        out[4 + m] = _mm512_shuffle_i32x4(v0, w0, 0xdd);
        out[8 + m] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        out[12 + m] = _mm512_shuffle_i32x4(v1, w1, 0xdd);
    }
}

/* n inputs (mpk_rvq_xq's layout at xq + t * xqs) into blocks of 16 (zero inputs past n): for each
 * group and 64-column step, B[k][4u + b] = plane byte of input u's column 64 step + 4k + b */
AMX void mpk_amx_xprep(const uint8_t *xq, size_t xqs, int64_t cols, int64_t n, uint8_t *out) {
    const int64_t ng = (cols + XG - 1) / XG, qn = (cols + 15) / 16 * 16; /* int16 stored per input */
    const __m512i lo = _mm512_load_si512(plane_idx), hi = _mm512_add_epi8(lo, _mm512_set1_epi8(1));
    for (int64_t b = 0; b * TB < n; b++) {
        uint8_t *blk = out + (size_t)b * block_bytes(ng);
        float *steps = (float *)(blk + (size_t)ng * KS * 2 * TILE_BYTES);
        const int nb = n - b * TB < TB ? (int)(n - b * TB) : TB;
        for (int64_t g = 0; g < ng; g++) {
            for (int u = 0; u < TB; u++)
                steps[g * TB + u] = u < nb ? mpk_rvq_xq_steps(xq + (size_t)(b * TB + u) * xqs, cols)[g] : 0.0f;
            for (int st = 0; st < KS; st++) {
                const int64_t c0 = g * XG + 64 * st, left = qn - c0;
                const __mmask32 m0 = left >= 32 ? 0xffffffffu : left > 0 ? (1u << left) - 1 : 0;
                const __mmask32 m1 = left >= 64 ? 0xffffffffu : left > 32 ? (1u << (left - 32)) - 1 : 0;
                __m512i pl[16], ph[16], o[16];
                for (int u = 0; u < TB; u++) {
                    __m512i a = _mm512_setzero_si512(), c = _mm512_setzero_si512();
                    if (u < nb) {
                        const int16_t *x = (const int16_t *)(xq + (size_t)(b * TB + u) * xqs) + c0;
                        a = _mm512_maskz_loadu_epi16(m0, x);
                        c = _mm512_maskz_loadu_epi16(m1, x + 32);
                    }
                    pl[u] = _mm512_permutex2var_epi8(a, lo, c);
                    ph[u] = _mm512_permutex2var_epi8(a, hi, c);
                }
                uint8_t *tile = blk + (size_t)((g * KS + st) * 2) * TILE_BYTES;
                t16(pl, o);
                for (int k = 0; k < 16; k++) _mm512_store_si512(tile + k * 64, o[k]);
                t16(ph, o);
                for (int k = 0; k < 16; k++) _mm512_store_si512(tile + TILE_BYTES + k * 64, o[k]);
            }
        }
    }
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) amx_cfg;

/* tiles 0-2: the sums (hi x hi, the cross terms, lo x lo); 3-4: the weights' lo / hi planes;
 * 5-6: the inputs' lo / hi planes; all 16 rows of 64 bytes */
AMX static void amx_config(void) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 7; i++) c.colsb[i] = 64, c.rows[i] = 16;
    _tile_loadconfig(&c);
}

/* one block's group: n = 256 u + c2 per (row, input) with u = 256 c0 + c1 exact in int32
 * (|c0| <= 512 * 64 * 8, |c1| <= 512 * (64 * 255 + 255 * 8): |u| < 2^27) and n exact in int64
 * (< 2^35), rounded once to binary32; a[row][input] = fma(f32(n), d[input], a) (first group: onto +0) */
AMX static inline __attribute__((always_inline)) void combine(int32_t (*cs)[16][16], const float *dg, int first,
                                                              float (*a)[16]) {
    const __m512 d = _mm512_loadu_ps(dg);
    for (int i = 0; i < 16; i++) {
        const __m512i u = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(cs[0][i]), 8), _mm512_load_si512(cs[1][i]));
        const __m512i c2 = _mm512_load_si512(cs[2][i]);
        const __m512i lo = _mm512_add_epi64(_mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(u)), 8),
                                            _mm512_cvtepi32_epi64(_mm512_castsi512_si256(c2)));
        const __m512i hi = _mm512_add_epi64(_mm512_slli_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(u, 1)), 8),
                                            _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(c2, 1)));
        const __m512 nf = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtepi64_ps(lo)), _mm512_cvtepi64_ps(hi), 1);
        const __m512 prev = first ? _mm512_setzero_ps() : _mm512_load_ps(a[i]);
        _mm512_store_ps(a[i], _mm512_fmadd_ps(nf, d, prev));
    }
}

/* xb: mpk_amx_xprep's blocks for the n inputs (the first at xb, xbs bytes an input) */
AMX void mpk_amx_rvq_gemm(const mpk_rvq *w, const mpk_rvq_icb *cb, const uint8_t *xb, size_t xbs, int64_t n,
                          int64_t r0, float *acc) {
    const int S = w->stages;
    const int64_t nv = w->nv, ng = (nv + MPK_RVQ_XGROUP - 1) / MPK_RVQ_XGROUP, nblk = (n + TB - 1) / TB;
    const size_t bb = xbs * TB;
    const uint8_t *codes = w->codes + (size_t)((r0 / 64) * nv * S) * 64 + (size_t)(r0 % 64);
    int16_t wb[2 * MPK_GEMM_ROWS * 32] __attribute__((aligned(64))); /* one step: [quad][row][32] */
    uint8_t ab[KS * 2 * TILE_BYTES] __attribute__((aligned(64))); /* weight tiles [step][plane] */
    int32_t cs[3][16][16] __attribute__((aligned(64)));
    float a[MPK_GEMM_INPUTS / TB][16][16] __attribute__((aligned(64))); /* [block][row][input] */
    const __m512i lo = _mm512_load_si512(plane_idx), hi = _mm512_add_epi8(lo, _mm512_set1_epi8(1));
    amx_config();
    for (int64_t g = 0, v0 = 0; g < ng; g++, v0 += MPK_RVQ_XGROUP) {
        const int64_t kp = nv - v0 < MPK_RVQ_XGROUP ? nv - v0 : MPK_RVQ_XGROUP;
        /* a step (8 vectors) at a time, split while its 2 KiB of decoded rows are in L1 (the
         * group's 16 KiB at once, next to the tiles' operands, left L1 between decode and split) */
        for (int st = 0; st < KS; st++) {
            const int64_t vs = 8 * st, kv = kp - vs < 8 ? kp - vs : 8;
            if (kv > 0) mpk_rvq_decode_panel(codes + (size_t)((v0 + vs) * S) * 64, cb, kv, S, 4, wb);
            if (kv <= 4) /* quads past the group's last vector: zero weights */
                memset(wb + (kv > 0 ? MPK_GEMM_ROWS * 32 : 0), 0, (size_t)(kv > 0 ? 1 : 2) * MPK_GEMM_ROWS * 64);
            for (int i = 0; i < MPK_GEMM_ROWS; i++) {
                const __m512i q0 = _mm512_load_si512(wb + (size_t)i * 32), q1 = _mm512_load_si512(wb + (size_t)(MPK_GEMM_ROWS + i) * 32);
                uint8_t *t = ab + (size_t)(2 * st) * TILE_BYTES + (size_t)i * 64;
                _mm512_store_si512(t, _mm512_permutex2var_epi8(q0, lo, q1));
                _mm512_store_si512(t + TILE_BYTES, _mm512_permutex2var_epi8(q0, hi, q1));
            }
        }
        for (int64_t b = 0; b < nblk; b++) {
            const uint8_t *xt = xb + (size_t)b * bb + (size_t)(g * KS * 2) * TILE_BYTES;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            for (int st = 0; st < KS; st++) {
                _tile_loadd(3, ab + (size_t)(2 * st) * TILE_BYTES, 64);
                _tile_loadd(4, ab + (size_t)(2 * st + 1) * TILE_BYTES, 64);
                _tile_loadd(5, xt + (size_t)(2 * st) * TILE_BYTES, 64);
                _tile_loadd(6, xt + (size_t)(2 * st + 1) * TILE_BYTES, 64);
                _tile_dpbssd(0, 4, 6);
                _tile_dpbsud(1, 4, 5);
                _tile_dpbusd(1, 3, 6);
                _tile_dpbuud(2, 3, 5);
            }
            _tile_stored(0, cs[0], 64);
            _tile_stored(1, cs[1], 64);
            _tile_stored(2, cs[2], 64);
            combine(cs, (const float *)(xb + (size_t)b * bb + (size_t)ng * KS * 2 * TILE_BYTES) + g * TB, g == 0, a[b]);
        }
    }
    _tile_release();
    for (int64_t b = 0; b < nblk; b++) { /* a[b][row][input] -> acc[input][row] */
        __m512i r[16], o[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_castps_si512(_mm512_load_ps(a[b][i]));
        t16(r, o);
        for (int u = 0; u < TB && b * TB + u < n; u++)
            _mm512_storeu_si512(acc + (size_t)(b * TB + u) * MPK_GEMM_ROWS, o[u]);
    }
}

/* The CPU has AMX-TILE and AMX-INT8, the OS saves tile state (XCR0 bits 17, 18), and Linux gave
 * this process the tile data permission (ARCH_REQ_XCOMP_PERM); asked once. */
int mpk_amx_usable(void) {
    static int have = -1;
    if (have >= 0) return have;
    unsigned a, b, c, d;
    have = 0;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    if (a < 7) return have;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return have;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    if (!((c >> 27) & 1)) return have; /* OSXSAVE */
    unsigned xlo, xhi;
    __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & (3u << 17)) != (3u << 17)) return have;
    have = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    return have;
}
#else
size_t mpk_amx_xbytes(int64_t cols) { return (void)cols, 0; }
void mpk_amx_xprep(const uint8_t *xq, size_t xqs, int64_t cols, int64_t n, uint8_t *out) {
    (void)xq, (void)xqs, (void)cols, (void)n, (void)out;
}
void mpk_amx_rvq_gemm(const mpk_rvq *w, const mpk_rvq_icb *cb, const uint8_t *xb, size_t xbs, int64_t n,
                      int64_t r0, float *acc) {
    (void)w, (void)cb, (void)xb, (void)xbs, (void)n, (void)r0, (void)acc;
}
int mpk_amx_usable(void) { return 0; }
#endif
