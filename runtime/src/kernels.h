/* Compute kernels: matrix-vector products on the stored encodings (never a dequantised copy).
 *
 * Trunk matrices (f32/f16/bf16/q8/q6/q4) and routed-expert matrices (rvq codes + per-layer
 * codebooks) are multiplied in place.  Every output row is computed by one task with a fixed
 * summation order, so results are bit-identical for any thread count.  The implementation
 * (AVX-512 VBMI, AVX2/FMA or the portable scalar code) is a kernel table chosen by mpk_select and
 * passed to every call that needs it: each engine holds its own table, so engines in one process
 * never affect each other (there is no process-wide kernel state).  All three give identical
 * bits. */
#ifndef MP_KERNELS_H
#define MP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "codecs.h"
#include "kernels_pool.h"

/* A kernel table (one per instruction set; static, never freed). */
typedef struct mpk_impl mpk_impl;

/* A 2-D (or 1-D: rows = 1) trunk matrix in its stored encoding. */
typedef struct mpk_mat {
    int codec;        /* mp_codec_kind (codecs.h): f32/f16/bf16/q8/q6/q4 */
    int64_t rows, cols;
    int64_t group;    /* q8/q6/q4 group size */
    int64_t ngroups;  /* groups per row (cols padded to a multiple of group) */
    int64_t cols_p;   /* padded cols */
    int zero_point;   /* q4: a second f16 plane with per-group minimum */
    const uint8_t *data;
} mpk_mat;

/* Residual-VQ matrix (spec/CODECS.md §3, format 1.1): codes u8 in 64-row tiles
 * [nt][nv*stages][64] (nt = ceil(rows / 64), padding rows code 0), then scales f16 [rows]. */
typedef struct mpk_rvq {
    int64_t rows, cols, nv; /* nv = ceil(cols / 8) */
    int stages;
    const uint8_t *codes;
    const uint8_t *scales;  /* f16 little-endian, one per row */
} mpk_rvq;

/* Fills w for one projection part at `part` (codes, then scales at align_up(rows, 64) * nv * S). */
void mpk_rvq_init(mpk_rvq *w, int64_t rows, int64_t cols, int stages, const uint8_t *part);
uint64_t mpk_rvq_nbytes(int64_t rows, int64_t cols, int stages);

#define MPK_RVQ_TILE 64   /* rows per code tile */
#define MPK_RVQ_GROUP 32  /* vectors per table quantisation group (CODECS.md §3.5) */

/* Integer lookup tables of one activation for one codebook (CODECS.md §3.5 steps 1-2).  Built
 * once per activation and shared by every matrix using the codebook (gate/up of all routed
 * experts of a layer).  Memory comes from the caller (mpk_rvq_tab_bytes); layout is the same for
 * every kernel path. */
typedef struct mpk_rvq_tab {
    int64_t cols, nv, ngroups;
    int stages;
    int nan;   /* some group's max |T| is NaN or +inf: every product row is NaN */
    int8_t *q; /* [nv][stages][256], 64-byte aligned */
    float *d;  /* [ngroups][stages]: table step m / 127 (0 for a zero group) */
} mpk_rvq_tab;

/* Bytes of caller memory for a table of `cols` inputs and `stages` (includes alignment slack). */
size_t mpk_rvq_tab_bytes(int64_t cols, int stages);
/* Points t into mem (at least mpk_rvq_tab_bytes(cols, stages) bytes). */
void mpk_rvq_tab_init(mpk_rvq_tab *t, void *mem, int64_t cols, int stages);
/* Builds t from x[cols] (already rotated when the codec has a rotation) and the transposed
 * codebook cbt [stages][8][256] (mpk_rvq_transpose_cb). */
void mpk_rvq_tables(const mpk_impl *k, mpk_pool *pool, const float *cbt, const float *x,
                    mpk_rvq_tab *t);
/* y[rows] = the §3.5 product of w with the activation t was built from (t->cols == w->cols,
 * t->stages == w->stages).  NaN rows are the quiet NaN 0x7fc00000 (payloads canonicalised so
 * that every path and libm give the same bits). */
void mpk_rvq_matvec(const mpk_impl *k, mpk_pool *pool, const mpk_rvq *w, const mpk_rvq_tab *t,
                    float *y);
/* Up to MPK_RVQ_BATCH tables or products in one pool job (a decode step's experts: one wait
 * for the threads instead of one per matrix); each result as the single call gives it. */
#define MPK_RVQ_BATCH 32
void mpk_rvq_tables_batch(const mpk_impl *k, mpk_pool *pool, int n, const float *cbt, const float *const *x,
                          mpk_rvq_tab *const *t);
void mpk_rvq_matvec_batch(const mpk_impl *k, mpk_pool *pool, int n, const mpk_rvq *w,
                          const mpk_rvq_tab *const *t, float *const *y);

/* The prefill product's integer codebook (spec/CODECS.md §3.6 step 1): q = round(cb × 2^p), so
 * that a decoded weight (the stages' entries summed) is an exact integer, |w| < 2^14. */
