/* Model loading (trunk into RAM, KV cache allocation) and the per-token layer loop. */
#define _POSIX_C_SOURCE 200809L
#include "io.h"
#include "model_internal.h"
#include "moepack.h"
#include "seterr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double mpm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Checked a*b for sizes (all our operands are < 2^40, so overflow means corrupt input). */
static int mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    if (a && b > UINT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

static void *xcalloc(uint64_t n, uint64_t size) {
    uint64_t total;
    if (!mul_ok(n, size, &total) || total > (uint64_t)SIZE_MAX) return NULL;
    return calloc(total ? (size_t)total : 1, 1);
}

typedef struct {
    mpm_tensor_fn fn;
    void *user;
    char *err;
    size_t errlen;
} loader;

/* Looks up a tensor: 0 found, 1 absent and not required, else an error code (message set). */
static int find_src(loader *L, const char *name, int required, mpm_src *s) {
    int rc = L->fn(L->user, name, s);
    if (rc < 0) return mp_seterr(L->err, L->errlen, rc, "tensor %s: cannot read", name);
    if (rc == 1 && required) return mp_seterr(L->err, L->errlen, MP_EFORMAT, "tensor %s missing", name);
    return rc;
}

/* Views s as a rows x cols matrix in its codec; the stored length must match the codec's size. */
static int view_mat(loader *L, const char *name, const mpm_src *s, int64_t rows, int64_t cols,
                    mpk_mat *out) {
    const mp_codec_info *ci = s->codec;
    if (mpk_mat_init(out, ci->kind, rows, cols, ci->group_size, ci->zero_point, s->data))
        return mp_seterr(L->err, L->errlen, MP_EUNSUPPORTED, "tensor %s: unsupported codec", name);
    if (mpk_mat_nbytes(out) != s->length)
        return mp_seterr(L->err, L->errlen, MP_EFORMAT, "tensor %s: length %llu != codec size %llu",
                         name, (unsigned long long)s->length, (unsigned long long)mpk_mat_nbytes(out));
    return 0;
}

/* A 2-D matrix kept in its encoding.  required = 0: absent is fine (returns 1). */
static int load_mat(loader *L, const char *name, int64_t rows, int64_t cols, mpk_mat *out,
                    int required) {
    mpm_src s;
    int rc = find_src(L, name, required, &s);
    if (rc) return rc;
    if (s.ndim != 2 || s.shape[0] != rows || s.shape[1] != cols)
        return mp_seterr(L->err, L->errlen, MP_EFORMAT, "tensor %s: shape must be [%lld, %lld]", name,
                         (long long)rows, (long long)cols);
    return view_mat(L, name, &s, rows, cols, out);
}

/* Any tensor decoded to f32 (norms, biases, codebooks, rotation signs). */
static int load_f32(loader *L, const char *name, uint64_t numel, float **out, int required) {
    mpm_src s;
    *out = NULL;
    int rc = find_src(L, name, required, &s);
    if (rc) return rc;
    uint64_t n = 1;
    for (int i = 0; i < s.ndim; i++)
        if (!mul_ok(n, (uint64_t)s.shape[i], &n)) n = 0;
    if (n != numel) return mp_seterr(L->err, L->errlen, MP_EFORMAT, "tensor %s: expected %llu elements", name, (unsigned long long)numel);
    mpk_mat m;
    int64_t rows = s.ndim == 1 ? 1 : s.shape[0], cols = (int64_t)(numel / (uint64_t)rows);
    if ((rc = view_mat(L, name, &s, rows, cols, &m))) return rc;
    float *f = xcalloc(numel, sizeof(float));
    if (!f) return mp_seterr(L->err, L->errlen, MP_ENOMEM, "out of memory");
    for (int64_t r = 0; r < rows; r++) mpk_row(&m, r, f + r * cols);
    *out = f;
    return 0;
}

int mpm_load_mat(void *L, const char *name, int64_t rows, int64_t cols, mpk_mat *out) {
    return load_mat(L, name, rows, cols, out, 1);
}
int mpm_load_f32(void *L, const char *name, uint64_t numel, float **out) {
    return load_f32(L, name, numel, out, 1);
}

static const char *const PARTS[3] = {"gate", "up", "down"};

/* gate/up/down of a dense or shared FFN: prefix is "ffn" or "shared". */
static int load_ffn(loader *L, int l, const char *prefix, int64_t inter, int64_t H, mpm_ffn *f) {
    mpk_mat *dst[3] = {&f->gate, &f->up, &f->down};
    char n[160];
    f->inter = inter;
    for (int p = 0; p < 3; p++) {
        snprintf(n, sizeof n, "layers.%d.%s.%s", l, prefix, PARTS[p]);
        int rc = load_mat(L, n, p == 2 ? H : inter, p == 2 ? inter : H, dst[p], 1);
        if (rc) return rc;
    }
    return 0;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Widths of the attention's chunk buffers: queries, keys and values (MLA: the latent + rope
 * part), outputs */
static void attn_widths(const mpm_config *c, int64_t *qdim, int64_t *kvdim, int64_t *odim) {
    *qdim = c->mla ? c->n_heads * (c->qk_nope_dim + c->qk_rope_dim) : c->n_heads * c->head_dim;
    *kvdim = max64(c->mla ? c->kv_lora_rank + c->qk_rope_dim : c->n_kv_heads * c->head_dim, 1);
    *odim = c->mla ? c->n_heads * c->v_head_dim : c->n_heads * c->head_dim;
}

uint64_t mpm_scratch_bytes(const mpm_config *c, int chunk_tokens) {
    int64_t H = c->hidden, I = max64(c->moe_inter, max64(c->dense_inter, c->shared_inter));
    int64_t qdim, kvdim, odim;
    attn_widths(c, &qdim, &kvdim, &odim);
    const uint64_t T = (uint64_t)chunk_tokens;
    /* the widest input a trunk product multiplies with a chunk (mpm_matmat's inputs) */
    const int64_t wide = max64(max64(max64(H, I), max64(odim, c->q_lora_rank)),
                               max64(c->la_nv * c->la_dv, c->latent));
    /* per chunk token, as alloc_scratch allocates them: residual, normalised input, block output,
     * routed-expert sum; q, k, v, attention output, MLA's latents; FFN gate and up; routing
     * (router logits, choices, weights).
     * Then the compute pool's buffer for the products' copies of their inputs (mpk_pool_inputs;
     * one at a time, kept for the largest): f32 padded to whole vectors of 8, transposed for
     * mpk_matmat in blocks of 8 tokens (up to 7 tokens more, in `fixed`), or rounded to 16-bit
     * integers, 2 bytes a column padded to the group and 8 a group of at least 16, each part
     * 64-byte aligned: at most the widest + 192 floats a token. */
    uint64_t per_tok = 4u * (uint64_t)H + (uint64_t)(qdim + 2 * kvdim + odim) +
                       (c->mla ? (uint64_t)max64(c->q_lora_rank, kvdim) : 0u) + 2u * (uint64_t)I +
                       3u * (uint64_t)c->top_k + (uint64_t)c->n_experts + (uint64_t)wide + 192u;
    /* f32 copies made at load: codebooks as stored and transposed (<= 8 stages), rotation signs, norms, bias,
     * q/k/v biases and full-width q/k norms (GQA variants) */
    uint64_t per_layer = 2u * 3u * 8u * 256u * 8u + (uint64_t)(4 * H + c->moe_inter + 2 * c->head_dim +
                                                          c->q_lora_rank + c->kv_lora_rank + c->n_experts) +
                         (c->mla ? 0u : (uint64_t)((2 * c->n_heads + 3 * c->n_kv_heads) * c->head_dim));
    /* one token's vectors (the widest three, MLA's per-head latent query and output) and the
     * logits; the layer table; mp_sample's candidates (id, probability) and the C library sort's
     * merge buffer, when a token is sampled with a temperature; the inputs buffer's last block
     * of 8 tokens, its header and page */
    uint64_t fixed = 16u * (uint64_t)max64(H, I) + 3u * (uint64_t)odim + 8u * (uint64_t)wide + 1024u +
                     (c->mla ? (uint64_t)(c->n_heads * (2 * c->kv_lora_rank + c->qk_rope_dim)) : 0u) +
                     (uint64_t)c->vocab + (uint64_t)c->n_experts + (uint64_t)H;
    uint64_t tables = (uint64_t)c->n_layers * sizeof(mpm_layer) + 16u * (uint64_t)c->vocab;
    return tables + mpm_dsa_scratch_bytes(c, chunk_tokens) +
           mpm_k3_scratch_bytes(c, chunk_tokens) + mpm_hc_scratch_bytes(c, chunk_tokens) +
           4u * (T * per_tok + fixed + per_layer * (uint64_t)c->n_layers);
}

/* The buffers whose size is the chunk's: T tokens' activations, routing and the modules' own */
static void free_chunk_bufs(mpm_model *m) {
    void *bufs[] = {m->q, m->kbuf, m->vbuf, m->att, m->lat, m->router_logits, m->g, m->u, m->bx,
                    m->bxn, m->bout, m->bsum, m->bsel, m->bselw, m->uniq};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) mp_aligned_free(bufs[i]);
    m->q = m->kbuf = m->vbuf = m->att = m->lat = m->router_logits = m->g = m->u = NULL;
    m->bx = m->bxn = m->bout = m->bsum = m->bselw = NULL;
    m->bsel = NULL;
    m->uniq = NULL;
    mpm_moe_chunk_free(m);
    mpm_k3_chunk_free(m);
    mpm_hc_chunk_free(m);
    mpm_dsa_chunk_free(m);
    mpm_linear_chunk_free(m);
}

