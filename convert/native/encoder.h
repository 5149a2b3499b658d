/* The converter's native library moepack.convert._encoder (setup.py): the hot loops of k-means
 * codebook training and RVQ encoding (greedy and beam), loaded by convert/quant/native.py. The
 * inference engine never encodes, so none of this is in runtime/. Every loop runs in a fixed
 * order with plain f32 ops (no FMA contraction, no fast-math), so results are bit-identical
 * across thread counts and x86-64 machines. Vectors are 8-dimensional (the rvq `dim`); codebooks have `k` entries. */
#ifndef MP_ENCODER_H
#define MP_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#define MP_API __attribute__((visibility("default"))) /* built with -fvisibility=hidden */

#define MP_VQ_DIM 8

/* For each of n vectors x[n][8], the index of the nearest codeword of cb[k][8] and, if
 * dist != NULL, the squared distance |x|^2 + score (clamped at 0). Nearest = least score
 * |c|^2 - 2 x.c in the f32 order of encoder.c, ties -> lowest index. k <= 256; returns 0 or -1. */
MP_API int mp_vq_assign(const float *x, size_t n, const float *cb, int k, int32_t *idx,
                         float *dist);

/* d[i] = min(d[i], |x_i - c|^2) for one centre c[8] (k-means++ seeding); returns sum of d
 * (f64, in index order). */
MP_API double mp_vq_mindist_update(const float *x, size_t n, const float *c, float *d);

/* First i whose running f64 sum d[0] + ... + d[i] exceeds target (n-1 if none): D^2 sampling. */
MP_API size_t mp_vq_pick(const float *d, size_t n, double target);

/* Lloyd update: cb[j] = mean of the x_i with idx[i] == j, summed in f64 in index order; an empty
 * cluster keeps its old centre. k <= 256. Returns the number of empty clusters, or -1. */
MP_API int mp_vq_update(const float *x, size_t n, const int32_t *idx, int k, float *cb);

/* RVQ encoding of n vectors x[n][8] against cb[stages][k][8]: codes[n][stages]. beam == 1 is
 * greedy stage by stage; beam > 1 keeps the `beam` best partial code paths (total squared
 * error, ties -> earlier path, then lower code). beam <= MP_VQ_MAX_BEAM. */
#define MP_VQ_MAX_BEAM 16
MP_API int mp_rvq_encode(const float *x, size_t n, const float *cb, int stages, int k, int beam,
                         uint8_t *codes);

#endif