#define MPK_RVQ_MAX_STAGES 8
typedef struct mpk_rvq_icb {
    int16_t q[MPK_RVQ_MAX_STAGES][256][8];
    int nan;       /* an entry is NaN or infinite: every product row is NaN */
    float unscale; /* 2^-p */
} mpk_rvq_icb;
/* Fills c from the codebook as stored, f32 [stages][256][8] (1 <= stages <= 8). */
void mpk_rvq_icb_init(mpk_rvq_icb *c, const float *cb, int stages);

/* One activation in the prefill product's integers (§3.6 step 2): int16 q[align16(cols)] (zero
 * past cols), then f32 d[ceil(cols / 512)] (the step of each group of MPK_RVQ_XGROUP vectors;
 * NaN for a group holding a NaN or infinity).  mpk_rvq_xq_bytes is its size, a multiple of 32. */
#define MPK_RVQ_XGROUP 64
size_t mpk_rvq_xq_bytes(int64_t cols);
/* Quantises x[cols] (already rotated when the codec has a rotation) into out (32-byte aligned). */
void mpk_rvq_xq(const float *x, int64_t cols, void *out);

/* The prefill product (§3.6): y[i][rows] = W x[i] for n activations quantised by mpk_rvq_xq at
 * xq + i * xqs bytes (xqs >= mpk_rvq_xq_bytes(cols), a multiple of 32), with W's codes decoded to
 * integers and summed exactly against the 12-bit activations (no lookup tables).  Each
 * y[i][r] depends only on row r and input i: the same bits for any n, order or grouping of
 * inputs, thread count and kernel path, but not mpk_rvq_matvec's bits (a stated bound,
 * docs/RUNTIME.md).  NaN rows are the quiet NaN 0x7fc00000. */
void mpk_rvq_gemm(const mpk_impl *k, mpk_pool *pool, const mpk_rvq *w, const mpk_rvq_icb *cb,
                  const void *xq, size_t xqs, int64_t n, void *ws, float *y);
/* Paths that multiply from inputs re-laid in a layout of their own (AMX tiles) need that much
 * workspace for a call of n inputs of cols columns: mpk_rvq_gemm_ws_bytes(k, cols, n) bytes (0 when
 * k reads the inputs as they are), passed as ws, 64-byte aligned; ws NULL: the call allocates it. */
size_t mpk_rvq_gemm_ws_bytes(const mpk_impl *k, int64_t cols, int64_t n);
/* At least mpk_rvq_gemm_ws_bytes for any path and any call of up to n inputs, and n + 1 inputs'
 * bound exceeds n's by the same bytes whatever n (memory plans count it per prompt token). */
size_t mpk_rvq_gemm_ws_bound(int64_t cols, int64_t n);

#define MPK_VQ_DIM 8
#define MPK_VQ_ENTRIES 256

/* Kernel paths (same values as moepack.h's MP_KERNELS_*). */
enum { MPK_AUTO = 0, MPK_SCALAR = 1, MPK_AVX2 = 2, MPK_AVX512VBMI = 3, MPK_AVX512AMX = 4 };
/* The kernel table for `which`: MPK_AUTO = the best this CPU runs (AVX-512 F/BW/VL/VBMI/VNNI, else
 * AVX2+FMA+F16C, else scalar); a named path, or NULL when this CPU cannot run it.  All paths give
 * bit-identical results.  Every `k` argument below takes one; NULL = scalar. */
const mpk_impl *mpk_select(int which);
/* "avx512amx", "avx512vbmi", "avx2" or "scalar". */
const char *mpk_impl_name(const mpk_impl *k);

float mpk_f16_to_f32(uint16_t h);
/* n f16 values stored little-endian at src, as f32 (exact; F16C where the CPU has it, which
 * returns a signalling NaN quiet where mpk_f16_to_f32 keeps it signalling) */
void mpk_f16_to_f32_n(const void *src, int64_t n, float *d);
float mpk_bf16_to_f32(uint16_t h);
uint16_t mpk_f32_to_f16(float f); /* round to nearest even */

/* Fills m from codec parameters (kind: mp_codec_kind); returns 0, or -1 on an unsupported/invalid
 * combination. */
int mpk_mat_init(mpk_mat *m, int codec, int64_t rows, int64_t cols, int64_t group,
                 int zero_point, const void *data);
/* Encoded size in bytes of m (the codec's size rule, codecs.c). */
uint64_t mpk_mat_nbytes(const mpk_mat *m);

/* y[rows] = W x.  Grouped codecs (q8/q6/q4, groups of at most 256 columns): CODECS.md §2.4, each
 * row's integer codes summed exactly against the input rounded to 16-bit integers per group, the
 * group scales applied once per group (mpk_gemm's bits).  Float codecs: per row eight lane sums
 * (column mod 8), multiply and add apart, then mpk_red8's tree (docs/RUNTIME.md). */
void mpk_matvec(const mpk_impl *k, mpk_pool *pool, const mpk_mat *w, const float *x, float *y);
/* y[t][rows] = W x[t] for n inputs x[n][cols]: each row is read once for all n inputs (prefill);
 * every y[t][r] is computed exactly as mpk_matvec computes it. */