static int alloc_chunk_bufs(mpm_model *m) {
    const mpm_config *c = &m->c;
    int64_t H = c->hidden, I = max64(c->moe_inter, max64(c->dense_inter, c->shared_inter));
    int64_t qdim, kvdim, odim;
    attn_widths(c, &qdim, &kvdim, &odim);
    const uint64_t T = (uint64_t)m->chunk;
    m->q = mp_aligned_calloc(T * (uint64_t)qdim, 4);
    m->kbuf = mp_aligned_calloc(T * (uint64_t)kvdim, 4);
    m->vbuf = mp_aligned_calloc(T * (uint64_t)kvdim, 4);
    m->att = mp_aligned_calloc(T * (uint64_t)odim, 4);
    if (c->mla) m->lat = mp_aligned_calloc(T * (uint64_t)max64(c->q_lora_rank, kvdim), 4);
    m->router_logits = mp_aligned_calloc(T * (uint64_t)c->n_experts, 4);
    m->g = mp_aligned_calloc(T * (uint64_t)I, 4);
    m->u = mp_aligned_calloc(T * (uint64_t)I, 4);
    m->bx = mp_aligned_calloc(T * (uint64_t)H, 4);
    m->bxn = mp_aligned_calloc(T * (uint64_t)H, 4);
    m->bout = mp_aligned_calloc(T * (uint64_t)H, 4);
    m->bsum = mp_aligned_calloc(T * (uint64_t)H, 4);
    m->bsel = mp_aligned_calloc(T * (uint64_t)c->top_k, 4);
    m->bselw = mp_aligned_calloc(T * (uint64_t)c->top_k, 4);
    m->uniq = mp_aligned_calloc(T * (uint64_t)c->top_k, 4);
    if (!m->q || !m->kbuf || !m->vbuf || !m->att || !m->router_logits || !m->g || !m->u || !m->bx ||
        !m->bxn || !m->bout || !m->bsum || !m->bsel || !m->bselw || !m->uniq || (c->mla && !m->lat))
        return -1;
    if (mpm_config_moe_layers(c) && mpm_moe_chunk_alloc(m)) return -1;
    if (mpm_k3_chunk_alloc(m) || mpm_hc_chunk_alloc(m) || mpm_linear_chunk_alloc(m)) return -1;
    if (c->dsa.on && mpm_dsa_chunk_alloc(m)) return -1;
    return 0;
}

