/* manifest.model (FORMAT.md §7) -> mpm_config, with range checks so that the forward pass can
 * trust every size (products are checked to stay far below 2^62). The rules and bounds are
 * format/model_desc.py's (the converter refuses the same descriptions up front);
 * tests/test_hostile_config_rules.py runs one table of bad descriptions through both. */
#include "model.h"
#include "moepack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(code, ...)                                                                        \
    do {                                                                                       \
        snprintf(err, errlen, __VA_ARGS__);                                                    \
        return code;                                                                           \
    } while (0)

/* Bounds of format/model_desc.py (keep in step) */
#define MAX_LAYERS 4096
#define MAX_EXPERTS 65536
#define MAX_TOTAL_EXPERTS (INT64_C(1) << 20)
#define MAX_HIDDEN (INT64_C(1) << 17)
#define MAX_VOCAB (INT64_C(1) << 22)
#define MAX_INTER (INT64_C(1) << 20)
#define MAX_HEADS 4096
#define MAX_HEAD_DIM 4096
#define MAX_ROPE_DIM 1024
#define MAX_LORA (INT64_C(1) << 16)
#define MAX_POS (INT64_C(1) << 30)
#define MAX_SHARED 1024
#define MAX_CONV_KERNEL 64

/* `pre` names the object for messages: "" (manifest.model), "attention.", "moe.", ... */
static int get_int(const mp_json *o, const char *pre, const char *key, int64_t lo, int64_t hi,
                   int64_t *out, char *err, size_t errlen) {
    const mp_json *v = mp_json_get(o, key);
    if (mp_json_as_i64(v, out) != 0 || *out < lo || *out > hi)
        FAIL(MP_EFORMAT, "manifest.model: %s%s must be an integer in %lld..%lld", pre, key,
             (long long)lo, (long long)hi);
    return 0;
}