void mpk_matmat(const mpk_impl *k, mpk_pool *pool, const mpk_mat *w, const float *x, int64_t n, float *y);
/* y[r - r0] for rows [r0, r1) of W x, on the calling thread, each as mpk_matvec computes it. */
void mpk_matvec_rows(const mpk_impl *k, const mpk_mat *w, int64_t r0, int64_t r1, const float *x, float *y);
/* The trunk's prefill product: y[t][rows] = W x[t] for n inputs x[n][cols].  Grouped codecs:
 * mpk_matvec's product (§2.4) for every input.  Float codecs: each row decoded to its values once
 * (mpk_row) and multiplied with FMA, per (input, row) eight lane chains (column mod 8) over the
 * columns in order, then mpk_red8's tree, not mpk_matvec's bits.  The same bits for any n,
 * grouping of inputs, thread count and kernel path (docs/RUNTIME.md). */
void mpk_gemm(const mpk_impl *k, mpk_pool *pool, const mpk_mat *w, const float *x, int64_t n, float *y);
/* The most one pool task of mpk_gemm or mpk_matmat allocates, and frees before it ends, for a
 * matrix of `cols` columns in groups of `group` (0: none): one such buffer per compute thread at
 * a time, counted in the memory plan's scratch. */
uint64_t mpk_task_bytes(int64_t cols, int64_t group);
/* Decodes row r of w into out[cols] (embedding lookup, small vectors). */
void mpk_row(const mpk_mat *w, int64_t r, float *out);

/* Codebook f32 [stages][256][8] -> transposed [stages][8][256] (what mpk_rvq_tables reads). */
void mpk_rvq_transpose_cb(const float *cb, int stages, float *cbt);

/* Input rotation for rvq codecs with rotation "hadamard": out = H_block(signs * x) / sqrt(block)
 * (H = unnormalised Walsh-Hadamard per block), so that W x = W_codes out (spec/CODECS.md). */
void mpk_hadamard_rotate(const float *x, const float *signs, int64_t n, int64_t block, float *out);

/* Small vector helpers (single-threaded, fixed order). */
void mpk_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
float mpk_dot(const float *a, const float *b, int64_t n);
/* out[i] = mpk_dot(rows + i * stride, x, n) for i < nr, the same bits, several at a time */
void mpk_dots(const float *x, const float *rows, int64_t stride, int nr, int64_t n, float *out);
/* mpk_dots with x given as n little-endian f16 values (converted exactly as it is read) */
void mpk_dots_f16(const void *x, const float *rows, int64_t stride, int nr, int64_t n, float *out);
/* out[k * os + i] for nk keys at x + k * xs bytes (n floats, or n IEEE halves with f16): row i's
 * dot with key k, the bits of mpk_dots / mpk_dots_f16 (attention's scores, a block of positions a
 * call) */
void mpk_dots_keys(const void *x, size_t xs, int nk, int f16, const float *rows, int64_t stride, int nr, int64_t n,
                   float *out, int64_t os);
void mpk_axpy(float *y, float a, const float *x, int64_t n); /* y += a x */
/* Rows prefetched ahead where attention walks a strided slice of the KV cache's rows (the score
 * tasks' keys, mpk_wsum's values): a decode step reads them from RAM, and the hardware
 * prefetchers do not cover the slices. */
#define MPK_ROWS_AHEAD 16
/* out[h * os + c] = sum over t < nt of w[h * ws + t] x row t's column c, for h < nh, c < n: the
 * rows at rows + t * rs bytes, f32 or (f16 = 1) IEEE half; each element summed from 0 in t order,
 * multiply and add apart, i.e. the bits of mpk_axpy over t onto a zeroed out. */
void mpk_wsum(float *out, int64_t os, int nh, const float *w, int64_t ws, const void *rows, size_t rs, int f16,
              int64_t nt, int64_t n);
/* x[0 .. n) := softmax(x) in place: m = max x; e_i = e^(x_i - m) by kernels_impl.h's mpk_exp
 * (within 2 ulp of e^x, 0.97 measured by test_kernels; the same bits on every path); s = the e_i
 * summed in binary64 in eight lanes l0..l7 (lane i mod 8, index order), then
 * ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)); x_i = e_i x f32(1 / s).  A NaN anywhere
 * makes every x_i the quiet NaN 0x7fc00000.  n >= 1. */
void mpk_softmax(float *x, int64_t n);
/* x / (1 + e^-x), e^x as mpk_softmax's */
float mpk_silu(float x);
/* g[i] = mpk_silu(g[i]) x u[i] for i < n (SwiGLU), eight-wide on AVX2 CPUs with the same bits */
void mpk_swiglu(float *g, const float *u, int64_t n);
/* For tests only: the small vector helpers above, mpk_swiglu, mpk_f16_to_f32_n and mpk_rvq_xq
 * run at most at `level` (0 scalar, 1 AVX2, 2 AVX-512; never beyond what the CPU has; 2 is the
 * default, i.e. no cap) from now on, process-wide, so that a test can compare every level's bits
 * with the scalar code's on one machine.  Returns the level now in effect. */
int mpk_vec_helpers_cap(int level);

#endif
