/* Forward pass of the supported MoE decoders (FORMAT.md §7): Mixtral, Qwen3-MoE, DeepSeek-V3,
 * GLM-4.5, MiniMax-M2, Kimi K2.5.
 *
 * The model never touches files: trunk tensors come in through mpm_tensor_fn (bytes already in
 * RAM), routed experts through mpm_expert_io (acquire/release/prefetch a record).  engine.c
 * connects both to the container reader and the expert cache. */
#ifndef MP_MODEL_H
#define MP_MODEL_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include "json.h"
#include "kernels.h"

#define MPM_MAX_EOS 8
#define MPM_MAX_GROUPS 1024
#define MPM_CHUNK 16      /* the smallest prefill chunk (tokens per forward pass; in the floor) */
#define MPM_HELD_CHUNK 512 /* the longest chunk the plan keeps between calls; a longer prompt
                             * borrows the expert cache for its passes (engine.c) */
#define MPM_LA_CHUNK 16   /* linear attention: the chunk form's default sub-chunk (mp_config.linear_chunk) */

enum { MPM_MIXTRAL = 0, MPM_QWEN3_MOE, MPM_DEEPSEEK_V3, MPM_GLM4_MOE, MPM_MINIMAX_M2, MPM_KIMI_K25,
       MPM_QWEN3_NEXT, MPM_QWEN3_5_MOE, MPM_KIMI_LINEAR, MPM_KIMI_K3 };
enum { MPM_LA_GATED_DELTANET = 0, MPM_LA_KDA }; /* mpm_config.la_kind */

enum { MPM_DEEPSEEK_V32 = 32, MPM_GLM_MOE_DSA }; /* MLA + DeepSeek Sparse Attention (model_dsa.c) */
enum { MPM_GLM5_NEXT = 48 }; /* GLM-5.3-Flash: KDA + hyper-connections (model_hyper.c) */

/* DeepSeek Sparse Attention's lightning indexer (FORMAT.md §7 attention.dsa) */
typedef struct mpm_dsa_config {
    int on, rope_interleave; /* rope_interleave: GLM-5; half-split: DeepSeek-V3.2 */
    int64_t heads, dim, topk;
    uint8_t *layer_full; /* [n_layers]: 1 runs the indexer, 0 reuses the latest full layer's top-k */
    int64_t n_full;
    int64_t kpool; /* GLM-5.3-Flash (FORMAT.md 7.2): score pools of kpool positions; 0: positions */
} mpm_dsa_config;

