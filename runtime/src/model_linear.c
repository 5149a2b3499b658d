/* Gated DeltaNet linear attention (Qwen3-Next; FORMAT.md §7 `linear_attention`; KDA layers are
 * model_kda.c's, reached through the same entry points) and the other
 * pieces of that family: (1 + w) RMSNorm weights, the sigmoid output gate of its full-attention
 * layers, the sigmoid gate of its shared expert.
 *
 * Per linear layer the state is fixed-size: the last K-1 inputs of the depthwise causal conv
 * ([conv_dim][K-1]) and the recurrent matrix S ([value heads][dk][dv]).  For each token:
 *   [q k v] = silu(causal_conv(Wqkv x)), z = Wz x, b = Wb x, a = Wa x
 *   q, k L2-normalised per head (eps 1e-6), q /= sqrt(dk); value head h reads q/k head h / (nv/nk)
 *   g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)
 *   S *= exp(g);  S += k (x) ((v - S^T k) * beta);  o = S^T q
 *   out = Wout (rmsnorm(o) * norm_w * silu(z))   (per value head)
 * A call's tokens go through the conv one by one and through the recurrence in aligned sub-chunks
 * (linear_recur.c: the chunk form where a sub-chunk lies inside the call, else the token form),
 * one task per key head for the conv, one per value head for the rest.  The state is zeroed when
 * a sequence starts (pos 0).  It cannot be truncated back like a KV cache (engine.c refuses), but
 * a call never changes it in place: the first token of a call reads the committed state (lstate)
 * and writes the working copy (lwork), which mpm_state_commit makes the committed one once the
 * whole call succeeded, so a failed call leaves it as it was; snapshots copy lstate. */
#include "io.h"
#include "linear_ops.h"
#include "model_internal.h"
#include "moepack.h"
#include "seterr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t conv_dim(const mpm_config *c) { return 2 * c->la_nk * c->la_dk + c->la_nv * c->la_dv; }
/* canonical projection vector per token: [q kd | k kd | v vd | z vd | b nv | a nv] */
static int64_t proj_dim(const mpm_config *c) { return conv_dim(c) + c->la_nv * c->la_dv + 2 * c->la_nv; }
static int64_t state_floats(const mpm_config *c) {
    return conv_dim(c) * (c->la_conv - 1) + c->la_nv * c->la_dk * c->la_dv;
}

/* the config's count (model_config.c), which stays when mpm_linear_init drops the per-layer flags */
static int n_linear(const mpm_config *c) { return (int)c->n_linear; }

uint64_t mpm_state_bytes(const mpm_config *c) {
    return 4u * (uint64_t)state_floats(c) * (uint64_t)n_linear(c);
}

/* floats of model_linear.c's buffers beside the chunk's (lbuf): q + gate of a gated query */
static uint64_t buf_floats(const mpm_config *c) { return 2u * (uint64_t)(c->n_heads * c->head_dim); }

/* floats of the delta rule's workspaces, one per value head (lws) */
static uint64_t ws_floats(const mpm_config *c) {
    return n_linear(c) ? (uint64_t)c->la_nv * mpl_ws_floats(c->la_dk, c->la_dv, c->la_chunk) : 0;
}

/* the buffers, the workspaces and the working copy of the state (lwork) */
uint64_t mpm_linear_scratch_bytes(const mpm_config *c) {
    if (!n_linear(c) && !c->attn_gate) return 0;
    return 4u * (buf_floats(c) + ws_floats(c)) + mpm_state_bytes(c);
}

uint64_t mpm_linear_chunk_bytes(const mpm_config *c, int chunk) {
    if (!n_linear(c)) return 0;
    /* Gated DeltaNet: the input projections' outputs and the recurrence output */
    uint64_t per = c->la_kind == MPM_LA_KDA ? mpm_kda_chunk_floats(c)
                                            : (uint64_t)(proj_dim(c) + c->la_nv * c->la_dv);
    return 4u * (uint64_t)chunk * per;
}

