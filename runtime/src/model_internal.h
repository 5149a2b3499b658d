/* Internal layout of a loaded model, shared by model.c, model_attn.c and model_moe.c. */
#ifndef MP_MODEL_INTERNAL_H
#define MP_MODEL_INTERNAL_H

#include "model.h"

#include <math.h>

typedef struct mpm_ffn {
    mpk_mat gate, up, down;
    int64_t inter;
} mpm_ffn;

typedef struct mpm_layer {
    float *attn_norm, *ffn_norm;
    /* GQA */
    mpk_mat q, k, v, o;
    float *q_norm, *k_norm; /* qk_norm: [head_dim], or [heads*head_dim] / [kv*head_dim] (all_heads) */
    float *q_bias, *k_bias, *v_bias; /* qkv_bias (GLM-4.5) */
    /* MLA */
    mpk_mat q_a, q_b, kv_a, kv_b;
    float *q_a_norm, *kv_a_norm;
    /* DSA indexer (model_dsa.c), full layers: queries from the q LoRA latent, one key per token
     * with a LayerNorm (weight, bias), per-head weights; idx_slot: its key cache, -1 shared.
     * k-pool (GLM-5.3-Flash): the gate-score projection and the pool's position embedding
     * [kpool][dim] */
    mpk_mat idx_q, idx_k, idx_w, idx_pg;
    float *idx_kn_w, *idx_kn_b, *idx_ape;
    int idx_slot;
    /* FFN */
    int moe;
    mpk_mat router;
    float *router_bias; /* sigmoid scoring */
    mpm_ffn dense, shared;
    int has_shared;
    /* routed experts: per part (gate, up, down) codebook as stored [stages][256][8] (the prefill
     * product decodes with it) and transposed (the decode tables are built from it), optional
     * rotation */
    float *cb[3], *cbt[3];
    int stages[3];
    float *signs[3];
    int rot_block[3];
    uint64_t part_off[3];
    /* Gated DeltaNet (model_linear.c): input projections, conv [conv_dim][K], dt_bias, A_log,
     * gated-norm weight, output; state slices of mpm_model.lstate */
    int linear, la_nin;
    mpk_mat la_in[4], la_out;
    float *la_conv, *la_dt, *la_A, *la_norm;
    int la_slot;  /* this layer's state in mpm_model.lstate / lwork */
    int la_fresh; /* no token of the current call has passed: read lstate, write lwork */
    mpk_mat kda_fa, kda_fb, kda_ga, kda_gb, kda_b; /* KDA: decay and output-gate low-rank pairs, beta */
    float *shared_gate; /* [hidden]: shared expert x sigmoid(shared_gate . x) */
    /* Kimi K3 (model_k3.c): AttnRes score vectors before attention and FFN (res_norm x
     * res_proj), latent projections and norm of the routed experts, full-rank KDA gate, MLA
     * output gate */
    float *res_attn, *res_ffn, *lat_norm;
    mpk_mat lat_down, lat_up, kda_g, mla_g;
    float *hc_fn[2], *hc_base[2], *hc_scale[2]; /* hyper-connections before attention, FFN */
    int kv_slot;        /* GQA: this layer's place in the KV cache (full-attention layers only) */
} mpm_layer;

