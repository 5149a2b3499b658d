/* Kimi Delta Attention (Kimi-Linear; FORMAT.md §7 `linear_attention` kind `kda`): a gated delta
 * rule whose decay is per channel of each key head instead of per head.
 *
 * Per linear layer the state is the last K-1 inputs of the depthwise causal conv over the
 * [q k v] channels ([3·heads·dk][K-1]) and the recurrent matrix S ([heads][dk][dv], dk = dv).
 * For each token x:
 *   [q k v] = silu(causal_conv([Wq x, Wk x, Wv x]))
 *   q, k L2-normalised per head (eps 1e-6), q /= sqrt(dk)
 *   g = -exp(A_log[h]) * softplus(Wfb (Wfa x) + dt_bias)        (per channel)
 *   beta = sigmoid(Wb x)                                         (per head)
 *   S = diag(exp(g)) S;  S += k (x) ((v - S^T k) * beta);  o = S^T q
 *   out = Wout (rmsnorm(o) * norm_w * sigmoid(Wgb (Wga x)))     (per head)
 * The conv token by token, the recurrence in aligned sub-chunks (linear_recur.c), one task per
 * head; the state handling is model_linear.c's (a failed call leaves the state as it was). */
#include "linear_ops.h"
#include "model_internal.h"
#include "moepack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* per chunk token: q, k, v (after the conv), decay, output gate, o, beta, two low-rank vectors */
uint64_t mpm_kda_chunk_floats(const mpm_config *c) {
    const uint64_t qd = (uint64_t)(c->la_nk * c->la_dk);
    return 6u * qd + (uint64_t)c->la_nk + 2u * (uint64_t)c->la_dk;
}

int mpm_kda_load(mpm_model *m, void *L, int l) {
    const mpm_config *c = &m->c;
    mpm_layer *ly = &m->layers[l];
    const int64_t H = c->hidden, nh = c->la_nk, dk = c->la_dk, qd = nh * dk, K = c->la_conv;
    char n[160];
    int rc;
#define NAME(suffix) snprintf(n, sizeof n, "layers.%d.linear.%s", l, suffix)
    static const char *const QKV[3] = {"q", "k", "v"}, *const CONV[3] = {"q_conv", "k_conv", "v_conv"};
    ly->la_nin = 3;
    for (int i = 0; i < 3; i++) {
        NAME(QKV[i]);
        if ((rc = mpm_load_mat(L, n, qd, H, &ly->la_in[i]))) return rc;
    }
    /* the three convs as one [3·qd][K] weight, the channel order of [q k v] */
    if (!(ly->la_conv = malloc((size_t)(3 * qd * K) * sizeof(float)))) return MP_ENOMEM;
    for (int i = 0; i < 3; i++) {
        float *w;
        NAME(CONV[i]);
        if ((rc = mpm_load_f32(L, n, (uint64_t)(qd * K), &w))) return rc;
        memcpy(ly->la_conv + (int64_t)i * qd * K, w, (size_t)(qd * K) * sizeof(float));
        free(w);
    }
    struct { const char *name; int64_t rows, cols; mpk_mat *dst; } mats[] = {
        {"f_a", dk, H, &ly->kda_fa}, {"f_b", qd, dk, &ly->kda_fb}, {"b", nh, H, &ly->kda_b},
        {"out", H, qd, &ly->la_out}, {"g_a", dk, H, &ly->kda_ga}, {"g_b", qd, dk, &ly->kda_gb},
        {"g", qd, H, &ly->kda_g}};
    /* the output gate: low-rank g_b . g_a (Kimi-Linear) or one full-rank g (Kimi K3) */
    const size_t first = c->kda_full_gate ? 6 : 4, last = c->kda_full_gate ? 7 : 6;
    for (size_t i = 0; i < last; i++) {
        if (i >= 4 && i < first) continue;
        NAME(mats[i].name);
        if ((rc = mpm_load_mat(L, n, mats[i].rows, mats[i].cols, mats[i].dst))) return rc;
    }
    NAME("dt_bias");
    if ((rc = mpm_load_f32(L, n, (uint64_t)qd, &ly->la_dt))) return rc;
    NAME("A_log");
    if ((rc = mpm_load_f32(L, n, (uint64_t)nh, &ly->la_A))) return rc;
    NAME("norm");
    return mpm_load_f32(L, n, (uint64_t)dk, &ly->la_norm);
#undef NAME
}