int mpm_linear_load(mpm_model *m, void *L, int l) {
    const mpm_config *c = &m->c;
    mpm_layer *ly = &m->layers[l];
    const int64_t H = c->hidden, vd = c->la_nv * c->la_dv, nv = c->la_nv;
    const int64_t cd = conv_dim(c);
    char n[160];
    int rc;
    if (c->la_kind == MPM_LA_KDA) return mpm_kda_load(m, L, l);
#define LOAD_MAT(suffix, rows, dst)                                                            \
    do {                                                                                       \
        snprintf(n, sizeof n, "layers.%d.linear.%s", l, suffix);                               \
        if ((rc = mpm_load_mat(L, n, rows, H, dst))) return rc;                            \
    } while (0)
#define LOAD_F32(suffix, numel, dst)                                                           \
    do {                                                                                       \
        snprintf(n, sizeof n, "layers.%d.linear.%s", l, suffix);                               \
        if ((rc = mpm_load_f32(L, n, (uint64_t)(numel), dst))) return rc;                     \
    } while (0)
    if (c->la_grouped) {
        ly->la_nin = 2;
        LOAD_MAT("qkvz", cd + vd, &ly->la_in[0]);
        LOAD_MAT("ba", 2 * nv, &ly->la_in[1]);
    } else {
        ly->la_nin = 4;
        LOAD_MAT("qkv", cd, &ly->la_in[0]);
        LOAD_MAT("z", vd, &ly->la_in[1]);
        LOAD_MAT("b", nv, &ly->la_in[2]);
        LOAD_MAT("a", nv, &ly->la_in[3]);
    }
    LOAD_F32("conv", cd * c->la_conv, &ly->la_conv);
    LOAD_F32("dt_bias", nv, &ly->la_dt);
    LOAD_F32("A_log", nv, &ly->la_A);
    LOAD_F32("norm", c->la_dv, &ly->la_norm);
    snprintf(n, sizeof n, "layers.%d.linear.out", l);
    if ((rc = mpm_load_mat(L, n, H, vd, &ly->la_out))) return rc;
    return 0;
#undef LOAD_MAT
#undef LOAD_F32
}

/* perm[j]: where canonical element j sits in the concatenated raw projection outputs */
static void build_perm(const mpm_config *c, int32_t *perm) {
    const int64_t nk = c->la_nk, dk = c->la_dk, dv = c->la_dv, r = c->la_nv / c->la_nk;
    const int64_t kd = nk * dk, vd = c->la_nv * dv, P = proj_dim(c);
    if (!c->la_grouped) { /* qkv, z, b, a: already in canonical order */
        for (int64_t j = 0; j < P; j++) perm[j] = (int32_t)j;
        return;
    }
    /* in_proj_qkvz per key head g: [q dk | k dk | v r*dv | z r*dv]; in_proj_ba per g: [b r | a r] */
    const int64_t blk = 2 * dk + 2 * r * dv, ba0 = nk * blk;
    for (int64_t g = 0; g < nk; g++) {
        for (int64_t i = 0; i < dk; i++) {
            perm[g * dk + i] = (int32_t)(g * blk + i);
            perm[kd + g * dk + i] = (int32_t)(g * blk + dk + i);
        }
        for (int64_t i = 0; i < r * dv; i++) {
            perm[2 * kd + g * r * dv + i] = (int32_t)(g * blk + 2 * dk + i);
            perm[2 * kd + vd + g * r * dv + i] = (int32_t)(g * blk + 2 * dk + r * dv + i);
        }
        for (int64_t i = 0; i < r; i++) {
            perm[2 * kd + 2 * vd + g * r + i] = (int32_t)(ba0 + g * 2 * r + i);
            perm[2 * kd + 2 * vd + c->la_nv + g * r + i] = (int32_t)(ba0 + g * 2 * r + r + i);
        }
    }
}