int mpm_set_chunk(mpm_model *m, int chunk) {
    if (chunk < 1 || chunk > m->ctx) {
        snprintf(m->err, sizeof m->err, "chunk of %d tokens (1..%d)", chunk, m->ctx);
        return MP_EINVAL;
    }
    if (chunk == m->chunk && m->q) return MP_OK;
    /* freed first, so that the old and the new buffers are never held at once (the plan counts
     * one of them); when the new size fails, the old one is allocated again */
    const int old = m->chunk;
    free_chunk_bufs(m);
    m->chunk = chunk;
    if (!alloc_chunk_bufs(m)) return MP_OK;
    free_chunk_bufs(m);
    m->chunk = old;
    if (!alloc_chunk_bufs(m)) {
        snprintf(m->err, sizeof m->err, "out of memory for prompt chunks of %d tokens", chunk);
        return MP_ENOMEM;
    }
    free_chunk_bufs(m);
    m->chunk = 0; /* no buffers: every pass is refused */
    snprintf(m->err, sizeof m->err, "out of memory for prompt chunks of %d tokens, and again for %d", chunk, old);
    return MP_ENOMEM;
}

static int alloc_scratch(mpm_model *m) {
    const mpm_config *c = &m->c;
    int64_t H = c->hidden, I = max64(c->moe_inter, max64(c->dense_inter, c->shared_inter));
    int64_t qdim, kvdim, odim;
    attn_widths(c, &qdim, &kvdim, &odim);
    int64_t big = max64(H, max64(I, odim));
    m->xn = xcalloc((uint64_t)H, 4);
    m->scores = xcalloc((uint64_t)c->n_heads * (uint64_t)m->ctx, 4);
    m->cosb = xcalloc((uint64_t)m->rope_dim, 4);
    m->sinb = xcalloc((uint64_t)m->rope_dim, 4);
    if (c->mla) {
        m->qlat = xcalloc((uint64_t)(c->n_heads * (c->kv_lora_rank + c->qk_rope_dim)), 4);
        m->olat = xcalloc((uint64_t)(c->n_heads * c->kv_lora_rank), 4);
    }
    m->eo = xcalloc((uint64_t)big, 4);
    m->xr = xcalloc((uint64_t)big, 4);
    m->ar = xcalloc((uint64_t)big, 4);
    m->sel = xcalloc((uint64_t)c->top_k, 4);
    m->selw = xcalloc((uint64_t)c->top_k, 4);
    m->ahead = xcalloc((uint64_t)c->top_k, 4);
    m->recs = xcalloc((uint64_t)c->top_k, sizeof *m->recs);
    m->aheadw = xcalloc((uint64_t)c->top_k, 4);
    m->choice = xcalloc((uint64_t)c->n_experts, 4);
    m->allowed = xcalloc((uint64_t)c->n_experts, 1);
    if (mpm_config_moe_layers(c) && mpm_moe_alloc(m)) return -1;
    if (mpm_hc_alloc(m)) return -1;
    if (!m->xn || !m->scores || !m->cosb || !m->sinb || !m->eo || !m->xr || !m->ar || !m->sel ||
        !m->selw || !m->ahead || !m->recs || !m->aheadw || !m->choice || !m->allowed ||
        (c->mla && (!m->qlat || !m->olat)))
        return -1;
    return 0;
}

