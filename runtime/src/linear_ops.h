/* Per-token pieces shared by the linear-attention layers (model_linear.c: Gated DeltaNet,
 * model_kda.c: Kimi Delta Attention): activations, L2 norm, one step of the depthwise causal
 * conv, the gated RMSNorm of the output.  Header-only so both units inline them. */
#ifndef MP_LINEAR_OPS_H
#define MP_LINEAR_OPS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#define MPL_MAX_DV 4096 /* value head size bound (model_config.c MAX_HEAD_DIM) */

static inline float mpl_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float mpl_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* torch.nn.functional.softplus (beta 1, threshold 20) */
static inline float mpl_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* v *= scale / sqrt(sum v^2 + 1e-6) (fla's l2norm) */
static inline void mpl_l2norm(float *v, int64_t n, float scale) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += v[i] * v[i];
    float inv = 1.0f / sqrtf(ss + 1e-6f) * scale;
    for (int64_t i = 0; i < n; i++) v[i] *= inv;
}

/* One token through a depthwise causal conv of kernel K, then silu, in place over `channels`:
 * w [channels][K]; src [channels][K-1] holds each channel's previous K-1 inputs (oldest first),
 * dst gets them shifted by this token (dst may be src). */
static inline void mpl_conv_step(float *x, int64_t channels, const float *w, const float *src,
                                 float *dst, int64_t K) {
    for (int64_t ch = 0; ch < channels; ch++) {
        const float *s = src + ch * (K - 1);
        float *d = dst + ch * (K - 1);
        const float *wc = w + ch * K, xin = x[ch];
        float y = 0.0f;
        for (int64_t i = 0; i < K - 1; i++) y += wc[i] * s[i];
        y += wc[K - 1] * xin;
        if (K > 1) {
            memmove(d, s + 1, (size_t)(K - 2) * sizeof(float));
            d[K - 2] = xin;
        }
        x[ch] = mpl_silu(y);
    }
}

/* One head's gated delta rule: S = diag(decay) S0 (row i scaled by decay[i], or all rows by
 * decay_all when decay is NULL), S += k (x) ((v - S^T k) * beta), o = S^T q; S [dk][dv] may be S0.
 * Two passes over S, each row finished before it is read. */
static inline void mpl_delta_rule(const float *S0, float *S, const float *decay, float decay_all,
                                  const float *q, const float *k, const float *v, float beta,
                                  float *o, int64_t dk, int64_t dv) {
    float delta[MPL_MAX_DV];
    memset(delta, 0, (size_t)dv * sizeof(float));
    for (int64_t i = 0; i < dk; i++) {
        float *row = S + i * dv;
        const float *row0 = S0 + i * dv, d = decay ? decay[i] : decay_all;
        for (int64_t jv = 0; jv < dv; jv++) row[jv] = row0[jv] * d;
        mpk_axpy(delta, k[i], row, dv);
    }
    for (int64_t jv = 0; jv < dv; jv++) delta[jv] = (v[jv] - delta[jv]) * beta;
    memset(o, 0, (size_t)dv * sizeof(float));
    for (int64_t i = 0; i < dk; i++) {
        mpk_axpy(S + i * dv, k[i], delta, dv);
        mpk_axpy(o, q[i], S + i * dv, dv);
    }
}

/* o[i] = w[i] * rmsnorm(o)[i] * act(z[i]) over one head of n values; sigmoid_gate selects
 * sigmoid (KDA) instead of silu (Gated DeltaNet) */
static inline void mpl_gated_rmsnorm(float *o, const float *w, const float *z, int64_t n, float eps,
                                     int sigmoid_gate) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += o[i] * o[i];
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++)
        o[i] = w[i] * (o[i] * inv) * (sigmoid_gate ? mpl_sigmoid(z[i]) : mpl_silu(z[i]));
}

#endif
