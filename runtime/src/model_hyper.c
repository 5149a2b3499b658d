/* GLM-5.3-Flash's manifold-constrained hyper-connections (FORMAT.md 7.2, `hyper_connections`):
 * the residual is N streams per token.  Before each attention and FFN block the streams give,
 * through one f32 projection `fn` of their RMS-normalised concatenation, N collapse weights
 * (pre), N expand weights (post) and an N x N mixing matrix made doubly stochastic by Sinkhorn
 * iterations (comb); the block reads sum_i pre_i X_i and the streams become
 * X'_j = post_j o + sum_i comb[i][j] X_i.  The final norm reads the streams' mean.  Per token, in
 * a fixed order and single-threaded: the same bits whatever the chunk size or thread count.
 * Inactive (hc_mult 0) for every other architecture. */
#include "io.h"
#include "model_internal.h"
#include "moepack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t mixes(const mpm_config *c) { return (2 + c->hc_mult) * c->hc_mult; }

int mpm_hc_load_layer(mpm_model *m, void *L, int l) {
    const mpm_config *c = &m->c;
    if (!c->hc_mult) return 0;
    static const char *block[2] = {"attn", "ffn"};
    mpm_layer *ly = &m->layers[l];
    const uint64_t k = (uint64_t)mixes(c);
    char n[160];
    int rc;
    for (int b = 0; b < 2; b++) {
        snprintf(n, sizeof n, "layers.%d.%s_hc.fn", l, block[b]);
        if ((rc = mpm_load_f32(L, n, k * (uint64_t)(c->hc_mult * c->hidden), &ly->hc_fn[b]))) return rc;
        snprintf(n, sizeof n, "layers.%d.%s_hc.base", l, block[b]);
        if ((rc = mpm_load_f32(L, n, k, &ly->hc_base[b]))) return rc;
        snprintf(n, sizeof n, "layers.%d.%s_hc.scale", l, block[b]);
        if ((rc = mpm_load_f32(L, n, 3u, &ly->hc_scale[b]))) return rc;
    }
    return 0;
}

/* streams [chunk][N][hidden], per-token post + comb [chunk][N + N^2], one token's new streams,
 * the projection's outputs; the f32 fn/base/scale of every layer */
uint64_t mpm_hc_scratch_bytes(const mpm_config *c, int chunk) {
    if (!c->hc_mult) return 0;
    const uint64_t T = (uint64_t)chunk, N = (uint64_t)c->hc_mult, H = (uint64_t)c->hidden;
    const uint64_t k = (uint64_t)mixes(c);
    return 4u * (T * N * H + T * (N + N * N) + N * H + k +
                 2u * (uint64_t)c->n_layers * (k * N * H + k + 3u));
}

int mpm_hc_alloc(mpm_model *m) {
    const mpm_config *c = &m->c;
    if (!c->hc_mult) return 0;
    const size_t N = (size_t)c->hc_mult, H = (size_t)c->hidden;
    m->hx = calloc(N * H + (size_t)mixes(c), sizeof(float));
    return m->hx ? 0 : -1;
}

int mpm_hc_chunk_alloc(mpm_model *m) {
    const mpm_config *c = &m->c;
    if (!c->hc_mult) return 0;
    const size_t T = (size_t)m->chunk, N = (size_t)c->hc_mult, H = (size_t)c->hidden;
    m->hs = mp_aligned_calloc(T * N * H, sizeof(float));
    m->hw = mp_aligned_calloc(T * (N + N * N), sizeof(float));
    return m->hs && m->hw ? 0 : -1;
}

void mpm_hc_chunk_free(mpm_model *m) {
    mp_aligned_free(m->hs);
    mp_aligned_free(m->hw);
    m->hs = m->hw = NULL;
}

void mpm_hc_free(mpm_model *m) {
    for (int64_t l = 0; m->layers && l < m->c.n_layers; l++)
        for (int b = 0; b < 2; b++) {
            free(m->layers[l].hc_fn[b]);
            free(m->layers[l].hc_base[b]);
            free(m->layers[l].hc_scale[b]);
        }
    free(m->hx);
}

void mpm_hc_embed(mpm_model *m, int T, const float *x) {
    const int64_t N = m->c.hc_mult, H = m->c.hidden;
    for (int t = 0; t < T; t++)
        for (int64_t i = 0; i < N; i++)
            memcpy(m->hs + (t * N + i) * H, x + (int64_t)t * H, (size_t)H * sizeof(float));
}

