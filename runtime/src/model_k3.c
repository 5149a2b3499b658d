/* Kimi K3's parts of the forward pass (docs/K3.md; FORMAT.md 7.1), each inactive for other
 * architectures: block attention residuals (AttnRes), the latent MoE's projections and norm, the
 * sigmoid output gate on MLA heads.  SiTU-GLU is mpm_act (model_internal.h); the bounded decay
 * and the full-rank output gate of its KDA layers live in model_kda.c.
 *
 * AttnRes, per token: a bank of the raw residual stream at every block start (the embedding and
 * each finished block's sum of sublayer outputs); before each attention, FFN and the final norm
 * the input is the softmax mix of bank + [current stream] with scores
 * dot(v, w) / sqrt(mean(v^2) + eps), w = res_norm x res_proj.  Per token and in a fixed order:
 * the same bits whatever the chunk size or thread count. */
#include "io.h"
#include "model_internal.h"
#include "moepack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t banks(const mpm_config *c) {
    return c->res_block ? (c->n_layers + c->res_block - 1) / c->res_block : 0;
}

/* one AttnRes score vector: the product of its stored pair `pre`_norm, `pre`_proj */
static int load_score(const mpm_config *c, void *L, const char *pre, float **out) {
    char n[160];
    float *a = NULL, *b = NULL;
    int rc;
    snprintf(n, sizeof n, "%s_norm", pre);
    if ((rc = mpm_load_f32(L, n, (uint64_t)c->hidden, &a))) return rc;
    snprintf(n, sizeof n, "%s_proj", pre);
    if ((rc = mpm_load_f32(L, n, (uint64_t)c->hidden, &b))) {
        free(a);
        return rc;
    }
    for (int64_t i = 0; i < c->hidden; i++) a[i] *= b[i];
    free(b);
    *out = a;
    return 0;
}

int mpm_k3_load_layer(mpm_model *m, void *L, int l) {
    const mpm_config *c = &m->c;
    mpm_layer *ly = &m->layers[l];
    const int64_t H = c->hidden;
    char n[160];
    int rc;
    if (c->res_block) {
        snprintf(n, sizeof n, "layers.%d.attn_res", l);
        if ((rc = load_score(c, L, n, &ly->res_attn))) return rc;
        snprintf(n, sizeof n, "layers.%d.ffn_res", l);
        if ((rc = load_score(c, L, n, &ly->res_ffn))) return rc;
    }
    if (c->latent && c->layer_is_moe[l]) {
        snprintf(n, sizeof n, "layers.%d.latent_down", l);
        if ((rc = mpm_load_mat(L, n, c->latent, H, &ly->lat_down))) return rc;
        snprintf(n, sizeof n, "layers.%d.latent_norm", l);
        if ((rc = mpm_load_f32(L, n, (uint64_t)c->latent, &ly->lat_norm))) return rc;
        snprintf(n, sizeof n, "layers.%d.latent_up", l);
        if ((rc = mpm_load_mat(L, n, H, c->latent, &ly->lat_up))) return rc;
    }
    if (c->mla_gate && !(c->layer_is_linear && c->layer_is_linear[l])) {
        snprintf(n, sizeof n, "layers.%d.attn.gate", l);
        if ((rc = mpm_load_mat(L, n, c->n_heads * c->v_head_dim, H, &ly->mla_g))) return rc;
    }
    return 0;
}

int mpm_k3_load_final(mpm_model *m, void *L) {
    return m->c.res_block ? load_score(&m->c, L, "final_res", &m->res_final) : 0;
}

uint64_t mpm_k3_scratch_bytes(const mpm_config *c, int chunk) {
    const uint64_t T = (uint64_t)chunk, H = (uint64_t)c->hidden;
    uint64_t f = T * (uint64_t)banks(c) * H + T * (uint64_t)c->latent +
                 (c->mla_gate ? T * (uint64_t)(c->n_heads * c->v_head_dim) : 0);
    if (c->res_block) f += (2u * (uint64_t)c->n_layers + 1u) * H; /* score vectors */
    if (c->latent) f += (uint64_t)c->n_layers * (uint64_t)c->latent;
    return 4u * f;
}

