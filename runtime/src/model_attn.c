/* Attention: RoPE (plain and YaRN, optionally on part of each head), GQA with a KV cache (optional
 * q/k/v biases, per-head or full-width qk-norm), and MLA with
 * the compressed latent cache and absorbed projections (DeepSeek-V3): per head, the query's
 * no-position part is mapped into latent space through kv_b's key rows, scores are taken against
 * the cached latents, and the value is read back through kv_b's value rows, so K and V are never
 * expanded per token. */
#include "model_internal.h"
#include "moepack.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double yarn_get_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

int mpm_rope_init(mpm_model *m) {
    const mpm_config *c = &m->c;
    /* GQA may rotate only the first rotary_dim dims of each head (GLM-4.5, MiniMax-M2) */
    int64_t dim = c->mla ? c->qk_rope_dim : c->rotary_dim, half = dim / 2;
    m->rope_dim = dim;
    m->inv_freq = calloc((size_t)half, sizeof(double));
    if (!m->inv_freq) return MP_ENOMEM;
    /* f32 like transformers: base ** (2i/dim) in f32, then 1/x */
    for (int64_t i = 0; i < half; i++) {
        float pf = powf((float)c->rope_theta, (float)(2 * i) / (float)dim);
        m->inv_freq[i] = (double)(1.0f / pf);
    }
    m->rope_mscale = 1.0f;
    double qk = c->mla ? (double)(c->qk_nope_dim + c->qk_rope_dim) : (double)c->head_dim;
    m->attn_scale = (float)pow(qk, -0.5);
    if (c->yarn) {
        double f = c->yarn_factor, base = c->rope_theta, omp = (double)c->yarn_orig_max_pos;
        double af = c->yarn_attn_factor;
        if (!(af > 0)) af = (c->yarn_mscale != 0 && c->yarn_mscale_all_dim != 0)
                                ? yarn_get_mscale(f, c->yarn_mscale) / yarn_get_mscale(f, c->yarn_mscale_all_dim)
                                : yarn_get_mscale(f, 1.0);
        m->rope_mscale = (float)af;
        double lo = (double)dim * log(omp / (c->yarn_beta_fast * 2 * 3.14159265358979323846)) / (2 * log(base));
        double hi = (double)dim * log(omp / (c->yarn_beta_slow * 2 * 3.14159265358979323846)) / (2 * log(base));
        lo = floor(lo);
        hi = ceil(hi);
        if (lo < 0) lo = 0;
        if (hi > (double)(dim - 1)) hi = (double)(dim - 1);
        if (lo == hi) hi += 0.001;
        for (int64_t i = 0; i < half; i++) {
            float pf = powf((float)base, (float)(2 * i) / (float)dim);
            float extra = 1.0f / pf, inter = 1.0f / ((float)f * pf);
            float ramp = (float)(((double)i - lo) / (hi - lo));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float ef = 1.0f - ramp;
            m->inv_freq[i] = (double)(inter * (1.0f - ef) + extra * ef);
        }
        if (c->mla && c->yarn_mscale_all_dim != 0) { /* DeepSeek's MLA only; GQA keeps head_dim^-0.5 */
            double ms = yarn_get_mscale(f, c->yarn_mscale_all_dim);
            m->attn_scale = (float)((double)m->attn_scale * ms * ms);
        }
    }
    return 0;
}

static void rope_tables(mpm_model *m, int pos) {
    int64_t half = m->rope_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = (float)pos * (float)m->inv_freq[i];
        m->cosb[i] = cosf(a) * m->rope_mscale;
        m->sinb[i] = sinf(a) * m->rope_mscale;
    }
}