static int load_layer(mpm_model *m, loader *L, mpm_bank_fn bank, void *user, int l) {
    const mpm_config *c = &m->c;
    mpm_layer *ly = &m->layers[l];
    const int64_t H = c->hidden;
    char n[160];
    int rc;
#define NAME(...) snprintf(n, sizeof n, __VA_ARGS__)
#define TRY(x) if ((rc = (x)) < 0) return rc
    NAME("layers.%d.attn_norm", l);
    TRY(load_f32(L, n, (uint64_t)H, &ly->attn_norm, 1));
    NAME("layers.%d.ffn_norm", l);
    TRY(load_f32(L, n, (uint64_t)H, &ly->ffn_norm, 1));
    ly->linear = c->layer_is_linear && c->layer_is_linear[l];
    if (ly->linear) {
        TRY(mpm_linear_load(m, L, l));
    } else if (!c->mla) {
        int64_t qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
        /* attn_gate: each head's query rows followed by its output-gate rows */
        NAME("layers.%d.attn.q", l); TRY(load_mat(L, n, c->attn_gate ? 2 * qd : qd, H, &ly->q, 1));
        NAME("layers.%d.attn.k", l); TRY(load_mat(L, n, kd, H, &ly->k, 1));
        NAME("layers.%d.attn.v", l); TRY(load_mat(L, n, kd, H, &ly->v, 1));
        NAME("layers.%d.attn.o", l); TRY(load_mat(L, n, H, qd, &ly->o, 1));
        if (c->qkv_bias) {
            NAME("layers.%d.attn.q_bias", l); TRY(load_f32(L, n, (uint64_t)qd, &ly->q_bias, 1));
            NAME("layers.%d.attn.k_bias", l); TRY(load_f32(L, n, (uint64_t)kd, &ly->k_bias, 1));
            NAME("layers.%d.attn.v_bias", l); TRY(load_f32(L, n, (uint64_t)kd, &ly->v_bias, 1));
        }
        if (c->qk_norm) {
            uint64_t nq = (uint64_t)(c->qk_norm_full ? qd : c->head_dim), nk = (uint64_t)(c->qk_norm_full ? kd : c->head_dim);
            NAME("layers.%d.attn.q_norm", l); TRY(load_f32(L, n, nq, &ly->q_norm, 1));
            NAME("layers.%d.attn.k_norm", l); TRY(load_f32(L, n, nk, &ly->k_norm, 1));
        }
    } else {
        int64_t qk = c->qk_nope_dim + c->qk_rope_dim;
        if (c->q_lora_rank) {
            NAME("layers.%d.attn.q_a", l); TRY(load_mat(L, n, c->q_lora_rank, H, &ly->q_a, 1));
            NAME("layers.%d.attn.q_a_norm", l); TRY(load_f32(L, n, (uint64_t)c->q_lora_rank, &ly->q_a_norm, 1));
            NAME("layers.%d.attn.q_b", l); TRY(load_mat(L, n, c->n_heads * qk, c->q_lora_rank, &ly->q_b, 1));
        } else {
            NAME("layers.%d.attn.q", l); TRY(load_mat(L, n, c->n_heads * qk, H, &ly->q, 1));
        }
        NAME("layers.%d.attn.kv_a", l); TRY(load_mat(L, n, c->kv_lora_rank + c->qk_rope_dim, H, &ly->kv_a, 1));
        NAME("layers.%d.attn.kv_a_norm", l); TRY(load_f32(L, n, (uint64_t)c->kv_lora_rank, &ly->kv_a_norm, 1));
        NAME("layers.%d.attn.kv_b", l); TRY(load_mat(L, n, c->n_heads * (c->qk_nope_dim + c->v_head_dim), c->kv_lora_rank, &ly->kv_b, 1));
        NAME("layers.%d.attn.o", l); TRY(load_mat(L, n, H, c->n_heads * c->v_head_dim, &ly->o, 1));
        if (c->dsa.on) TRY(mpm_dsa_load(m, L, l));
    }
    TRY(mpm_k3_load_layer(m, L, l));
    TRY(mpm_hc_load_layer(m, L, l));
    ly->moe = c->layer_is_moe[l];
    if (!ly->moe) {
        return load_ffn(L, l, "ffn", c->dense_inter, H, &ly->dense);
    }
    NAME("layers.%d.router", l); TRY(load_mat(L, n, c->n_experts, H, &ly->router, 1));
    if (c->sigmoid) {
        NAME("layers.%d.router_bias", l);
        TRY(load_f32(L, n, (uint64_t)c->n_experts, &ly->router_bias, 0));
        if (!ly->router_bias && !(ly->router_bias = xcalloc((uint64_t)c->n_experts, 4)))
            return mp_seterr(L->err, L->errlen, MP_ENOMEM, "out of memory");
    }
    if (c->n_shared) {
        ly->has_shared = 1;
        TRY(load_ffn(L, l, "shared", c->shared_inter, H, &ly->shared));
        NAME("layers.%d.shared_gate", l);
        if (c->shared_gate) TRY(load_f32(L, n, (uint64_t)H, &ly->shared_gate, 1));
    }
    mpm_bank_info bi;
    memset(&bi, 0, sizeof bi);
    if ((rc = bank(user, l, &bi)) != 0)
        return mp_seterr(L->err, L->errlen, rc < 0 ? rc : MP_EFORMAT, "expert bank of layer %d missing or invalid", l);
    if (bi.count != c->n_experts)
        return mp_seterr(L->err, L->errlen, MP_EFORMAT, "experts.%d: count %lld != num_experts %lld", l, (long long)bi.count, (long long)c->n_experts);
    const int64_t D = c->latent ? c->latent : H; /* the routed experts' width */
    for (int p = 0; p < 3; p++) {
        int64_t rows = p == 2 ? D : c->moe_inter, cols = p == 2 ? c->moe_inter : D;
        if (bi.rows[p] != rows || bi.cols[p] != cols || bi.stages[p] < 1 || bi.stages[p] > 8)
            return mp_seterr(L->err, L->errlen, MP_EFORMAT, "experts.%d: part %s has the wrong shape or stages", l, PARTS[p]);
        ly->stages[p] = bi.stages[p];
        ly->part_off[p] = bi.part_offset[p];
        ly->rot_block[p] = bi.rotation_block[p];
        float *cb;
        NAME("layers.%d.experts.%s.codebook", l, PARTS[p]);
        TRY(load_f32(L, n, (uint64_t)bi.stages[p] * 256 * 8, &cb, 1));
        ly->cbt[p] = xcalloc((uint64_t)bi.stages[p] * 256 * 8, 4);
        if (!ly->cbt[p]) {
            free(cb);
            return mp_seterr(L->err, L->errlen, MP_ENOMEM, "out of memory");
        }
        mpk_rvq_transpose_cb(cb, bi.stages[p], ly->cbt[p]);
        ly->cb[p] = cb;
        if (bi.rotation_block[p]) {
            NAME("layers.%d.experts.%s.rotation", l, PARTS[p]);
            TRY(load_f32(L, n, (uint64_t)cols, &ly->signs[p], 1));
        }
    }
    return 0;
#undef TRY
#undef NAME
}