int mpm_linear_init(mpm_model *m) {
    const mpm_config *c = &m->c;
    const float one = 1.0f;
    if (c->norm_offset) { /* (1 + w) RMSNorms: fold the 1 in once (the gated norm keeps w) */
        for (int64_t l = 0; l < c->n_layers; l++) {
            mpm_layer *ly = &m->layers[l];
            for (int64_t i = 0; i < c->hidden; i++) ly->attn_norm[i] += one, ly->ffn_norm[i] += one;
            int64_t nq = c->qk_norm_full ? c->n_heads * c->head_dim : c->head_dim;
            int64_t nk = c->qk_norm_full ? c->n_kv_heads * c->head_dim : c->head_dim;
            for (int64_t i = 0; ly->q_norm && i < nq; i++) ly->q_norm[i] += one;
            for (int64_t i = 0; ly->k_norm && i < nk; i++) ly->k_norm[i] += one;
        }
        for (int64_t i = 0; i < c->hidden; i++) m->final_norm[i] += one;
    }
    int nl = n_linear(c), slot = 0;
    const uint64_t wsf = ws_floats(c);
    for (int64_t l = 0; l < c->n_layers; l++) /* the KV cache holds full-attention layers only */
        m->layers[l].kv_slot = m->layers[l].linear ? -1 : slot++;
    /* the caller's array may go before the model; the layers carry the flag from here on */
    m->c.layer_is_linear = NULL;
    if (!nl) return 0;
    const int64_t sf = state_floats(c);
    m->lstate = calloc((size_t)(sf * nl), 4);
    m->lwork = calloc((size_t)(sf * nl), 4);
    m->lws = malloc((size_t)wsf * 4);
    if (!m->lstate || !m->lwork || !m->lws) return MP_ENOMEM;
    if (c->la_kind != MPM_LA_KDA) { /* KDA's projections are already split */
        if (!(m->lperm = calloc((size_t)proj_dim(c), sizeof *m->lperm))) return MP_ENOMEM;
        build_perm(c, m->lperm);
    }
    int k = 0;
    for (int64_t l = 0; l < c->n_layers; l++)
        if (m->layers[l].linear) m->layers[l].la_slot = k++;
    return 0;
}

void mpm_linear_state(mpm_model *m, mpm_layer *ly, int pos, const float **src, float **dst) {
    const size_t sf = (size_t)state_floats(&m->c);
    float *work = m->lwork + (size_t)ly->la_slot * sf;
    *dst = work;
    *src = work;
    if (!ly->la_fresh) return;
    ly->la_fresh = 0;
    m->l_touched = 1;
    if (pos == 0) memset(work, 0, sf * sizeof(float)); /* a new sequence starts from zero */
    else *src = m->lstate + (size_t)ly->la_slot * sf;
}

void mpm_state_begin(mpm_model *m) {
    for (int64_t l = 0; l < m->c.n_layers; l++) m->layers[l].la_fresh = m->layers[l].linear;
    m->l_touched = 0;
}

void mpm_state_commit(mpm_model *m) {
    if (!m->l_touched) return; /* no token passed: lwork holds nothing of this call */
    float *t = m->lstate;
    m->lstate = m->lwork;
    m->lwork = t;
    m->l_touched = 0;
}

uint64_t mpm_state_size(const mpm_model *m) {
    return 4u * (uint64_t)state_floats(&m->c) * (uint64_t)m->c.n_linear;
}

void mpm_state_save(const mpm_model *m, void *dst) {
    if (m->lstate) memcpy(dst, m->lstate, (size_t)mpm_state_size(m));
}

void mpm_state_load(mpm_model *m, const void *src) {
    if (m->lstate) memcpy(m->lstate, src, (size_t)mpm_state_size(m));
}

void mpm_linear_free(mpm_model *m) {
    for (int64_t l = 0; m->layers && l < m->c.n_layers; l++) {
        mpm_layer *ly = &m->layers[l];
        free(ly->la_conv);
        free(ly->la_dt);
        free(ly->la_A);
        free(ly->la_norm);
        free(ly->shared_gate);
    }
    free(m->lstate);
    free(m->lwork);
    free(m->lws);
    free(m->lperm);
}