struct mpm_model {
    mpm_config c;
    int ctx;
    int chunk; /* tokens per forward pass: the chunk buffers' size */
    mpm_layer *layers;
    mpk_mat embed, lm_head;
    float *final_norm;
    mpk_pool *pool;
    const mpk_impl *kern; /* this model's kernel table (per engine, never process-wide) */
    int la_simd;          /* the delta rule's AVX2 build (same bits): not on the scalar table */
    mpm_expert_io io;
    int lookahead;
    const atomic_int *cancel; /* mpm_set_cancel */
    char err[256];
    /* RoPE: inv_freq[rope_dim/2] and the cos/sin scale (YaRN attention factor) */
    double *inv_freq;
    float rope_mscale, attn_scale;
    int64_t rope_dim;
    /* caches (model_kv.c): GQA k/v [slot][ctx][kv*hd]; MLA latent + k_rope [slot][ctx][kv_lora +
     * rope] (vc = kc); entries f32, or f16 when c.kv_f16 */
    void *kc, *vc;
    /* scratch */
    float *xn, *q, *kbuf, *vbuf, *att, *scores, *cosb, *sinb;
    float *qlat, *olat, *lat;
    /* DSA (model_dsa.c): indexer key cache [full layers][ctx][dim] (f32, or f16 with the KV
     * cache's kv_f16; k-pool: a complete pool's key replaces its last position's key) and, with
     * k-pools, the gate-score cache of the same shape; per chunk token its indexer queries, key,
     * gate scores, head weights, and selected positions (dsa_n of them; -1: all past ones); one
     * pool key being built */
    void *dsa_kc, *dsa_gc;
    float *dsa_q, *dsa_k, *dsa_g, *dsa_w, *dsa_pk;
    int32_t *dsa_sel, *dsa_n;
    void *dsa_rows; /* one token's selected cache rows, gathered for mpm_attend */
    float *router_logits, *eo, *g, *u, *xr, *ar;
    int32_t *sel;
    const uint8_t **recs;
    float *selw;
    int32_t *ahead; /* look-ahead predictions */
    /* chunk buffers (MPM_CHUNK tokens): residual, normalised input, block output, per-token
     * routing and routed-expert sums, distinct experts of the chunk */
    float *bx, *bxn, *bout, *bselw, *bsum;
    int32_t *bsel, *uniq;
    float *aheadw, *choice;
    /* MoE (model_moe.c): one token's gate/up tables for decode (ctab_stages = the most stages
     * of any part); for a prefill chunk, the layer's integer codebooks (cicb: gate, up,
     * down), one expert's inputs gathered and quantised (mpk_rvq_xq; gate, up: rows of hidden
     * values, down: of moe_inter values) and its down outputs; the (token, rank) pairs sorted
     * by expert */
    mpk_rvq_tab ctabs[2];
    void *ctabmem; /* ctabs' memory, then a decode batch's down tables */
    float *cdec;   /* a decode batch's gate, up and down outputs */
    int ctab_stages;
    int prefill; /* this forward pass is part of a prompt: the prefill product (CODECS.md §3.6) */
    mpk_rvq_icb *cicb;
    uint8_t *cxg, *cxu, *cxd;
    void *cws; /* the prefill products' workspace (prefill_ws_bytes; NULL when the kernels need none) */
    float *ceo;
    int32_t *cpairs, *corder, *cstart, *cfill;
    uint8_t *allowed;
    float *lstate, *lbuf, *lqg; /* linear-attention states, model_linear.c scratch, gated q */
    float *lwork;   /* the states a call advances; lstate changes only when the call succeeds */
    float *lws;     /* per linear head: the delta rule's workspace (mpl_ws_floats) */
    int l_touched;  /* a token of the current call has passed the linear layers */
    int32_t *lperm;
    /* Kimi K3 (model_k3.c): final AttnRes score; per chunk token the AttnRes bank
     * [chunk][banks][hidden] and its size; latent inputs/sums [chunk][latent]; MLA gates */
    float *res_final, *rbank, *klat, *kgate;
    int rbank_n;
    float *hs, *hw, *hx; /* model_hyper.c: streams, per-token post + comb, one token's scratch */
    double io_wait;
    uint64_t prefetches;
};

/* model_kv.c: KV cache rows (f32 or f16 entries) and attention over cached positions */
int mpm_kv_alloc(mpm_model *m); /* after m->ctx is set; -1 out of memory */
void mpm_kv_free(mpm_model *m);
void *mpm_kv_row(const mpm_model *m, void *cache, int slot, int64_t pos);
void mpm_kv_put(const mpm_model *m, void *dst, const float *src, int64_t n); /* n floats -> entries */
/* One token's attention over n cached positions: head h (of heads) scores
 * dot(q_h, k[..kd]) (+ dot over the next kd2 columns) * scale against each row, softmax, and
 * out_h = sum_t p_t v_t[..vw].  Head h reads the columns of its group (GQA: KV head; MLA: every
 * head reads the same latent row), which start at group * goff. */
typedef struct mpm_attn_span {
    const void *K, *V;        /* cache rows of the first attended position */
    int64_t n, heads;
    int64_t kd, kd2, vw, goff;
    const float *q;           /* head h's query at q + h * qs */
    int64_t qs;
    float *out;               /* head h's output at out + h * os */
    int64_t os;
    float scale;
} mpm_attn_span;
void mpm_attend(mpm_model *m, const mpm_attn_span *a);
/* model_attn.c */
int mpm_rope_init(mpm_model *m);
/* attention for T chunk tokens at positions pos..: xn T x hidden -> out T x hidden */
void mpm_attention(mpm_model *m, int layer, int pos, int T, const float *xn, float *out);
/* RoPE of position pos into the shared cos/sin tables, then rotation of one rope_dim vector */
void mpm_rope_tables(mpm_model *m, int pos);
void mpm_rope_apply(const mpm_model *m, float *v, int interleaved);
/* model_dsa.c: DeepSeek Sparse Attention, one function per step, for any MLA-style layer with
 * a q LoRA latent.  Load: the indexer weights of a full layer (sets idx_slot).  Memory: the key
 * cache (part of mpm_kv_bytes) and chunk buffers (part of mpm_scratch_bytes), allocated by
 * mpm_dsa_alloc after the layers are loaded. */