int mpm_load(const mpm_config *cfg, const mpk_impl *k, mpm_tensor_fn tensor, mpm_bank_fn bank, void *user,
             int ctx, int chunk, mpm_model **out, char *err, size_t errlen) {
    *out = NULL;
    if (ctx < 1) return mp_seterr(err, errlen, MP_EINVAL, "context size must be >= 1");
    if (chunk < 1 || chunk > ctx) return mp_seterr(err, errlen, MP_EINVAL, "chunk %d: must be 1..%d (the context)", chunk, ctx);
    mpm_model *m = calloc(1, sizeof *m);
    if (!m) return mp_seterr(err, errlen, MP_ENOMEM, "out of memory");
    m->c = *cfg;
    m->kern = k ? k : mpk_select(MPK_AUTO);
    m->la_simd = m->kern != mpk_select(MPK_SCALAR);
    m->c.layer_is_moe = malloc((size_t)cfg->n_layers);
    m->ctx = ctx;
    m->chunk = chunk;
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    int rc = MP_ENOMEM;
    if (!m->c.layer_is_moe || !m->layers) {
        mp_seterr(err, errlen, rc, "out of memory");
        goto fail;
    }
    memcpy(m->c.layer_is_moe, cfg->layer_is_moe, (size_t)cfg->n_layers);
    loader L = {tensor, user, err, errlen};
    const mpm_config *c = &m->c;
    if ((rc = load_mat(&L, "embed", c->vocab, c->hidden, &m->embed, 1))) goto fail;
    for (int l = 0; l < c->n_layers; l++)
        if ((rc = load_layer(m, &L, bank, user, l))) goto fail;
    if ((rc = load_f32(&L, "final_norm", (uint64_t)c->hidden, &m->final_norm, 1))) goto fail;
    if ((rc = mpm_k3_load_final(m, &L))) goto fail;
    if (c->tie_embeddings) {
        m->lm_head = m->embed;
    } else if ((rc = load_mat(&L, "lm_head", c->vocab, c->hidden, &m->lm_head, 1))) {
        goto fail;
    }
    if ((rc = mpm_rope_init(m))) {
        mp_seterr(err, errlen, rc, "rope setup failed");
        goto fail;
    }
    if ((rc = mpm_linear_init(m))) {
        mp_seterr(err, errlen, rc, "out of memory allocating the linear-attention state");
        goto fail;
    }
    if (mpm_kv_alloc(m) || alloc_scratch(m) || (c->dsa.on && mpm_dsa_alloc(m)) || alloc_chunk_bufs(m)) {
        rc = mp_seterr(err, errlen, MP_ENOMEM, "out of memory allocating the KV cache / scratch");
        goto fail;
    }
    *out = m;
    return 0;
fail:
    mpm_free(m);
    return rc ? rc : MP_EFORMAT;
}

