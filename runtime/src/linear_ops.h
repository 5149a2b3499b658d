/* Per-token pieces shared by the linear-attention layers (model_linear.c: Gated DeltaNet,
 * model_kda.c: Kimi Delta Attention): activations, L2 norm, one step of the depthwise causal
 * conv, the gated RMSNorm of the output (inlined by both units); the delta rule over a call. */
#ifndef MP_LINEAR_OPS_H
#define MP_LINEAR_OPS_H

#include <math.h>
#include <stdint.h>

#include "kernels.h"

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
        if (K > 1) { /* forward: d may be s */
            for (int64_t i = 0; i < K - 2; i++) d[i] = s[i + 1];
            d[K - 2] = xin;
        }
        x[ch] = mpk_silu(y);
    }
}

/* One head over the T tokens of a call (linear_recur.c): token t's vectors at q + t * qs and so
 * on; decay: dk values per token (per_channel, KDA) or one (Gated DeltaNet) */
typedef struct mpl_seq {
    const float *q, *k, *v, *decay, *beta;
    int64_t qs, ks, vs, ds, bs;
    float *o; /* token t's output at o + t * os */
    int64_t os, dk, dv;
    int per_channel;
} mpl_seq;

/* The gated delta rule over tokens 0..T-1 at positions pos..: the first step reads S0, every
 * later one S, the state written ([dk][dv]; may be S0).  Sub-chunks of L positions aligned to
 * multiples of L and inside the call run in the chunk form, the other tokens one by one (L <= 1:
 * all).  ws: mpl_ws_floats(dk, dv, L).  simd: the AVX2 build of the same operations (same bits). */
void mpl_recur(const mpl_seq *s, int pos, int T, int L, const float *S0, float *S, float *ws,
               int simd);
uint64_t mpl_ws_floats(int64_t dk, int64_t dv, int L);

/* o[i] = w[i] * rmsnorm(o)[i] * act(z[i]) over one head of n values; sigmoid_gate selects
 * sigmoid (KDA) instead of silu (Gated DeltaNet) */
static inline void mpl_gated_rmsnorm(float *o, const float *w, const float *z, int64_t n, float eps,
                                     int sigmoid_gate) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += o[i] * o[i];
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++)
        o[i] = w[i] * (o[i] * inv) * (sigmoid_gate ? mpl_sigmoid(z[i]) : mpk_silu(z[i]));
}

#endif