int mpm_k3_chunk_alloc(mpm_model *m) {
    const mpm_config *c = &m->c;
    const size_t T = (size_t)m->chunk;
    if (c->res_block && !(m->rbank = mp_aligned_calloc(T * (size_t)banks(c) * (size_t)c->hidden, sizeof(float)))) return -1;
    if (c->latent && !(m->klat = mp_aligned_calloc(T * (size_t)c->latent, sizeof(float)))) return -1;
    if (c->mla_gate && !(m->kgate = mp_aligned_calloc(T * (size_t)(c->n_heads * c->v_head_dim), sizeof(float)))) return -1;
    return 0;
}

void mpm_k3_chunk_free(mpm_model *m) {
    mp_aligned_free(m->rbank);
    mp_aligned_free(m->klat);
    mp_aligned_free(m->kgate);
    m->rbank = m->klat = m->kgate = NULL;
}

void mpm_k3_free(mpm_model *m) {
    for (int64_t l = 0; m->layers && l < m->c.n_layers; l++) {
        free(m->layers[l].res_attn);
        free(m->layers[l].res_ffn);
        free(m->layers[l].lat_norm);
    }
    free(m->res_final);
}

static float res_score(const float *v, const float *w, int64_t H, float eps) {
    float ss = 0.0f, dot = 0.0f;
    for (int64_t i = 0; i < H; i++) {
        ss += v[i] * v[i];
        dot += v[i] * w[i];
    }
    return dot / sqrtf(ss / (float)H + eps);
}

void mpm_res_mix(mpm_model *m, const float *score, int T, const float *x, float *out) {
    const mpm_config *c = &m->c;
    const int64_t H = c->hidden, nb = banks(c);
    const int n = m->rbank_n;
    for (int t = 0; t < T; t++) {
        const float *cur = x + (int64_t)t * H, *bank = m->rbank + (int64_t)t * nb * H;
        float *o = out + (int64_t)t * H, p[MPM_MAX_RES_SOURCES], top;
        if (!n) {
            memcpy(o, cur, (size_t)H * sizeof(float));
            continue;
        }
        for (int j = 0; j < n; j++) p[j] = res_score(bank + (int64_t)j * H, score, H, c->eps);
        p[n] = res_score(cur, score, H, c->eps);
        top = p[0];
        for (int j = 1; j <= n; j++) top = p[j] > top ? p[j] : top;
        float sum = 0.0f;
        for (int j = 0; j <= n; j++) sum += (p[j] = expf(p[j] - top));
        for (int64_t i = 0; i < H; i++) o[i] = p[n] / sum * cur[i];
        for (int j = 0; j < n; j++) mpk_axpy(o, p[j] / sum, bank + (int64_t)j * H, H);
    }
}

int mpm_res_push(mpm_model *m, int l, int T, const float *x) {
    const mpm_config *c = &m->c;
    if (!c->res_block || l % c->res_block) return 0;
    const int64_t H = c->hidden, nb = banks(c);
    for (int t = 0; t < T; t++)
        memcpy(m->rbank + ((int64_t)t * nb + m->rbank_n) * H, x + (int64_t)t * H, (size_t)H * sizeof(float));
    m->rbank_n++;
    return 1;
}

void mpm_latent_in(mpm_model *m, const mpm_layer *ly, int T, const float *xn, float *z) {
    mpm_matmat(m, &ly->lat_down, xn, T, z);
}

void mpm_latent_out(mpm_model *m, const mpm_layer *ly, int T, float *sum, float *out) {
    const int64_t D = m->c.latent;
    for (int t = 0; t < T; t++) {
        float *s = sum + (int64_t)t * D, ss = 0.0f;
        for (int64_t i = 0; i < D; i++) ss += s[i] * s[i];
        const float r = 1.0f / sqrtf(ss / (float)D + m->c.eps);
        for (int64_t i = 0; i < D; i++) s[i] = s[i] * r * ly->lat_norm[i];
    }
    mpm_matmat(m, &ly->lat_up, sum, T, out);
}

void mpm_mla_gate(mpm_model *m, const mpm_layer *ly, int T, const float *xn, float *att) {
    const int64_t od = m->c.n_heads * m->c.v_head_dim;
    mpm_matmat(m, &ly->mla_g, xn, T, m->kgate);
    for (int64_t i = 0; i < T * od; i++) att[i] *= 1.0f / (1.0f + expf(-m->kgate[i]));
}