void mpm_free(mpm_model *m) {
    if (!m) return;
    for (int64_t l = 0; m->layers && l < m->c.n_layers; l++) {
        mpm_layer *ly = &m->layers[l];
        free(ly->attn_norm);
        free(ly->ffn_norm);
        free(ly->q_norm);
        free(ly->k_norm);
        free(ly->q_bias);
        free(ly->k_bias);
        free(ly->v_bias);
        free(ly->q_a_norm);
        free(ly->kv_a_norm);
        free(ly->router_bias);
        for (int p = 0; p < 3; p++) {
            free(ly->cbt[p]);
            free(ly->cb[p]);
            free(ly->signs[p]);
        }
    }
    free_chunk_bufs(m);
    mpm_moe_free(m);
    mpm_k3_free(m);
    mpm_hc_free(m);
    mpm_linear_free(m);
    mpm_dsa_free(m); /* before the layers: it frees their indexer norms */
    free(m->layers);
    free(m->final_norm);
    free(m->inv_freq);
    mpm_kv_free(m);
    void *bufs[] = {m->xn, m->scores, m->cosb, m->sinb, m->qlat, m->olat, m->eo, m->xr, m->ar,
                    m->selw, m->sel, m->ahead, (void *)m->recs, m->aheadw, m->choice, m->allowed,
                    m->c.layer_is_moe};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(m);
}