typedef struct {
    mpm_model *m;
    const mpm_layer *ly;
    float *qkv[3], *decay, *gate, *beta, *o; /* per token: [heads][dk] ([heads] for beta) */
    int pos, T;
    const float *src; /* the state the call's first token reads; dst the one written (may be src) */
    float *dst;
} kda_job;

/* one head: the causal conv of its q, k, v channels, q and k L2-normalised, per-channel decay
 * and beta, token by token; then the delta rule and the sigmoid-gated RMSNorm of the output */
static void kda_head(void *ctx, size_t h) {
    const kda_job *j = ctx;
    const mpm_config *c = &j->m->c;
    const mpm_layer *ly = j->ly;
    const int64_t nh = c->la_nk, dk = c->la_dk, qd = nh * dk, K = c->la_conv, at = (int64_t)h * dk;
    const float eA = expf(ly->la_A[h]), *dt = ly->la_dt + at;
    for (int t = 0; t < j->T; t++) {
        for (int i = 0; i < 3; i++) { /* the channels of q, then k, then v */
            const int64_t ch = i * qd + at;
            float *dst = j->dst + ch * (K - 1);
            mpl_conv_step(j->qkv[i] + t * qd + at, dk, ly->la_conv + ch * K,
                          t ? dst : j->src + ch * (K - 1), dst, K);
        }
        mpl_l2norm(j->qkv[0] + t * qd + at, dk, 1.0f / sqrtf((float)dk));
        mpl_l2norm(j->qkv[1] + t * qd + at, dk, 1.0f);
        float *dec = j->decay + t * qd + at;
        if (c->kda_bound < 0) /* Kimi K3: bounded, bound . sigmoid(exp(A_log) (z + dt_bias)) */
            for (int64_t i = 0; i < dk; i++) dec[i] = expf(c->kda_bound * mpl_sigmoid(eA * (dec[i] + dt[i])));
        else
            for (int64_t i = 0; i < dk; i++) dec[i] = expf(-eA * mpl_softplus(dec[i] + dt[i]));
        j->beta[t * nh + (int64_t)h] = mpl_sigmoid(j->beta[t * nh + (int64_t)h]);
    }
    const mpl_seq s = {.q = j->qkv[0] + at, .k = j->qkv[1] + at, .v = j->qkv[2] + at,
                       .decay = j->decay + at, .beta = j->beta + h, .qs = qd, .ks = qd, .vs = qd,
                       .ds = qd, .bs = nh, .o = j->o + at, .os = qd, .dk = dk, .dv = dk,
                       .per_channel = 1};
    const int64_t rec = 3 * qd * (K - 1); /* state: [conv inputs | recurrent matrices] */
    mpm_linear_head_out(j->m, ly, &s, h, j->pos, j->T, j->src, j->dst, rec, j->gate + at, qd, 1);
}

/* The projections of all T tokens at once (each weight read once per chunk; a token's values
 * do not depend on T), then the heads. */
void mpm_kda_attention(mpm_model *m, int l, int pos, int T, const float *xn, float *out) {
    const mpm_config *c = &m->c;
    mpm_layer *ly = &m->layers[l];
    const int64_t nh = c->la_nk, dk = c->la_dk, qd = nh * dk;
    kda_job j = {.m = m, .ly = ly, .pos = pos, .T = T};
    float *b = m->lbuf;
    for (int i = 0; i < 3; i++, b += T * qd) j.qkv[i] = b;
    j.decay = b, j.gate = b + T * qd, j.o = j.gate + T * qd, j.beta = j.o + T * qd;
    float *low = j.beta + T * nh, *lowg = low + T * dk;
    for (int i = 0; i < 3; i++) mpm_matmat(m, &ly->la_in[i], xn, T, j.qkv[i]);
    mpm_matmat(m, &ly->kda_fa, xn, T, low);
    mpm_matmat(m, &ly->kda_fb, low, T, j.decay);
    mpm_matmat(m, &ly->kda_b, xn, T, j.beta);
    if (c->kda_full_gate) { /* Kimi K3: one full-rank output gate */
        mpm_matmat(m, &ly->kda_g, xn, T, j.gate);
    } else {
        mpm_matmat(m, &ly->kda_ga, xn, T, lowg);
        mpm_matmat(m, &ly->kda_gb, lowg, T, j.gate);
    }
    mpm_linear_state(m, ly, pos, &j.src, &j.dst); /* zero at pos 0 */
    mpk_pool_run(m->pool, (size_t)nh, kda_head, &j);
    mpm_matmat(m, &ly->la_out, j.o, T, out);
}