int mpm_dsa_load(mpm_model *m, void *loader, int layer);
uint64_t mpm_dsa_cache_bytes(const mpm_config *c, int ctx);
uint64_t mpm_dsa_scratch_bytes(const mpm_config *c, int chunk);
int mpm_dsa_alloc(mpm_model *m);
int mpm_dsa_chunk_alloc(mpm_model *m); /* the buffers of m->chunk tokens (mpm_set_chunk) */
void mpm_dsa_chunk_free(mpm_model *m);
void mpm_dsa_free(mpm_model *m);
/* Steps for T chunk tokens at pos..: keys (LayerNorm, RoPE) into the cache (k-pool: and the
 * gate scores, and the key of each pool a token completes); queries (RoPE) and head weights
 * (scaled by heads^-1/2); one token's index scores over its candidates (positions 0..pos, or
 * the complete pools ending at or before pos; pool tasks of 64), returning their count; the
 * top k of n scores (higher score first, ties: lower index), returned in ascending order. */
void mpm_dsa_keys(mpm_model *m, int layer, int pos, int T, const float *xn);
void mpm_dsa_queries(mpm_model *m, int layer, int pos, int T, const float *xn, const float *qres);
int mpm_dsa_scores(mpm_model *m, int layer, int t, int pos, float *scores);
int mpm_dsa_topk(const float *scores, int n, int k, int32_t *sel);
/* All steps for a chunk on a full layer (shared layers keep the selection); uses m->scores.
 * Then mpm_dsa_rows gives the cache rows chunk token t attends to, for mpm_attend: with *n =
 * pos + 1 on entry, either the layer's cache itself (every candidate within top-k: dense
 * attention, same bits) or its selected rows (k-pool: the chosen pools' positions, then the
 * incomplete tail) gathered in ascending position order, *n set to their count. */
void mpm_dsa_select(mpm_model *m, int layer, int pos, int T, const float *xn, const float *qres);
const void *mpm_dsa_rows(mpm_model *m, int kv_slot, int t, int64_t *n);
/* model_linear.c */
int mpm_linear_load(mpm_model *m, void *loader, int layer);
int mpm_linear_init(mpm_model *m); /* after the layers are loaded */
void mpm_linear_free(mpm_model *m);
int mpm_linear_chunk_alloc(mpm_model *m);
void mpm_linear_chunk_free(mpm_model *m);
void mpm_linear_attention(mpm_model *m, int layer, int pos, int T, const float *xn, float *out);
void mpm_gated_query(mpm_model *m, const mpm_layer *ly, const float *x, float *q, float *gate);
void mpm_apply_gate(float *out, const float *gate, int64_t n);
void mpm_shared_gate(mpm_model *m, const mpm_layer *ly, int T, const float *xn, float *out);
/* model_kda.c (through model_linear.c's entry points when la_kind is MPM_LA_KDA) */
int mpm_kda_load(mpm_model *m, void *loader, int layer);
/* the state a token of linear layer ly reads (src) and writes (dst), at position pos */
void mpm_linear_state(mpm_model *m, mpm_layer *ly, int pos, const float **src, float **dst);
/* Head h of linear layer ly after its inputs: s's delta rule over the call's T tokens from the
 * state src to dst (each [conv inputs: rec floats | recurrent matrices]), then each token's
 * output gated-RMSNormed with its gate z + t * zs (sigmoid_gate: KDA's sigmoid, else silu). */
struct mpl_seq;
void mpm_linear_head_out(mpm_model *m, const mpm_layer *ly, const struct mpl_seq *s, size_t h, int pos, int T,
                         const float *src, float *dst, int64_t rec, const float *z, int64_t zs,
                         int sigmoid_gate);