void mpm_set_io(mpm_model *m, const mpm_expert_io *io) { m->io = *io; }
void mpm_set_pool(mpm_model *m, mpk_pool *pool) { m->pool = pool; }
void mpm_set_lookahead(mpm_model *m, int on) { m->lookahead = on; }
void mpm_set_cancel(mpm_model *m, const atomic_int *flag) { m->cancel = flag; }

int mpm_cancelled(mpm_model *m) {
    if (!m->cancel || !atomic_load_explicit(m->cancel, memory_order_relaxed)) return 0;
    snprintf(m->err, sizeof m->err, "cancelled");
    return MP_ECANCELED;
}
const char *mpm_error(const mpm_model *m) { return m->err; }
int mpm_ctx(const mpm_model *m) { return m->ctx; }
int mpm_chunk(const mpm_model *m) { return m->chunk; }
double mpm_io_wait_seconds(const mpm_model *m) { return m->io_wait; }
uint64_t mpm_prefetches(const mpm_model *m) { return m->prefetches; }

/* Router look-ahead: predict the next MoE layer's experts from the current hidden state and ask
 * the cache to start reading them.  Only a hint: the real routing is recomputed later. */
static void lookahead(mpm_model *m, int l, const float *x) {
    int next = l + 1;
    if (!m->lookahead || !m->io.prefetch || next >= m->c.n_layers || !m->layers[next].moe) return;
    mpk_rmsnorm(m->ar, x, m->layers[next].ffn_norm, m->c.hidden, m->c.eps);
    mpm_route(m, next, m->ar, m->router_logits, m->ahead, m->aheadw);
    m->io.prefetch(m->io.user, next, m->ahead, (int)m->c.top_k);
    m->prefetches += (uint64_t)m->c.top_k;
}