static float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

/* comb (row-major N x N) <- softmax per row + eps, then columns, rows, columns... normalised */
static void sinkhorn(const mpm_config *c, float *comb) {
    const int64_t N = c->hc_mult;
    const float eps = c->hc_eps;
    for (int64_t i = 0; i < N; i++) {
        float *r = comb + i * N, top = r[0], sum = 0.0f;
        for (int64_t j = 1; j < N; j++) top = r[j] > top ? r[j] : top;
        for (int64_t j = 0; j < N; j++) sum += (r[j] = expf(r[j] - top));
        for (int64_t j = 0; j < N; j++) r[j] = r[j] / sum + eps;
    }
    for (int64_t it = 0; it < c->hc_iters; it++) {
        if (it) /* rows, from the second round on */
            for (int64_t i = 0; i < N; i++) {
                float s = 0.0f;
                for (int64_t j = 0; j < N; j++) s += comb[i * N + j];
                for (int64_t j = 0; j < N; j++) comb[i * N + j] /= s + eps;
            }
        for (int64_t j = 0; j < N; j++) {
            float s = 0.0f;
            for (int64_t i = 0; i < N; i++) s += comb[i * N + j];
            for (int64_t i = 0; i < N; i++) comb[i * N + j] /= s + eps;
        }
    }
}

void mpm_hc_pre(mpm_model *m, int l, int block, int T, float *out) {
    const mpm_config *c = &m->c;
    const mpm_layer *ly = &m->layers[l];
    const int64_t N = c->hc_mult, H = c->hidden, NH = N * H, K = mixes(c);
    const float *fn = ly->hc_fn[block], *base = ly->hc_base[block], *scale = ly->hc_scale[block];
    float *y = m->hx + NH;
    for (int t = 0; t < T; t++) {
        const float *X = m->hs + t * NH;
        float ss = 0.0f;
        for (int64_t i = 0; i < NH; i++) ss += X[i] * X[i];
        const float inv = 1.0f / sqrtf(ss / (float)NH + c->eps);
        for (int64_t k = 0; k < K; k++) {
            const float *w = fn + k * NH;
            float d = 0.0f;
            for (int64_t i = 0; i < NH; i++) d += w[i] * X[i];
            y[k] = d * inv;
        }
        float *post = m->hw + t * (N + N * N), *comb = post + N;
        for (int64_t i = 0; i < N; i++) post[i] = 2.0f * sigmoid(y[N + i] * scale[1] + base[N + i]);
        for (int64_t i = 0; i < N * N; i++) comb[i] = y[2 * N + i] * scale[2] + base[2 * N + i];
        sinkhorn(c, comb);
        float *o = out + (int64_t)t * H;
        memset(o, 0, (size_t)H * sizeof(float));
        for (int64_t i = 0; i < N; i++)
            mpk_axpy(o, sigmoid(y[i] * scale[0] + base[i]) + c->hc_eps, X + i * H, H);
    }
}

void mpm_hc_post(mpm_model *m, int T, const float *o) {
    const mpm_config *c = &m->c;
    const int64_t N = c->hc_mult, H = c->hidden, NH = N * H;
    for (int t = 0; t < T; t++) {
        float *X = m->hs + t * NH, *nx = m->hx;
        const float *post = m->hw + t * (N + N * N), *comb = post + N;
        for (int64_t j = 0; j < N; j++) {
            float *d = nx + j * H;
            for (int64_t h = 0; h < H; h++) d[h] = post[j] * o[(int64_t)t * H + h];
            for (int64_t i = 0; i < N; i++) mpk_axpy(d, comb[i * N + j], X + i * H, H);
        }
        memcpy(X, nx, (size_t)NH * sizeof(float));
    }
}

void mpm_hc_final(mpm_model *m, int T, float *out) {
    const int64_t N = m->c.hc_mult, H = m->c.hidden;
    for (int t = 0; t < T; t++) {
        float *o = out + (int64_t)t * H;
        memset(o, 0, (size_t)H * sizeof(float));
        for (int64_t i = 0; i < N; i++) mpk_axpy(o, 1.0f, m->hs + (t * N + i) * H, H);
        for (int64_t h = 0; h < H; h++) o[h] /= (float)N;
    }
}