/* v[dim] rotated in place; interleaved: pairs (2i, 2i+1) in, halves out (as transformers). */
static void rope_apply(const mpm_model *m, float *v, int interleaved) {
    int64_t half = m->rope_dim / 2;
    float tmp[1024];
    float *t = m->rope_dim <= 1024 ? tmp : NULL;
    if (interleaved && t) {
        for (int64_t i = 0; i < half; i++) {
            float a = v[2 * i], b = v[2 * i + 1];
            t[i] = a * m->cosb[i] - b * m->sinb[i];
            t[half + i] = b * m->cosb[i] + a * m->sinb[i];
        }
        memcpy(v, t, (size_t)m->rope_dim * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * m->cosb[i] - b * m->sinb[i];
        v[i + half] = b * m->cosb[i] + a * m->sinb[i];
    }
}

void mpm_rope_tables(mpm_model *m, int pos) { rope_tables(m, pos); }
void mpm_rope_apply(const mpm_model *m, float *v, int interleaved) { rope_apply(m, v, interleaved); }

static void rms_inplace(float *v, const float *w, int64_t n, float eps) { mpk_rmsnorm(v, v, w, n, eps); }

/* Attention of the token at pos over this layer's cached positions (sliding window: the last
 * w); the tasks are model_kv.c's. */
static void gqa_token(mpm_model *m, const mpm_layer *ly, int pos, const float *q, float *out) {
    const mpm_config *c = &m->c;
    int64_t w = c->sliding_window, t0 = w > 0 && pos + 1 > w ? pos + 1 - w : 0;
    mpm_attn_span a = {mpm_kv_row(m, m->kc, ly->kv_slot, t0), mpm_kv_row(m, m->vc, ly->kv_slot, t0),
                    pos + 1 - t0, c->n_heads, c->head_dim, 0, c->head_dim, c->head_dim,
                    q, c->head_dim, out, c->head_dim, m->attn_scale};
    mpm_attend(m, &a);
}

/* Projections for the whole chunk at once (rows read once), then RoPE and the cache write per
 * token, then attention per token (causal: token t sees positions <= pos + t). */
static void gqa(mpm_model *m, int l, int pos, int T, const float *xn, float *out) {
    const mpm_config *c = &m->c;
    mpm_layer *ly = &m->layers[l];
    int64_t hd = c->head_dim, kvd = c->n_kv_heads * hd, qd = c->n_heads * hd;
    if (c->attn_gate) /* q rows interleaved with output-gate rows: per token (model_linear.c) */
        for (int t = 0; t < T; t++) mpm_gated_query(m, ly, xn + t * c->hidden, m->q + t * qd, NULL);
    else
        mpm_matmat(m, &ly->q, xn, T, m->q);
    mpm_matmat(m, &ly->k, xn, T, m->kbuf);
    mpm_matmat(m, &ly->v, xn, T, m->vbuf);
    /* per-head qk-norm (Qwen3, GLM) or one norm over all heads (MiniMax-M2), after the biases */
    int full = c->qk_norm && c->qk_norm_full, per_head = c->qk_norm && !c->qk_norm_full;
    for (int t = 0; t < T; t++) {
        float *q = m->q + t * qd, *k = m->kbuf + t * kvd;
        if (c->qkv_bias) {
            mpk_axpy(q, 1.0f, ly->q_bias, qd);
            mpk_axpy(k, 1.0f, ly->k_bias, kvd);
            mpk_axpy(m->vbuf + t * kvd, 1.0f, ly->v_bias, kvd);
        }
        if (full) {
            rms_inplace(q, ly->q_norm, qd, c->eps);
            rms_inplace(k, ly->k_norm, kvd, c->eps);
        }
        rope_tables(m, pos + t);
        for (int64_t h = 0; h < c->n_heads; h++) {
            if (per_head) rms_inplace(q + h * hd, ly->q_norm, hd, c->eps);
            rope_apply(m, q + h * hd, 0);
        }
        for (int64_t h = 0; h < c->n_kv_heads; h++) {
            if (per_head) rms_inplace(k + h * hd, ly->k_norm, hd, c->eps);
            rope_apply(m, k + h * hd, 0);
        }
        mpm_kv_put(m, mpm_kv_row(m, m->kc, ly->kv_slot, pos + t), k, kvd);
        mpm_kv_put(m, mpm_kv_row(m, m->vc, ly->kv_slot, pos + t), m->vbuf + t * kvd, kvd);
    }
    for (int t = 0; t < T; t++) {
        gqa_token(m, ly, pos + t, m->q + t * qd, m->att + t * qd);
        if (c->attn_gate) { /* sigmoid output gate, recomputed: no chunk-sized gate buffer */
            mpm_gated_query(m, ly, xn + t * c->hidden, NULL, m->q + t * qd);
            mpm_apply_gate(m->att + t * qd, m->q + t * qd, qd);
        }
    }
    mpm_matmat(m, &ly->o, m->att, T, out);
}

typedef struct {
    mpm_model *m;
    const mpm_layer *ly;
    const float *q; /* this token's queries (all heads) */
    float *out;     /* this token's head outputs */
} mla_job;

/* absorbed query of head h: ql = sum_j q_nope[j] * kv_b[h*(nope+vd) + j][:], then q_rope */
static void mla_query(void *ctx, size_t h) {
    const mla_job *j = ctx;
    const mpm_config *c = &j->m->c;
    const int64_t R = c->kv_lora_rank, nope = c->qk_nope_dim, rope = c->qk_rope_dim;
    const int64_t vd = c->v_head_dim, qk = nope + rope;
    const float *q = j->q + (int64_t)h * qk;
    float *ql = j->m->qlat + (int64_t)h * (R + rope);
    float *row = j->m->olat + (int64_t)h * R; /* row scratch until the attention writes it */
    memset(ql, 0, (size_t)R * sizeof(float));
    for (int64_t jn = 0; jn < nope; jn++) {
        mpk_row(&j->ly->kv_b, (int64_t)h * (nope + vd) + jn, row);
        mpk_axpy(ql, q[jn], row, R);
    }
    memcpy(ql + R, q + nope, (size_t)rope * sizeof(float));
}

/* head h's value: kv_b's value rows times its latent output */
static void mla_value(void *ctx, size_t h) {
    const mla_job *j = ctx;
    const mpm_config *c = &j->m->c;
    const int64_t R = c->kv_lora_rank, nope = c->qk_nope_dim, vd = c->v_head_dim;
    const float *ol = j->m->olat + (int64_t)h * R;
    float *out = j->out + (int64_t)h * vd;
    const int64_t r0 = (int64_t)h * (nope + vd) + nope;
    mpk_matvec_rows(j->m->kern, &j->ly->kv_b, r0, r0 + vd, ol, out);
}

/* scores against the cached latents, the value read back through kv_b: K and V never expanded */
static void mla_token(mpm_model *m, const mpm_layer *ly, int pos, int t, const float *q, float *out) {
    const mpm_config *c = &m->c;
    const int64_t R = c->kv_lora_rank, rope = c->qk_rope_dim;
    mla_job j = {m, ly, q, out};
    mpk_pool_run(m->pool, (size_t)c->n_heads, mla_query, &j);
    int64_t n = pos + 1; /* DSA: chunk token t's selected positions */
    const void *C = c->dsa.on ? mpm_dsa_rows(m, ly->kv_slot, t, &n) : mpm_kv_row(m, m->kc, ly->kv_slot, 0);
    mpm_attn_span a = {C, C, n, c->n_heads, R, rope, R, 0, m->qlat, R + rope, m->olat, R,
                       m->attn_scale};
    mpm_attend(m, &a);
    mpk_pool_run(m->pool, (size_t)c->n_heads, mla_value, &j);
}

static void mla(mpm_model *m, int l, int pos, int T, const float *xn, float *out) {
    const mpm_config *c = &m->c;
    mpm_layer *ly = &m->layers[l];
    const int64_t R = c->kv_lora_rank, rope = c->qk_rope_dim, qk = c->qk_nope_dim + rope;
    const int64_t qd = c->n_heads * qk, od = c->n_heads * c->v_head_dim, lat = R + rope;
    if (c->q_lora_rank) {
        mpm_matmat(m, &ly->q_a, xn, T, m->lat);
        for (int t = 0; t < T; t++) rms_inplace(m->lat + t * c->q_lora_rank, ly->q_a_norm, c->q_lora_rank, c->latent_eps);
        mpm_matmat(m, &ly->q_b, m->lat, T, m->q);
    } else {
        mpm_matmat(m, &ly->q, xn, T, m->q);
    }
    mpm_matmat(m, &ly->kv_a, xn, T, m->kbuf);
    for (int t = 0; t < T; t++) {
        const int rot = !c->mla_no_rope; /* Kimi-Linear: the rope dims stay as projected */
        if (rot) rope_tables(m, pos + t);
        for (int64_t h = 0; rot && h < c->n_heads; h++)
            rope_apply(m, m->q + t * qd + h * qk + c->qk_nope_dim, c->rope_interleave);
        float *ct = m->kbuf + t * lat;
        rms_inplace(ct, ly->kv_a_norm, R, c->latent_eps);
        if (rot) rope_apply(m, ct + R, c->rope_interleave);
        mpm_kv_put(m, mpm_kv_row(m, m->kc, ly->kv_slot, pos + t), ct, lat);
    }
    if (c->dsa.on) mpm_dsa_select(m, l, pos, T, xn, m->lat); /* m->lat: the q LoRA latent */
    for (int t = 0; t < T; t++) mla_token(m, ly, pos + t, t, m->q + t * qd, m->att + t * od);
    if (c->mla_gate) mpm_mla_gate(m, ly, T, xn, m->att); /* Kimi K3: sigmoid gate per head dim */
    mpm_matmat(m, &ly->o, m->att, T, out);
}

void mpm_attention(mpm_model *m, int layer, int pos, int T, const float *xn, float *out) {
    if (m->layers[layer].linear) mpm_linear_attention(m, layer, pos, T, xn, out);
    else if (m->c.mla) mla(m, layer, pos, T, xn, out);
    else gqa(m, layer, pos, T, xn, out);
}