/* the chunk buffers first, the gated query's two rows last */
int mpm_linear_chunk_alloc(mpm_model *m) {
    const mpm_config *c = &m->c;
    if (!n_linear(c) && !c->attn_gate) return 0;
    uint64_t scratch = buf_floats(c) + mpm_linear_chunk_bytes(c, m->chunk) / 4u;
    if (!(m->lbuf = mp_aligned_calloc(scratch, 4))) return MP_ENOMEM;
    m->lqg = m->lbuf + scratch - buf_floats(c);
    return 0;
}

void mpm_linear_chunk_free(mpm_model *m) {
    mp_aligned_free(m->lbuf);
    m->lbuf = m->lqg = NULL;
}

typedef struct {
    mpm_model *m;
    const mpm_layer *ly;
    float *blk; /* the chunk's projections, matrix after matrix ([T][rows] each) */
    float *o;   /* [T][nv][dv] */
    int pos, T;
    const float *src; /* the state the call's first token reads; dst the one written (may be src) */
    float *dst;
} lin_job;

/* Token 0's canonical projection element p (lperm: where it sits in the matrices' rows) in the
 * chunk's projections; *ts = the distance between tokens.  A head's elements are consecutive. */
static float *lin_at(const lin_job *j, int64_t p, int64_t *ts) {
    int64_t r = j->m->lperm[p], off = 0;
    int i = 0;
    while (r >= off + j->ly->la_in[i].rows) off += j->ly->la_in[i++].rows;
    *ts = j->ly->la_in[i].rows;
    return j->blk + (int64_t)j->T * off + (r - off);
}

/* key head g: the causal conv (then silu) of its q and k channels and of the v channels of its
 * value heads, then q and k L2-normalised, token by token */
static void lin_conv(void *ctx, size_t g) {
    const lin_job *j = ctx;
    const mpm_config *c = &j->m->c;
    const int64_t dk = c->la_dk, kd = c->la_nk * dk, r = c->la_nv / c->la_nk, K = c->la_conv;
    const int64_t ch[3] = {(int64_t)g * dk, kd + (int64_t)g * dk, 2 * kd + (int64_t)g * r * c->la_dv};
    const int64_t n[3] = {dk, dk, r * c->la_dv};
    for (int p = 0; p < 3; p++) {
        int64_t ts;
        float *x = lin_at(j, ch[p], &ts);
        const float *w = j->ly->la_conv + ch[p] * K, *src = j->src + ch[p] * (K - 1);
        float *dst = j->dst + ch[p] * (K - 1);
        for (int t = 0; t < j->T; t++) {
            mpl_conv_step(x + t * ts, n[p], w, t ? dst : src, dst, K);
            if (p < 2) mpl_l2norm(x + t * ts, dk, p ? 1.0f : 1.0f / sqrtf((float)dk));
        }
    }
}

/* value head h: decay and beta, the delta rule, the gated RMSNorm of the output */
static void lin_head(void *ctx, size_t h) {
    const lin_job *j = ctx;
    const mpm_config *c = &j->m->c;
    const int64_t dk = c->la_dk, dv = c->la_dv, kd = c->la_nk * dk, vd = c->la_nv * dv, nv = c->la_nv;
    const int64_t kh = (int64_t)h / (nv / c->la_nk), rec = conv_dim(c) * (c->la_conv - 1);
    mpl_seq s = {.o = j->o + (int64_t)h * dv, .os = vd, .dk = dk, .dv = dv};
    int64_t zs, as, bs;
    s.q = lin_at(j, kh * dk, &s.qs);
    s.k = lin_at(j, kd + kh * dk, &s.ks);
    s.v = lin_at(j, 2 * kd + (int64_t)h * dv, &s.vs);
    const float *z = lin_at(j, 2 * kd + vd + (int64_t)h * dv, &zs);
    float *b = lin_at(j, 2 * kd + 2 * vd + (int64_t)h, &bs), *a = lin_at(j, 2 * kd + 2 * vd + nv + (int64_t)h, &as);
    const float eA = expf(j->ly->la_A[h]);
    for (int t = 0; t < j->T; t++) { /* in place: a -> exp(g), b -> beta */
        const float g = -eA * mpl_softplus(a[t * as] + j->ly->la_dt[h]);
        a[t * as] = expf(g);
        b[t * bs] = mpl_sigmoid(b[t * bs]);
    }
    s.decay = a, s.ds = as, s.beta = b, s.bs = bs;
    mpm_linear_head_out(j->m, j->ly, &s, h, j->pos, j->T, j->src, j->dst, rec, z, zs, 0);
}

