/* Compute kernels: matrix-vector products on the stored encodings (never a dequantised copy).
 *
 * Trunk matrices (f32/f16/bf16/q8/q6/q4) and routed-expert matrices (rvq codes + per-layer
 * codebooks) are multiplied in place.  Every output row is computed by one task with a fixed
 * summation order, so results are bit-identical for any thread count.  The implementation (AVX2/FMA
 * or the portable scalar code) is a kernel table chosen by mpk_select and passed to every call
 * that needs it: each engine holds its own table, so engines in one process never affect each
 * other (there is no process-wide kernel state). */
#ifndef MP_KERNELS_H
#define MP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels_pool.h"

enum { MPK_F32 = 0, MPK_F16, MPK_BF16, MPK_Q8, MPK_Q4, MPK_Q6 };

/* A 2-D (or 1-D: rows = 1) trunk matrix in its stored encoding. */
typedef struct mpk_mat {
    int codec;        /* MPK_* */
    int64_t rows, cols;
    int64_t group;    /* q8/q6/q4 group size */
    int64_t ngroups;  /* groups per row (cols padded to a multiple of group) */
    int64_t cols_p;   /* padded cols */
    int zero_point;   /* q4: a second f16 plane with per-group minimum */
    const uint8_t *data;
} mpk_mat;

/* Residual-VQ matrix: codes u8 [rows][nv][stages], scales f16 [rows] (see spec/CODECS.md). */
typedef struct mpk_rvq {
    int64_t rows, cols, nv; /* nv = ceil(cols / 8) */
    int stages;
    const uint8_t *codes;
    const uint8_t *scales;  /* f16 little-endian, one per row */
} mpk_rvq;

#define MPK_VQ_DIM 8
#define MPK_VQ_ENTRIES 256

/* A kernel table (one per instruction set; static, never freed). */
typedef struct mpk_impl mpk_impl;
/* The AVX2/FMA table when the CPU has AVX2, FMA and F16C and force_scalar is 0, else the scalar
 * one.  Both give bit-identical results.  Every `k` argument below takes one; NULL = scalar. */
const mpk_impl *mpk_select(int force_scalar);
/* "avx2" or "scalar". */
const char *mpk_impl_name(const mpk_impl *k);

float mpk_f16_to_f32(uint16_t h);
float mpk_bf16_to_f32(uint16_t h);

/* Fills m from codec parameters; returns 0, or -1 on an unsupported/invalid combination. */
int mpk_mat_init(mpk_mat *m, int codec, int64_t rows, int64_t cols, int64_t group,
                 int zero_point, const void *data);
/* Encoded size in bytes of m (for checking against the container's length). */
uint64_t mpk_mat_nbytes(const mpk_mat *m);

/* y[rows] = W x.  */
void mpk_matvec(const mpk_impl *k, mpk_pool *pool, const mpk_mat *w, const float *x, float *y);
/* y[t][rows] = W x[t] for n inputs x[n][cols]: each row is read once for all n inputs (prefill);
 * every y[t][r] is computed exactly as mpk_matvec computes it. */
void mpk_matmat(const mpk_impl *k, mpk_pool *pool, const mpk_mat *w, const float *x, int64_t n, float *y);
/* dot(row r of w, x) (single-threaded). */
float mpk_row_dot(const mpk_impl *k, const mpk_mat *w, int64_t r, const float *x);
/* Decodes row r of w into out[cols] (embedding lookup, small vectors). */
void mpk_row(const mpk_mat *w, int64_t r, float *out);

/* Codebook f32 [stages][256][8] -> transposed [stages][8][256] (what mpk_rvq_lut reads). */
void mpk_rvq_transpose_cb(const float *cb, int stages, float *cbt);
/* Lookup table for one input vector: lut[(v*stages + s)*256 + e] = dot(x[8v..8v+8], cb[s][e]),
 * x zero-padded to nv*8.  Built once per input and shared by every matrix using the codebook. */
void mpk_rvq_lut(const mpk_impl *k, mpk_pool *pool, const float *cbt, int stages, const float *x,
                 int64_t cols, float *lut);
size_t mpk_rvq_lut_floats(int64_t cols, int stages);
/* y[rows] = scale[r] * sum_v sum_s lut[v][s][code[r][v][s]]. */
void mpk_rvq_matvec(const mpk_impl *k, mpk_pool *pool, const mpk_rvq *w, const float *lut, float *y);

/* Input rotation for rvq codecs with rotation "hadamard": out = H_block(signs * x) / sqrt(block)
 * (H = unnormalised Walsh-Hadamard per block), so that W x = W_codes out (spec/CODECS.md). */
void mpk_hadamard_rotate(const float *x, const float *signs, int64_t n, int64_t block, float *out);

/* Small vector helpers (single-threaded, fixed order). */
void mpk_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
float mpk_dot(const float *a, const float *b, int64_t n);
void mpk_axpy(float *y, float a, const float *x, int64_t n); /* y += a x */
void mpk_softmax(float *x, int64_t n);
float mpk_silu(float x);

#endif