int mpm_forward(mpm_model *m, const int32_t *tokens, int n, int pos, float *logits, int all, int prefill) {
    const mpm_config *c = &m->c;
    const int64_t H = c->hidden;
    if (n < 1 || n > m->chunk) {
        snprintf(m->err, sizeof m->err, "chunk of %d tokens (1..%d)", n, m->chunk);
        return MP_EINVAL;
    }
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab) {
            snprintf(m->err, sizeof m->err, "token id %d out of range (vocab %lld)", tokens[t], (long long)c->vocab);
            return MP_EINVAL;
        }
    if (pos < 0 || pos > m->ctx - n) {
        snprintf(m->err, sizeof m->err, "context full (%d tokens)", m->ctx);
        return MP_ECTX;
    }
    m->err[0] = 0;
    m->prefill = prefill || n > 1;
    m->rbank_n = 0; /* AttnRes (Kimi K3): each pass banks its tokens' streams anew */
    for (int t = 0; t < n; t++) mpk_row(&m->embed, tokens[t], m->bx + t * H);
    if (c->hc_mult) mpm_hc_embed(m, n, m->bx);
    for (int l = 0; l < c->n_layers; l++) {
        mpm_layer *ly = &m->layers[l];
        const float *in = m->bx; /* with AttnRes, the mix of the bank and the stream */
        int rc = mpm_cancelled(m);
        if (rc) return rc;
        if (c->hc_mult) mpm_hc_pre(m, l, 0, n, m->bx); /* with hyper-connections, the collapse */
        if (c->res_block) {
            mpm_res_mix(m, ly->res_attn, n, m->bx, m->bout);
            in = m->bout;
        }
        for (int t = 0; t < n; t++) mpk_rmsnorm(m->bxn + t * H, in + t * H, ly->attn_norm, H, c->eps);
        const int restart = mpm_res_push(m, l, n, m->bx); /* a block start: bank, restart */
        mpm_attention(m, l, pos, n, m->bxn, m->bout);
        if (c->hc_mult) mpm_hc_post(m, n, m->bout);
        else if (restart) memcpy(m->bx, m->bout, (size_t)(n * H) * sizeof(float));
        else
            for (int64_t i = 0; i < n * H; i++) m->bx[i] += m->bout[i];
        in = m->bx;
        if (c->hc_mult) mpm_hc_pre(m, l, 1, n, m->bx);
        if (c->res_block) {
            mpm_res_mix(m, ly->res_ffn, n, m->bx, m->bout);
            in = m->bout;
        }
        for (int t = 0; t < n; t++) mpk_rmsnorm(m->bxn + t * H, in + t * H, ly->ffn_norm, H, c->eps);
        if (ly->moe) {
            rc = mpm_moe(m, l, n, m->bxn, m->bout);
            if (rc) return rc;
        } else {
            mpm_ffn_dense(m, &ly->dense, n, m->bxn, m->bout);
        }
        if (c->hc_mult) mpm_hc_post(m, n, m->bout);
        else
            for (int64_t i = 0; i < n * H; i++) m->bx[i] += m->bout[i];
        if (n == 1) lookahead(m, l, m->bx);
    }
    if (logits) {
        int t0 = all ? 0 : n - 1;
        const float *in = m->bx;
        if (c->hc_mult) mpm_hc_final(m, n, m->bx);
        if (c->res_block) {
            mpm_res_mix(m, m->res_final, n, m->bx, m->bout);
            in = m->bout;
        }
        for (int t = t0; t < n; t++) mpk_rmsnorm(m->bxn + (t - t0) * H, in + t * H, m->final_norm, H, c->eps);
        mpk_matmat(m->kern, m->pool, &m->lm_head, m->bxn, n - t0, logits);
    }
    return 0;
}