static int get_opt_int(const mp_json *o, const char *pre, const char *key, int64_t lo, int64_t hi,
                       int64_t dflt, int64_t *out, char *err, size_t errlen) {
    const mp_json *v = mp_json_get(o, key);
    if (!v || mp_json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    return get_int(o, pre, key, lo, hi, out, err, errlen);
}

/* A finite number (or `dflt` when absent or null); non-zero when not one. */
static int get_num(const mp_json *o, const char *key, double dflt, double *out) {
    const mp_json *v = mp_json_get(o, key);
    if (!v || mp_json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    return mp_json_as_f64(v, out) != 0 || !isfinite(*out);
}

/* An optional flag: absent or null gives dflt; anything but true/false is an error. */
static int get_opt_bool(const mp_json *o, const char *pre, const char *key, int dflt, int *out,
                        char *err, size_t errlen) {
    const mp_json *v = mp_json_get(o, key);
    *out = dflt;
    if (!v || mp_json_is_null(v)) return 0;
    if (mp_json_as_bool(v, out) != 0) FAIL(MP_EFORMAT, "manifest.model: %s%s must be true or false", pre, key);
    return 0;
}

static int get_bool(const mp_json *o, const char *key, int dflt) {
    int b;
    return mp_json_as_bool(mp_json_get(o, key), &b) == 0 ? b : dflt;
}

/* A number of rope_scaling: absent or null gives dflt (factor's 0 is refused: it is required);
 * finite and, with positive, > 0 (else >= 0). */
static int yarn_num(const mp_json *rs, const char *key, double dflt, int positive, double *out,
                    char *err, size_t errlen) {
    if (get_num(rs, key, dflt, out) || !(positive ? *out > 0 : *out >= 0))
        FAIL(MP_EFORMAT, "manifest.model: rope_scaling.%s must be a finite number %s", key,
             positive ? "> 0" : ">= 0");
    return 0;
}

/* rope_scaling (FORMAT.md §7): null, or the normalised YaRN object */
static int parse_rope_scaling(const mp_json *m, mpm_config *c, char *err, size_t errlen) {
    const mp_json *rs = mp_json_get(m, "rope_scaling");
    if (!rs || mp_json_is_null(rs)) return 0;
    if (mp_json_type_of(rs) != MP_JSON_OBJECT) FAIL(MP_EFORMAT, "manifest.model: rope_scaling must be null or an object");
    const char *t = mp_json_as_str(mp_json_get(rs, "rope_type"), NULL);
    if (!t || strcmp(t, "yarn")) FAIL(MP_EUNSUPPORTED, "manifest.model: rope_scaling type %s is not supported (yarn)", t ? t : "(none)");
    c->yarn = 1;
    int rc;
    int64_t omp;
    if ((rc = yarn_num(rs, "factor", 0.0, 1, &c->yarn_factor, err, errlen)) ||
        (rc = yarn_num(rs, "beta_fast", 32.0, 1, &c->yarn_beta_fast, err, errlen)) ||
        (rc = yarn_num(rs, "beta_slow", 1.0, 1, &c->yarn_beta_slow, err, errlen)) ||
        (rc = yarn_num(rs, "mscale", 0.0, 0, &c->yarn_mscale, err, errlen)) ||
        (rc = yarn_num(rs, "mscale_all_dim", 0.0, 0, &c->yarn_mscale_all_dim, err, errlen)) ||
        (rc = get_opt_int(rs, "rope_scaling.", "original_max_position_embeddings", 1, MAX_POS, c->max_pos, &omp, err, errlen)))
        return rc;
    c->yarn_orig_max_pos = omp;
    c->yarn_attn_factor = 0; /* absent or null: derived from the mscales (model_attn.c) */
    const mp_json *af = mp_json_get(rs, "attention_factor");
    if (af && !mp_json_is_null(af)) return yarn_num(rs, "attention_factor", 0.0, 1, &c->yarn_attn_factor, err, errlen);
    return 0;
}

/* layer_attention (absent: every layer full attention) and, with any linear layer,
 * linear_attention (Gated DeltaNet) */
static int parse_linear(const mp_json *m, mpm_config *c, char *err, size_t errlen) {
    const mp_json *la = mp_json_get(m, "layer_attention");
    if (!la || mp_json_is_null(la)) return 0;
    if (mp_json_type_of(la) != MP_JSON_ARRAY || (int64_t)mp_json_len(la) != c->n_layers)
        FAIL(MP_EFORMAT, "manifest.model: layer_attention must list num_layers kinds");
    c->layer_is_linear = calloc((size_t)c->n_layers, 1);
    if (!c->layer_is_linear) FAIL(MP_ENOMEM, "out of memory");
    int any = 0;
    for (int64_t i = 0; i < c->n_layers; i++) {
        const char *k = mp_json_as_str(mp_json_at(la, (size_t)i), NULL);
        if (k && !strcmp(k, "linear")) c->layer_is_linear[i] = 1, any = 1, c->n_linear++;
        else if (!k || strcmp(k, "full")) FAIL(MP_EFORMAT, "manifest.model: layer_attention[%lld] must be full or linear", (long long)i);
    }
    if (!any) return 0;
    const mp_json *o = mp_json_get(m, "linear_attention");
    if (mp_json_type_of(o) != MP_JSON_OBJECT) FAIL(MP_EFORMAT, "manifest.model: linear_attention must be an object");
    const char *kind = mp_json_as_str(mp_json_get(o, "kind"), NULL);
    if (!kind || (strcmp(kind, "gated_deltanet") && strcmp(kind, "kda")))
        FAIL(MP_EUNSUPPORTED, "manifest.model: linear_attention.kind must be one of gated_deltanet, kda");
    const char *a = "linear_attention.";
    int rc;
    if (!strcmp(kind, "kda")) { /* one head count and one head size for q, k and v */
        c->la_kind = MPM_LA_KDA;
        if ((rc = get_int(o, a, "num_heads", 1, MAX_HEADS, &c->la_nk, err, errlen)) ||
            (rc = get_int(o, a, "head_dim", 1, MAX_HEAD_DIM, &c->la_dk, err, errlen)) ||
            (rc = get_int(o, a, "conv_kernel_size", 1, MAX_CONV_KERNEL, &c->la_conv, err, errlen)))
            return rc;
        c->la_nv = c->la_nk, c->la_dv = c->la_dk;
        return 0;
    }
    if (c->mla) FAIL(MP_EFORMAT, "manifest.model: layer_attention: gated_deltanet layers need attention.kind gqa");
    const char *proj = mp_json_as_str(mp_json_get(o, "projection"), NULL);
    if (!proj || (strcmp(proj, "grouped_qkvz") && strcmp(proj, "split")))
        FAIL(MP_EFORMAT, "manifest.model: linear_attention.projection must be one of grouped_qkvz, split");
    c->la_grouped = !strcmp(proj, "grouped_qkvz");
    if ((rc = get_int(o, a, "num_key_heads", 1, MAX_HEADS, &c->la_nk, err, errlen)) ||
        (rc = get_int(o, a, "num_value_heads", 1, MAX_HEADS, &c->la_nv, err, errlen)) ||
        (rc = get_int(o, a, "key_head_dim", 1, MAX_HEAD_DIM, &c->la_dk, err, errlen)) ||
        (rc = get_int(o, a, "value_head_dim", 1, MAX_HEAD_DIM, &c->la_dv, err, errlen)) ||
        (rc = get_int(o, a, "conv_kernel_size", 1, MAX_CONV_KERNEL, &c->la_conv, err, errlen)))
        return rc;
    if (c->la_nv % c->la_nk) FAIL(MP_EFORMAT, "manifest.model: linear_attention.num_value_heads must be a multiple of num_key_heads");
    return 0;
}

/* attention.dsa (optional, MLA with a q LoRA): DeepSeek Sparse Attention's lightning indexer */
static int parse_dsa(const mp_json *at, mpm_config *c, char *err, size_t errlen) {
    const mp_json *o = mp_json_get(at, "dsa");
    if (!o || mp_json_is_null(o)) return 0;
    if (mp_json_type_of(o) != MP_JSON_OBJECT) FAIL(MP_EFORMAT, "manifest.model: attention.dsa must be null or an object");
    if (!c->q_lora_rank) FAIL(MP_EFORMAT, "manifest.model: attention.dsa needs attention.q_lora_rank");
    mpm_dsa_config *d = &c->dsa;
    const char *a = "attention.dsa.";
    int rc;
    if ((rc = get_int(o, a, "index_n_heads", 1, MAX_HEADS, &d->heads, err, errlen)) ||
        (rc = get_int(o, a, "index_topk", 1, MAX_POS, &d->topk, err, errlen)) ||
        (rc = get_int(o, a, "index_head_dim", c->qk_rope_dim, MAX_HEAD_DIM, &d->dim, err, errlen)))
        return rc;
    if (mp_json_as_bool(mp_json_get(o, "rope_interleave"), &d->rope_interleave) != 0)
        FAIL(MP_EFORMAT, "manifest.model: attention.dsa.rope_interleave must be true or false");
    const mp_json *types = mp_json_get(o, "indexer_types");
    if (mp_json_type_of(types) != MP_JSON_ARRAY || (int64_t)mp_json_len(types) != c->n_layers)
        FAIL(MP_EFORMAT, "manifest.model: attention.dsa.indexer_types must list num_layers entries");
    d->layer_full = calloc((size_t)c->n_layers, 1);
    if (!d->layer_full) FAIL(MP_ENOMEM, "out of memory");
    for (int64_t i = 0; i < c->n_layers; i++) {
        const char *k = mp_json_as_str(mp_json_at(types, (size_t)i), NULL);
        if (k && !strcmp(k, "full")) d->layer_full[i] = 1, d->n_full++;
        else if (!k || strcmp(k, "shared")) FAIL(MP_EFORMAT, "manifest.model: attention.dsa.indexer_types[%lld] must be full or shared", (long long)i);
    }
    if (!d->layer_full[0]) FAIL(MP_EFORMAT, "manifest.model: attention.dsa.indexer_types[0] must be full (a shared layer reuses an earlier full layer's selection)");
    /* GLM-5.3-Flash's k-pools (FORMAT.md 7.2) */
    if ((rc = get_opt_int(o, a, "kpool", 1, d->topk, 0, &d->kpool, err, errlen))) return rc;
    if (d->kpool) {
        if (d->topk % d->kpool) FAIL(MP_EFORMAT, "manifest.model: attention.dsa.kpool must divide index_topk (%lld)", (long long)d->topk);
        int tail;
        if ((rc = get_opt_bool(o, a, "kpool_select_tail", 1, &tail, err, errlen))) return rc;
        if (!tail) FAIL(MP_EUNSUPPORTED, "manifest.model: attention.dsa.kpool_select_tail false is not supported (a query before the first complete pool would attend to no position)");
    }
    d->on = 1;
    return 0;
}

/* glm5_next's indexer_types list linear layers as full; they run no indexer.  A shared layer
 * reuses the selection of the layer right before it, which must be a full DSA layer (the only
 * selection transformers hands on). */
static int glm5_next_indexers(mpm_config *c, char *err, size_t errlen) {
    mpm_dsa_config *d = &c->dsa;
    int prev_full = 0; /* the previous layer ran an indexer */
    d->n_full = 0;
    for (int64_t l = 0; l < c->n_layers; l++) {
        int linear = c->layer_is_linear && c->layer_is_linear[l];
        if (!d->layer_full[l] && (linear || !prev_full))
            FAIL(MP_EFORMAT, "manifest.model: attention.dsa.indexer_types[%lld] must be full: a shared layer must be a DSA layer right after a full DSA layer (glm5_next)", (long long)l);
        if (linear) d->layer_full[l] = 0;
        prev_full = d->layer_full[l];
        d->n_full += d->layer_full[l];
    }
    return 0;
}

/* GLM-5.3-Flash's optional fields (FORMAT.md 7.2): clamped SwiGLU, hyper-connections; which
 * of its layers run an indexer. */
static int parse_glm5_next(const mp_json *m, mpm_config *c, char *err, size_t errlen) {
    const mp_json *lim = mp_json_get(m, "swiglu_limit");
    double d;
    int rc;
    if (lim && !mp_json_is_null(lim)) {
        if (mp_json_as_f64(lim, &d) != 0 || !isfinite(d) || !(d > 0))
            FAIL(MP_EFORMAT, "manifest.model: swiglu_limit must be a finite number > 0");
        c->swiglu_limit = (float)d;
    }
    const mp_json *hc = mp_json_get(m, "hyper_connections");
    if (hc && !mp_json_is_null(hc)) {
        const char *h = "hyper_connections.";
        if (mp_json_type_of(hc) != MP_JSON_OBJECT) FAIL(MP_EFORMAT, "manifest.model: hyper_connections must be null or an object");
        if ((rc = get_int(hc, h, "mult", 1, 16, &c->hc_mult, err, errlen)) ||
            (rc = get_int(hc, h, "sinkhorn_iters", 1, 1000, &c->hc_iters, err, errlen)))
            return rc;
        if (get_num(hc, "eps", NAN, &d) || !(d > 0 && d < 1))
            FAIL(MP_EFORMAT, "manifest.model: hyper_connections.eps must be a finite number in (0, 1)");
        c->hc_eps = (float)d;
    }
    if (c->arch == MPM_GLM5_NEXT && c->dsa.on) return glm5_next_indexers(c, err, errlen);
    return 0;
}

/* Kimi K3's optional fields (FORMAT.md 7.1): activation, attn_res, moe.latent_size, KDA's
 * bounded decay and output gate, MLA's output gate */
static int parse_k3(const mp_json *m, mpm_config *c, char *err, size_t errlen) {
    const mp_json *act = mp_json_get(m, "activation");
    double d;
    int rc;
    if (act && !mp_json_is_null(act)) {
        const char *k = mp_json_as_str(mp_json_get(act, "kind"), NULL);
        if (mp_json_type_of(act) != MP_JSON_OBJECT || !k || (strcmp(k, "silu") && strcmp(k, "situ")))
            FAIL(MP_EFORMAT, "manifest.model: activation.kind must be one of silu, situ");
        if (!strcmp(k, "situ")) {
            if (get_num(act, "beta", NAN, &d) || !(d > 0))
                FAIL(MP_EFORMAT, "manifest.model: activation.beta must be a finite number > 0");
            c->situ_beta = (float)d;
            if (get_num(act, "linear_beta", 0.0, &d) || !(d >= 0))
                FAIL(MP_EFORMAT, "manifest.model: activation.linear_beta must be a finite number >= 0");
            c->situ_lb = (float)d;
        }
    }
    const mp_json *res = mp_json_get(m, "attn_res");
    if (res && !mp_json_is_null(res)) {
        if (mp_json_type_of(res) != MP_JSON_OBJECT) FAIL(MP_EFORMAT, "manifest.model: attn_res must be null or an object");
        if ((rc = get_int(res, "attn_res.", "block_size", 1, c->n_layers, &c->res_block, err, errlen))) return rc;
    }
    if ((rc = get_opt_int(mp_json_get(m, "moe"), "moe.", "latent_size", 8, c->hidden, 0, &c->latent, err, errlen))) return rc;
    const mp_json *la = mp_json_get(m, "linear_attention");
    const mp_json *gb = mp_json_get(la, "gate_lower_bound");
    if (gb && !mp_json_is_null(gb)) {
        if (mp_json_as_f64(gb, &d) != 0 || !isfinite(d) || !(d < 0))
            FAIL(MP_EFORMAT, "manifest.model: linear_attention.gate_lower_bound must be a finite number < 0");
        c->kda_bound = (float)d;
    }
    const mp_json *og = mp_json_get(la, "output_gate");
    if (og && !mp_json_is_null(og)) {
        const char *k = mp_json_as_str(og, NULL);
        if (!k || (strcmp(k, "low_rank") && strcmp(k, "full_rank")))
            FAIL(MP_EFORMAT, "manifest.model: linear_attention.output_gate must be one of low_rank, full_rank");
        c->kda_full_gate = !strcmp(k, "full_rank");
    }
    if (c->mla && (rc = get_opt_bool(mp_json_get(m, "attention"), "attention.", "output_gate", 0, &c->mla_gate, err, errlen))) return rc;
    return 0;
}

int mpm_config_parse(const mp_json *m, mpm_config *c, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    c->bos = -1;
    if (mp_json_type_of(m) != MP_JSON_OBJECT) FAIL(MP_EFORMAT, "manifest.model must be an object");
    const char *arch = mp_json_as_str(mp_json_get(m, "arch"), NULL);
    if (!arch) FAIL(MP_EFORMAT, "manifest.model: arch missing");
    if (!strcmp(arch, "mixtral")) c->arch = MPM_MIXTRAL;
    else if (!strcmp(arch, "qwen3_moe")) c->arch = MPM_QWEN3_MOE;
    else if (!strcmp(arch, "deepseek_v3")) c->arch = MPM_DEEPSEEK_V3;
    else if (!strcmp(arch, "glm4_moe")) c->arch = MPM_GLM4_MOE;
    else if (!strcmp(arch, "minimax_m2")) c->arch = MPM_MINIMAX_M2;
    else if (!strcmp(arch, "kimi_k25")) c->arch = MPM_KIMI_K25;
    else if (!strcmp(arch, "qwen3_next")) c->arch = MPM_QWEN3_NEXT;
    else if (!strcmp(arch, "qwen3_5_moe")) c->arch = MPM_QWEN3_5_MOE;
    else if (!strcmp(arch, "deepseek_v32")) c->arch = MPM_DEEPSEEK_V32;
    else if (!strcmp(arch, "glm_moe_dsa")) c->arch = MPM_GLM_MOE_DSA;
    else if (!strcmp(arch, "kimi_linear")) c->arch = MPM_KIMI_LINEAR;
    else if (!strcmp(arch, "kimi_k3")) c->arch = MPM_KIMI_K3;
    else if (!strcmp(arch, "glm5_next")) c->arch = MPM_GLM5_NEXT;
    else FAIL(MP_EUNSUPPORTED, "architecture %s is not supported (mixtral, qwen3_moe, deepseek_v3, glm4_moe, minimax_m2, kimi_k25, qwen3_next, qwen3_5_moe, kimi_linear, deepseek_v32, glm_moe_dsa, kimi_k3, glm5_next)", arch);
    int rc;
#define INT(key, lo, hi, dst) if ((rc = get_int(m, "", key, lo, hi, &c->dst, err, errlen))) return rc
    INT("vocab_size", 1, MAX_VOCAB, vocab);
    INT("hidden_size", 8, MAX_HIDDEN, hidden);
    INT("num_layers", 1, MAX_LAYERS, n_layers);
    INT("num_attention_heads", 1, MAX_HEADS, n_heads);
    INT("num_key_value_heads", 1, MAX_HEADS, n_kv_heads);
    INT("head_dim", 2, MAX_HEAD_DIM, head_dim);
    INT("max_position_embeddings", 1, MAX_POS, max_pos);
    if (c->n_heads % c->n_kv_heads) FAIL(MP_EFORMAT, "manifest.model: num_attention_heads must be a multiple of num_key_value_heads");
    if (c->head_dim % 2) FAIL(MP_EFORMAT, "manifest.model: head_dim must be even");
    double d;
    if (get_num(m, "rms_norm_eps", 1e-6, &d) || !(d > 0 && d < 1)) FAIL(MP_EFORMAT, "manifest.model: rms_norm_eps must be a finite number in (0, 1)");
    c->eps = (float)d;
    if (get_num(m, "rope_theta", 10000.0, &c->rope_theta) || !(c->rope_theta > 1.0)) FAIL(MP_EFORMAT, "manifest.model: rope_theta must be a finite number > 1");
    c->tie_embeddings = get_bool(m, "tie_word_embeddings", 0);
    c->qk_norm = get_bool(m, "qk_norm", 0);
    if ((rc = get_opt_bool(m, "", "rms_norm_unit_offset", 0, &c->norm_offset, err, errlen))) return rc;

    if ((rc = parse_rope_scaling(m, c, err, errlen))) return rc;
    const mp_json *at = mp_json_get(m, "attention");
    const char *kind = mp_json_as_str(mp_json_get(at, "kind"), NULL);
    if (!kind) FAIL(MP_EFORMAT, "manifest.model: attention.kind must be gqa or mla");
    if (!strcmp(kind, "mla")) {
        c->mla = 1;
        const char *a = "attention.";
        if ((rc = get_opt_int(at, a, "q_lora_rank", 1, MAX_LORA, 0, &c->q_lora_rank, err, errlen)) ||
            (rc = get_int(at, a, "kv_lora_rank", 1, MAX_LORA, &c->kv_lora_rank, err, errlen)) ||
            (rc = get_int(at, a, "qk_nope_head_dim", 1, MAX_HEAD_DIM, &c->qk_nope_dim, err, errlen)) ||
            (rc = get_int(at, a, "qk_rope_head_dim", c->arch == MPM_GLM5_NEXT ? 0 : 2, MAX_ROPE_DIM, &c->qk_rope_dim, err, errlen)) ||
            (rc = get_int(at, a, "v_head_dim", 1, MAX_HEAD_DIM, &c->v_head_dim, err, errlen)))
            return rc;
        if (c->qk_rope_dim % 2) FAIL(MP_EFORMAT, "manifest.model: attention.qk_rope_head_dim must be even");
        int rope;
        if ((rc = get_opt_bool(at, "attention.", "rope", 1, &rope, err, errlen))) return rc;
        c->mla_no_rope = !rope;
        if (get_num(at, "latent_norm_eps", (double)c->eps, &d) || !(d > 0 && d < 1))
            FAIL(MP_EFORMAT, "manifest.model: attention.latent_norm_eps must be a finite number in (0, 1)");
        c->latent_eps = (float)d;
        if ((rc = get_opt_bool(at, "attention.", "rope_interleave", 1, &c->rope_interleave, err, errlen))) return rc;
        if ((rc = parse_dsa(at, c, err, errlen))) return rc;
    } else if (!strcmp(kind, "gqa")) {
        const char *a = "attention.";
        if ((rc = get_opt_int(at, a, "rotary_dim", 2, c->head_dim, c->head_dim, &c->rotary_dim, err, errlen)) ||
            (rc = get_opt_bool(at, a, "qkv_bias", 0, &c->qkv_bias, err, errlen)) ||
            (rc = get_opt_bool(at, a, "output_gate", 0, &c->attn_gate, err, errlen)) ||
            (rc = get_opt_int(at, a, "sliding_window", 1, INT64_MAX, 0, &c->sliding_window, err, errlen)))
            return rc;
        if (c->rotary_dim % 2) FAIL(MP_EFORMAT, "manifest.model: attention.rotary_dim must be even (rotary pairs)");
        const mp_json *sc = mp_json_get(at, "qk_norm_scope");
        if (sc && !mp_json_is_null(sc)) {
            const char *s = mp_json_as_str(sc, NULL);
            if (!s || (strcmp(s, "head") && strcmp(s, "all_heads")))
                FAIL(MP_EFORMAT, "manifest.model: attention.qk_norm_scope must be one of head, all_heads");
            c->qk_norm_full = !strcmp(s, "all_heads");
        }
    } else {
        FAIL(MP_EUNSUPPORTED, "manifest.model: attention.kind %s is not supported (gqa, mla)", kind);
    }

    const mp_json *lk = mp_json_get(m, "layer_kinds");
    if (mp_json_type_of(lk) != MP_JSON_ARRAY || (int64_t)mp_json_len(lk) != c->n_layers)
        FAIL(MP_EFORMAT, "manifest.model: layer_kinds must list num_layers kinds");
    c->layer_is_moe = calloc((size_t)c->n_layers, 1);
    if (!c->layer_is_moe) FAIL(MP_ENOMEM, "out of memory");
    int any_dense = 0;
    for (int64_t i = 0; i < c->n_layers; i++) {
        const char *k = mp_json_as_str(mp_json_at(lk, (size_t)i), NULL);
        if (k && !strcmp(k, "moe")) c->layer_is_moe[i] = 1;
        else if (k && !strcmp(k, "dense")) any_dense = 1;
        else FAIL(MP_EFORMAT, "manifest.model: layer_kinds[%lld] must be moe or dense", (long long)i);
    }
    if (any_dense && (rc = get_int(m, "", "dense_intermediate_size", 1, MAX_INTER, &c->dense_inter, err, errlen))) return rc;
    if ((rc = parse_linear(m, c, err, errlen))) return rc;

    const mp_json *moe = mp_json_get(m, "moe");
    if (mp_json_type_of(moe) != MP_JSON_OBJECT) FAIL(MP_EFORMAT, "manifest.model: moe must be an object");
    const char *mo = "moe.";
    if ((rc = get_int(moe, mo, "num_experts", 1, MAX_EXPERTS, &c->n_experts, err, errlen))) return rc;
    int64_t n_moe = mpm_config_moe_layers(c);
    if (n_moe * c->n_experts > MAX_TOTAL_EXPERTS)
        FAIL(MP_EFORMAT, "manifest.model: moe.num_experts: %lld experts x %lld MoE layers exceeds %lld experts in all",
             (long long)c->n_experts, (long long)n_moe, (long long)MAX_TOTAL_EXPERTS);
    if ((rc = get_int(moe, mo, "top_k", 1, c->n_experts, &c->top_k, err, errlen)) ||
        (rc = get_int(moe, mo, "moe_intermediate_size", 1, MAX_INTER, &c->moe_inter, err, errlen)) ||
        (rc = get_opt_int(moe, mo, "n_group", 1, MPM_MAX_GROUPS, 1, &c->n_group, err, errlen)) ||
        (rc = get_opt_int(moe, mo, "topk_group", 1, c->n_group, 1, &c->topk_group, err, errlen)) ||
        (rc = get_opt_int(moe, mo, "num_shared_experts", 0, MAX_SHARED, 0, &c->n_shared, err, errlen)))
        return rc;
    if (c->n_experts % c->n_group) FAIL(MP_EFORMAT, "manifest.model: moe.n_group must divide num_experts");
    /* group-limited routing must leave at least top_k experts to pick from */
    if (c->n_group > 1 && c->top_k > c->topk_group * (c->n_experts / c->n_group))
        FAIL(MP_EFORMAT, "manifest.model: moe.top_k exceeds the experts that topk_group groups hold");
    if (c->n_shared && (rc = get_int(moe, mo, "shared_intermediate_size", 1, MAX_INTER, &c->shared_inter, err, errlen))) return rc;
    if ((rc = get_opt_bool(moe, mo, "shared_expert_gate", 0, &c->shared_gate, err, errlen))) return rc;
    if (c->shared_gate && !c->n_shared) FAIL(MP_EFORMAT, "manifest.model: moe.shared_expert_gate needs num_shared_experts >= 1");
    const char *sc = mp_json_as_str(mp_json_get(moe, "scoring"), NULL);
    if (!sc || (strcmp(sc, "softmax") && strcmp(sc, "sigmoid"))) FAIL(MP_EUNSUPPORTED, "manifest.model: moe.scoring must be softmax or sigmoid");
    c->sigmoid = !strcmp(sc, "sigmoid");
    c->norm_topk = get_bool(moe, "norm_topk_prob", 1);
    if (get_num(moe, "routed_scaling_factor", 1.0, &d) || !(d > 0))
        FAIL(MP_EFORMAT, "manifest.model: moe.routed_scaling_factor must be a finite number > 0");
    c->routed_scale = (float)d;
    if ((rc = parse_k3(m, c, err, errlen))) return rc;
    if ((rc = parse_glm5_next(m, c, err, errlen))) return rc;

    int64_t v;
    const mp_json *b = mp_json_get(m, "bos_token_id");
    if (mp_json_as_i64(b, &v) == 0 && v >= 0 && v < c->vocab) c->bos = (int32_t)v;
    const mp_json *e = mp_json_get(m, "eos_token_id");
    if (mp_json_type_of(e) == MP_JSON_ARRAY) {
        for (size_t i = 0; i < mp_json_len(e) && c->n_eos < MPM_MAX_EOS; i++)
            if (mp_json_as_i64(mp_json_at(e, i), &v) == 0 && v >= 0 && v < c->vocab) c->eos[c->n_eos++] = (int32_t)v;
    } else if (mp_json_as_i64(e, &v) == 0 && v >= 0 && v < c->vocab) {
        c->eos[c->n_eos++] = (int32_t)v;
    }
    return 0;
#undef INT
}

void mpm_config_free(mpm_config *c) {
    free(c->layer_is_moe);
    c->layer_is_moe = NULL;
    free(c->layer_is_linear);
    c->layer_is_linear = NULL;
    free(c->dsa.layer_full);
    c->dsa.layer_full = NULL;
}

int mpm_config_moe_layers(const mpm_config *c) {
    int n = 0;
    for (int64_t i = 0; i < c->n_layers; i++) n += c->layer_is_moe[i];
    return n;
}