typedef struct mpm_config {
    int arch;
    int64_t vocab, hidden, n_layers, n_heads, n_kv_heads, head_dim, max_pos;
    float eps;
    double rope_theta;
    int tie_embeddings, qk_norm;
    int qk_norm_full; /* qk_norm over all heads at once (MiniMax-M2), else per head */
    int qkv_bias;     /* GQA q/k/v projection biases (GLM-4.5) */
    int64_t rotary_dim; /* GQA: rotate-half RoPE on the first rotary_dim dims of each head */
    /* YaRN (DeepSeek-V3); yarn = 0 means plain RoPE */
    int yarn;
    double yarn_attn_factor; /* explicit attention_factor, or 0 = derive from mscale */
    double yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
    int64_t yarn_orig_max_pos;
    int rope_interleave; /* DeepSeek: rope dims stored interleaved (pairs 2i, 2i+1) */
    int mla_no_rope;     /* MLA without rotation: the rope dims are used as they are (Kimi-Linear) */
    float latent_eps;    /* MLA q_a/kv_a RMSNorm eps */
    int64_t sliding_window; /* Mixtral: attend to the last `sliding_window` positions; 0 = all */
    /* attention */
    int mla;
    int64_t q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
    mpm_dsa_config dsa;
    /* layers */
    uint8_t *layer_is_moe; /* [n_layers] */
    int64_t dense_inter;
    /* MoE */
    int64_t n_experts, top_k, moe_inter, n_group, topk_group, n_shared, shared_inter;
    int sigmoid, norm_topk;
    float routed_scale;
    int32_t eos[MPM_MAX_EOS];
    int n_eos;
    int32_t bos;
    /* Qwen3-Next (model_linear.c): (1 + w) RMSNorms, sigmoid-gated attention output and shared
     * expert, Gated DeltaNet layers (layer_is_linear NULL: every layer full attention) */
    int norm_offset, attn_gate, shared_gate;
    uint8_t *layer_is_linear;
    int64_t n_linear; /* linear layers (they have no KV cache) */
    int64_t la_nk, la_nv, la_dk, la_dv, la_conv;
    int la_grouped; /* in_proj_qkvz + in_proj_ba (Qwen3-Next), else qkv, z, b, a */
    int kv_f16;     /* KV cache entries as IEEE f16: the engine's choice (mp_config.kv), not the manifest's */
    int la_chunk;   /* sub-chunk of the chunk-form delta rule (mp_config.linear_chunk; <= 1: token form) */
    int la_kind;    /* MPM_LA_*; KDA (model_kda.c): la_nk = la_nv heads, la_dk = la_dv */
    /* Kimi K3 (model_k3.c, docs/K3.md): SiTU in every FFN (situ_beta > 0; situ_lb > 0 also
     * clips the up branch), routed experts in a latent space of `latent` dims (0: hidden),
     * block attention residuals every res_block layers (0: plain residual), bounded KDA decay
     * (kda_bound < 0), full-rank KDA output gate, sigmoid output gate on MLA heads */
    float situ_beta, situ_lb, kda_bound;
    int64_t latent, res_block;
    int kda_full_gate, mla_gate;
    /* GLM-5.3-Flash (FORMAT.md 7.2): hc_mult residual streams (0: one plain residual), Sinkhorn
     * settings; SwiGLU with gate <= swiglu_limit and |up| <= swiglu_limit (0: no clamp) */
    int64_t hc_mult, hc_iters;
    float hc_eps, swiglu_limit;
} mpm_config;

/* Parses manifest.model, the only part of the manifest the engine reads (FORMAT.md §7).
 * Returns 0 or MP_EFORMAT/MP_EUNSUPPORTED with a message in err.  Call mpm_config_free after
 * it either way. */
int mpm_config_parse(const mp_json *model, mpm_config *c, char *err, size_t errlen);
void mpm_config_free(mpm_config *c);
int mpm_config_moe_layers(const mpm_config *c);

/* A tensor as stored: codec + shape + bytes in RAM. */
typedef struct mpm_src {
    const mp_codec_info *codec; /* parsed once at open (codecs.h) */
    int ndim;
    int64_t shape[4];
    const uint8_t *data;
    uint64_t length;
} mpm_src;
/* Looks up a canonical tensor name: 0 found, 1 absent, < 0 error. */
typedef int (*mpm_tensor_fn)(void *user, const char *name, mpm_src *out);

/* Routed-expert record access for one layer's selected experts at once: acquire blocks until
 * all n records are in RAM (reads issued together) and pins them; returns 0 or an MP_E* code with
 * a message in msg.  release unpins the same list.  prefetch is an asynchronous hint (may be
 * NULL) that finds room only in the cache, which holds `cached` records, pinned ones included
 * (0: none or unknown). */
typedef struct mpm_expert_io {
    void *user;
    int (*acquire)(void *user, int layer, const int *experts, int n, const uint8_t **records,
                   char *msg, size_t msglen);
    void (*release)(void *user, int layer, const int *experts, int n);
    void (*prefetch)(void *user, int layer, const int *experts, int n);
    int cached;
} mpm_expert_io;

/* Expert part layout within a record (from the bank's "parts"). */
typedef struct mpm_bank_info {
    int layer;
    int64_t count, stride;
    uint64_t part_offset[3];  /* gate, up, down */
    int64_t rows[3], cols[3];
    int stages[3];
    int rotation_block[3];    /* 0 = no rotation */
} mpm_bank_info;
typedef int (*mpm_bank_fn)(void *user, int layer, mpm_bank_info *out);

typedef struct mpm_model mpm_model;

/* Bytes of the MoE chunk scratch (lookup tables of `chunk` tokens for parts of at most `stages`
 * stages, expert outputs, token lists); 0 without MoE layers.  Not in mpm_scratch_bytes: the
 * stages come from the expert banks. */