uint64_t mpm_kda_chunk_floats(const mpm_config *c); /* per chunk token */
void mpm_kda_attention(mpm_model *m, int layer, int pos, int T, const float *xn, float *out);
/* model.c's tensor loaders for model_linear.c (required tensors) */
int mpm_load_mat(void *loader, const char *name, int64_t rows, int64_t cols, mpk_mat *out);
int mpm_load_f32(void *loader, const char *name, uint64_t numel, float **out);
/* model_k3.c: Kimi K3's parts, each a no-op for other architectures */
#define MPM_MAX_RES_SOURCES 4097 /* AttnRes: at most one bank per layer (4096) + the stream */
static inline float mpm_act(const mpm_config *c, float g, float u) { /* SiTU-GLU or SwiGLU */
    if (c->swiglu_limit > 0) { /* GLM-5.3-Flash's clamped SwiGLU */
        g = fminf(g, c->swiglu_limit);
        u = fminf(fmaxf(u, -c->swiglu_limit), c->swiglu_limit);
    }
    if (!(c->situ_beta > 0)) return mpk_silu(g) * u;
    if (c->situ_lb > 0) u = c->situ_lb * tanhf(u / c->situ_lb);
    return c->situ_beta * tanhf(g / c->situ_beta) / (1.0f + expf(-g)) * u;
}
/* g[i] = mpm_act(c, g[i], u[i]) for i < n; plain SwiGLU eight-wide (mpk_swiglu, the same bits) */
static inline void mpm_act_rows(const mpm_config *c, float *g, const float *u, int64_t n) {
    if (!(c->swiglu_limit > 0) && !(c->situ_beta > 0)) {
        mpk_swiglu(g, u, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) g[i] = mpm_act(c, g[i], u[i]);
}
int mpm_k3_load_layer(mpm_model *m, void *loader, int layer);
/* model_hyper.c: GLM-5.3-Flash's hyper-connections, each a no-op when hc_mult is 0 */
int mpm_hc_load_layer(mpm_model *m, void *loader, int layer);
uint64_t mpm_hc_scratch_bytes(const mpm_config *c, int chunk);
int mpm_hc_alloc(mpm_model *m);
int mpm_hc_chunk_alloc(mpm_model *m);
void mpm_hc_chunk_free(mpm_model *m);
void mpm_hc_free(mpm_model *m);
void mpm_hc_embed(mpm_model *m, int T, const float *x);                /* x -> N streams */
void mpm_hc_pre(mpm_model *m, int layer, int block, int T, float *out); /* block 0 attn, 1 FFN */
void mpm_hc_post(mpm_model *m, int T, const float *o);
void mpm_hc_final(mpm_model *m, int T, float *out); /* the streams' mean */
int mpm_k3_load_final(mpm_model *m, void *loader);
uint64_t mpm_k3_scratch_bytes(const mpm_config *c, int chunk);
int mpm_k3_chunk_alloc(mpm_model *m);
void mpm_k3_chunk_free(mpm_model *m);
void mpm_k3_free(mpm_model *m);
/* AttnRes: the layer input `out` (T x hidden) mixed from each token's bank and current stream
 * x, then bank x when layer starts a block; returns whether it did (the stream restarts) */
void mpm_res_mix(mpm_model *m, const float *score, int T, const float *x, float *out);
int mpm_res_push(mpm_model *m, int layer, int T, const float *x);
/* latent MoE: routed experts' input z = lat_down . xn; their summed output -> lat_up . norm */
void mpm_latent_in(mpm_model *m, const mpm_layer *ly, int T, const float *xn, float *z);
void mpm_latent_out(mpm_model *m, const mpm_layer *ly, int T, float *sum, float *out);
void mpm_mla_gate(mpm_model *m, const mpm_layer *ly, int T, const float *xn, float *att);

/* model_moe.c */
int mpm_moe(mpm_model *m, int layer, int T, const float *xn, float *out);
/* MP_ECANCELED (and m->err says so) when the mpm_set_cancel flag is set, else 0 */
int mpm_cancelled(mpm_model *m);
int mpm_moe_alloc(mpm_model *m); /* decode tables, after the layers are loaded */
int mpm_moe_chunk_alloc(mpm_model *m); /* the prefill buffers of m->chunk tokens */
void mpm_moe_chunk_free(mpm_model *m);
void mpm_moe_free(mpm_model *m);
/* dense / shared FFN for T inputs (T x hidden -> T x hidden) */
void mpm_ffn_dense(mpm_model *m, const mpm_ffn *f, int T, const float *xn, float *out);
/* A trunk matrix times a chunk's T inputs: in a prefill pass the prefill product (mpk_gemm: each
 * input's bits independent of T), else mpk_matmat (one token in decode).  Per-token products
 * (routers, the lm_head, gated queries) stay mpk_matvec/mpk_matmat in both. */
static inline void mpm_matmat(const mpm_model *m, const mpk_mat *w, const float *x, int64_t T, float *y) {
    if (m->prefill) mpk_gemm(m->kern, m->pool, w, x, T, y);
    else mpk_matmat(m->kern, m->pool, w, x, T, y);
}
void mpm_route(const mpm_model *m, int layer, const float *xn, float *logits_scratch,
               int32_t *sel, float *w);
/* mpm_route's choice from a token's router logits (overwritten: softmax or sigmoid in place) */
void mpm_select(const mpm_model *m, int layer, float *logits, int32_t *sel, float *w);

#endif
