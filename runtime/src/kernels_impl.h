/* Internal: the per-ISA kernel table (scalar in kernels.c, AVX2 in kernels_avx2.c). */
#ifndef MP_KERNELS_IMPL_H
#define MP_KERNELS_IMPL_H

#include "kernels.h"

struct mpk_impl {
    const char *name;
    float (*row_dot)(const mpk_mat *w, int64_t r, const float *x);
    void (*rvq_lut_block)(const float *cbt, int stages, const float *x, int64_t cols, int64_t v,
                          float *lut);
    /* out[i] = red8(lanes) of row i (codes + i*n), i < rows; no scale */
    void (*rvq_rows)(const uint8_t *codes, int64_t n, int64_t rows, const float *lut, float *out);
};

extern const mpk_impl mpk_scalar_impl;
extern const mpk_impl mpk_avx2_impl;

float mpk_red8(const float l[8]);

#endif