uint64_t mpm_moe_chunk_bytes(const mpm_config *c, int chunk, int stages);

/* Loads the trunk (decoding norms/codebooks to f32, keeping matrices encoded) and allocates the
 * KV cache for ctx tokens and the buffers for prefill chunks of up to `chunk` tokens
 * (1..ctx; mpm_set_chunk changes it), computing with the kernels `k` and holding the workspaces
 * they need (NULL: the automatic choice). */
int mpm_load(const mpm_config *c, const mpk_impl *k, mpm_tensor_fn tensor, mpm_bank_fn bank, void *user,
             int ctx, int chunk, mpm_model **out, char *err, size_t errlen);
void mpm_free(mpm_model *m);
void mpm_set_io(mpm_model *m, const mpm_expert_io *io);
void mpm_set_pool(mpm_model *m, mpk_pool *pool);
void mpm_set_lookahead(mpm_model *m, int on);
/* A flag another thread may set while mpm_forward runs (NULL: none): the pass stops at its
 * next layer or expert read group with MP_ECANCELED (mp_set_cancel). */
void mpm_set_cancel(mpm_model *m, const atomic_int *flag);

/* Bytes of KV/latent cache for ctx tokens (f32 or f16 entries: c->kv_f16; memory planning). */
uint64_t mpm_kv_bytes(const mpm_config *c, int ctx);
/* Linear-attention state (conv + recurrent, all linear layers; fixed, whatever ctx) and the
 * per-token buffers of model_linear.c. */
uint64_t mpm_state_bytes(const mpm_config *c);
uint64_t mpm_linear_scratch_bytes(const mpm_config *c);
/* KDA's buffers for prompt chunks of `chunk` tokens (projections computed for the whole chunk) */
uint64_t mpm_linear_chunk_bytes(const mpm_config *c, int chunk);
/* Linear-attention state across calls: mpm_state_begin before a call's forward passes, and
 * mpm_state_commit after all of them succeeded; without the commit the state stays as it was
 * before the call (the passes advance a working copy).  save/load copy the committed state
 * (mpm_state_size bytes; 0 without linear layers). */
void mpm_state_begin(mpm_model *m);
void mpm_state_commit(mpm_model *m);
uint64_t mpm_state_size(const mpm_model *m);
void mpm_state_save(const mpm_model *m, void *dst);
void mpm_state_load(mpm_model *m, const void *src);
/* activations and buffers for prefill chunks of `chunk` tokens (MoE tables: mpm_moe_chunk_bytes) */
uint64_t mpm_scratch_bytes(const mpm_config *c, int chunk);

/* Runs n <= mpm_chunk() tokens at positions pos.. (pos = tokens already cached).  logits: NULL,
 * or vocab floats for the last token (all = 0) or n x vocab (all = 1).  prefill (or n > 1): the
 * pass is part of a prompt and its routed experts use the prefill product (CODECS.md §3.6), so a
 * prompt token's result is the same bits however the prompt is split into passes (with linear
 * attention: at multiples of its sub-chunk); a one-token pass without it (decode) uses the table
 * product, within the bound docs/RUNTIME.md states.  Returns 0 or an MP_E* code (message in
 * mpm_error). */
int mpm_forward(mpm_model *m, const int32_t *tokens, int n, int pos, float *logits, int all, int prefill);
const char *mpm_error(const mpm_model *m);
double mpm_now(void); /* monotonic seconds */
int mpm_ctx(const mpm_model *m);
int mpm_chunk(const mpm_model *m); /* tokens per forward pass (mpm_load's chunk, or mpm_set_chunk's) */
/* Reallocates the chunk's buffers for passes of up to `chunk` (1..ctx) tokens, the old ones freed
 * first; on failure the old size is kept (MP_ENOMEM; if even that fails, every pass is refused). */
int mpm_set_chunk(mpm_model *m, int chunk);
double mpm_io_wait_seconds(const mpm_model *m);
uint64_t mpm_prefetches(const mpm_model *m);

#endif