void mpm_linear_head_out(mpm_model *m, const mpm_layer *ly, const mpl_seq *s, size_t h, int pos, int T,
                         const float *src, float *dst, int64_t rec, const float *z, int64_t zs,
                         int sigmoid_gate) {
    const mpm_config *c = &m->c;
    const size_t hs = (size_t)h * (size_t)(s->dk * s->dv);
    float *ws = m->lws + h * mpl_ws_floats(s->dk, s->dv, c->la_chunk);
    mpl_recur(s, pos, T, c->la_chunk, src + rec + hs, dst + rec + hs, ws, m->la_simd);
    for (int t = 0; t < T; t++)
        mpl_gated_rmsnorm(s->o + t * s->os, ly->la_norm, z + t * zs, s->dv, c->eps, sigmoid_gate);
}

void mpm_linear_attention(mpm_model *m, int l, int pos, int T, const float *xn, float *out) {
    const mpm_config *c = &m->c;
    mpm_layer *ly = &m->layers[l];
    if (c->la_kind == MPM_LA_KDA) {
        mpm_kda_attention(m, l, pos, T, xn, out);
        return;
    }
    /* the input projections of all T tokens at once (matrix i's outputs: T x rows_i after T x
     * the rows before it), used in place from there on */
    lin_job j = {m, ly, m->lbuf, m->lbuf + (int64_t)m->chunk * proj_dim(c), pos, T, NULL, NULL};
    for (int i = 0, off = 0; i < ly->la_nin; off += (int)ly->la_in[i].rows, i++)
        mpm_matmat(m, &ly->la_in[i], xn, T, j.blk + (int64_t)T * off);
    mpm_linear_state(m, ly, pos, &j.src, &j.dst); /* [conv inputs | recurrent matrices] */
    mpk_pool_run(m->pool, (size_t)c->la_nk, lin_conv, &j);
    mpk_pool_run(m->pool, (size_t)c->la_nv, lin_head, &j);
    mpm_matmat(m, &ly->la_out, j.o, T, out);
}

/* Gated full attention (Qwen3-Next): q_proj rows hold, per head, hd query rows then hd gate rows.
 * Query of token t into q (heads x hd); with gate != NULL the gate instead. */
void mpm_gated_query(mpm_model *m, const mpm_layer *ly, const float *x, float *q, float *gate) {
    const mpm_config *c = &m->c;
    const int64_t hd = c->head_dim;
    float *qg = m->lqg;
    mpk_matmat(m->kern, m->pool, &ly->q, x, 1, qg);
    for (int64_t h = 0; h < c->n_heads; h++)
        memcpy(gate ? gate + h * hd : q + h * hd, qg + 2 * h * hd + (gate ? hd : 0), (size_t)hd * sizeof(float));
}

/* out[i] *= sigmoid(gate[i]) for one token's attention output */
void mpm_apply_gate(float *out, const float *gate, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] *= mpl_sigmoid(gate[i]);
}

/* Shared expert scaled by sigmoid(shared_gate . x) (Qwen3-Next), T tokens. */
void mpm_shared_gate(mpm_model *m, const mpm_layer *ly, int T, const float *xn, float *out) {
    const int64_t H = m->c.hidden;
    for (int t = 0; t < T; t++) {
        float s = mpl_sigmoid(mpk_dot(ly->shared_gate, xn + (int64_t)t * H, H));
        for (int64_t i = 0; i < H; i++) out[(int64_t)t * H + i] *= s;
    }
}
