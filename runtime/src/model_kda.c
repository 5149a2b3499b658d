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
 * Token by token, like model_linear.c (whose state handling it shares: a failed call leaves the
 * state as it was): any chunk size gives the same bits. */
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
    const mpm_config *c;
    const mpm_layer *ly;
    const float *q, *k, *v, *decay, *gate, *beta;
    float *o;        /* [heads][dv] */
    const float *S0; /* the recurrent state the token reads; S the one it writes (may be S0) */
    float *S;
} kda_job;

/* one head: per-channel decay, delta-rule update, read-out, sigmoid-gated RMSNorm */
static void kda_head(void *ctx, size_t h) {
    const kda_job *j = ctx;
    const mpm_config *c = j->c;
    const int64_t dk = c->la_dk, dv = c->la_dv, at = (int64_t)h * dk;
    const float *q = j->q + at, *k = j->k + at, *v = j->v + (int64_t)h * dv;
    const float *decay = j->decay + at, beta = j->beta[h];
    const float *S0 = j->S0 + (size_t)h * (size_t)(dk * dv);
    float *S = j->S + (size_t)h * (size_t)(dk * dv), *o = j->o + (int64_t)h * dv;
    mpl_delta_rule(S0, S, decay, 0.0f, q, k, v, beta, o, dk, dv);
    mpl_gated_rmsnorm(o, j->ly->la_norm, j->gate + (int64_t)h * dv, dv, c->eps, 1);
}

/* The projections of all T tokens at once (each weight read once per chunk; a token's values
 * do not depend on T), then the conv and the recurrence token by token. */
void mpm_kda_attention(mpm_model *m, int l, int pos, int T, const float *xn, float *out) {
    const mpm_config *c = &m->c;
    mpm_layer *ly = &m->layers[l];
    const int64_t nh = c->la_nk, dk = c->la_dk, qd = nh * dk, K = c->la_conv;
    const int64_t rec = 3 * qd * (K - 1); /* state: [conv inputs | recurrent matrices] */
    float *qkv[3], *b = m->lbuf;
    for (int i = 0; i < 3; i++, b += T * qd) qkv[i] = b;
    float *decay = b, *gate = decay + T * qd, *o = gate + T * qd, *beta = o + T * qd;
    float *low = beta + T * nh, *lowg = low + T * dk;
    for (int i = 0; i < 3; i++) mpk_matmat(m->kern, m->pool, &ly->la_in[i], xn, T, qkv[i]);
    mpk_matmat(m->kern, m->pool, &ly->kda_fa, xn, T, low);
    mpk_matmat(m->kern, m->pool, &ly->kda_fb, low, T, decay);
    mpk_matmat(m->kern, m->pool, &ly->kda_b, xn, T, beta);
    if (c->kda_full_gate) { /* Kimi K3: one full-rank output gate */
        mpk_matmat(m->kern, m->pool, &ly->kda_g, xn, T, gate);
    } else {
        mpk_matmat(m->kern, m->pool, &ly->kda_ga, xn, T, lowg);
        mpk_matmat(m->kern, m->pool, &ly->kda_gb, lowg, T, gate);
    }
    for (int t = 0; t < T; t++) {
        const float *src;
        float *dst;
        mpm_linear_state(m, ly, pos + t, &src, &dst); /* zero at pos 0 */
        for (int i = 0; i < 3; i++) /* the channels of q, then k, then v */
            mpl_conv_step(qkv[i] + t * qd, qd, ly->la_conv + i * qd * K, src + i * qd * (K - 1),
                          dst + i * qd * (K - 1), K);
        float *q = qkv[0] + t * qd, *k = qkv[1] + t * qd, *dec = decay + t * qd, *bt = beta + t * nh;
        for (int64_t h = 0; h < nh; h++) {
            mpl_l2norm(q + h * dk, dk, 1.0f / sqrtf((float)dk));
            mpl_l2norm(k + h * dk, dk, 1.0f);
        }
        if (c->kda_bound < 0) /* Kimi K3: bounded, bound . sigmoid(exp(A_log) (z + dt_bias)) */
            for (int64_t i = 0; i < qd; i++)
                dec[i] = expf(c->kda_bound * mpl_sigmoid(expf(ly->la_A[i / dk]) * (dec[i] + ly->la_dt[i])));
        else
            for (int64_t i = 0; i < qd; i++)
                dec[i] = expf(-expf(ly->la_A[i / dk]) * mpl_softplus(dec[i] + ly->la_dt[i]));
        for (int64_t h = 0; h < nh; h++) bt[h] = mpl_sigmoid(bt[h]);
        kda_job j = {c, ly, q, k, qkv[2] + t * qd, dec, gate + t * qd, bt, o + t * qd, src + rec, dst + rec};
        mpk_pool_run(m->pool, (size_t)nh, kda_head, &j);
    }
    mpk_matmat(m->kern, m->pool, &ly->la_out, o, T, out);
}
