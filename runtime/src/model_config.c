/* manifest.model (FORMAT.md §7) -> mpm_config, with range checks so that the forward pass can
 * trust every size (products are checked to stay far below 2^62). */
#include "model.h"
#include "moepack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(code, ...)                                                                        \
    do {                                                                                       \
        snprintf(err, errlen, __VA_ARGS__);                                                    \
        return code;                                                                           \
    } while (0)

static int get_int(const mp_json *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   char *err, size_t errlen) {
    const mp_json *v = mp_json_get(o, key);
    if (mp_json_as_i64(v, out) != 0 || *out < lo || *out > hi)
        FAIL(MP_EFORMAT, "manifest.model: %s must be an integer in %lld..%lld", key,
             (long long)lo, (long long)hi);
    return 0;
}

static int get_opt_int(const mp_json *o, const char *key, int64_t lo, int64_t hi, int64_t dflt,
                       int64_t *out, char *err, size_t errlen) {
    const mp_json *v = mp_json_get(o, key);
    if (!v || mp_json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    return get_int(o, key, lo, hi, out, err, errlen);
}

static int get_num(const mp_json *o, const char *key, double dflt, double *out) {
    const mp_json *v = mp_json_get(o, key);
    if (!v || mp_json_is_null(v)) {
        *out = dflt;
        return 0;
    }
    return mp_json_as_f64(v, out);
}

static int get_bool(const mp_json *o, const char *key, int dflt) {
    int b;
    return mp_json_as_bool(mp_json_get(o, key), &b) == 0 ? b : dflt;
}

#define BIG (INT64_C(1) << 24) /* any single dimension */

int mpm_config_parse(const mp_json *m, const mp_json *src, mpm_config *c, char *err,
                     size_t errlen) {
    memset(c, 0, sizeof *c);
    c->bos = -1;
    if (mp_json_type_of(m) != MP_JSON_OBJECT) FAIL(MP_EFORMAT, "manifest.model must be an object");
    const char *arch = mp_json_as_str(mp_json_get(m, "arch"), NULL);
    if (!arch) FAIL(MP_EFORMAT, "manifest.model: arch missing");
    if (!strcmp(arch, "mixtral")) c->arch = MPM_MIXTRAL;
    else if (!strcmp(arch, "qwen3_moe")) c->arch = MPM_QWEN3_MOE;
    else if (!strcmp(arch, "deepseek_v3")) c->arch = MPM_DEEPSEEK_V3;
    else FAIL(MP_EUNSUPPORTED, "architecture %s is not supported (mixtral, qwen3_moe, deepseek_v3)", arch);
    int rc;
#define INT(key, lo, hi, dst) if ((rc = get_int(m, key, lo, hi, &c->dst, err, errlen))) return rc
    INT("vocab_size", 1, BIG * 64, vocab);
    INT("hidden_size", 8, BIG, hidden);
    INT("num_layers", 1, 100000, n_layers);
    INT("num_attention_heads", 1, 65536, n_heads);
    INT("num_key_value_heads", 1, 65536, n_kv_heads);
    INT("head_dim", 2, 65536, head_dim);
    INT("max_position_embeddings", 1, BIG * 64, max_pos);
    if (c->n_heads % c->n_kv_heads) FAIL(MP_EFORMAT, "manifest.model: num_attention_heads not a multiple of num_key_value_heads");
    if (c->head_dim % 2) FAIL(MP_EFORMAT, "manifest.model: head_dim must be even");
    double d;
    if (get_num(m, "rms_norm_eps", 1e-6, &d) || !(d > 0 && d < 1)) FAIL(MP_EFORMAT, "manifest.model: bad rms_norm_eps");
    c->eps = (float)d;
    if (get_num(m, "rope_theta", 10000.0, &c->rope_theta) || !(c->rope_theta > 1.0)) FAIL(MP_EFORMAT, "manifest.model: bad rope_theta");
    c->tie_embeddings = get_bool(m, "tie_word_embeddings", 0);
    c->qk_norm = get_bool(m, "qk_norm", 0);

    const mp_json *rs = mp_json_get(m, "rope_scaling");
    if (rs && !mp_json_is_null(rs)) {
        const char *t = mp_json_as_str(mp_json_get(rs, "rope_type"), NULL);
        if (!t) t = mp_json_as_str(mp_json_get(rs, "type"), NULL);
        if (!t || strcmp(t, "default") == 0) {
            /* nothing */
        } else if (!strcmp(t, "yarn")) {
            c->yarn = 1;
            int64_t omp;
            if (get_num(rs, "factor", 1.0, &c->yarn_factor) || get_num(rs, "beta_fast", 32.0, &c->yarn_beta_fast) ||
                get_num(rs, "beta_slow", 1.0, &c->yarn_beta_slow) || get_num(rs, "mscale", 0.0, &c->yarn_mscale) ||
                get_num(rs, "mscale_all_dim", 0.0, &c->yarn_mscale_all_dim) ||
                get_num(rs, "attention_factor", 0.0, &c->yarn_attn_factor))
                FAIL(MP_EFORMAT, "manifest.model: bad rope_scaling number");
            if ((rc = get_opt_int(rs, "original_max_position_embeddings", 1, BIG * 64, c->max_pos, &omp, err, errlen))) return rc;
            c->yarn_orig_max_pos = omp;
        } else {
            FAIL(MP_EUNSUPPORTED, "rope_scaling type %s is not supported (yarn)", t);
        }
    }
    c->rope_interleave = c->arch == MPM_DEEPSEEK_V3 ? get_bool(src, "rope_interleave", 1) : 0;
    /* sliding-window attention lives only in the source config (not in manifest.model) */
    if (c->arch == MPM_MIXTRAL &&
        (rc = get_opt_int(src, "sliding_window", 1, INT64_MAX, 0, &c->sliding_window, err, errlen)))
        return rc;
    if (c->arch == MPM_QWEN3_MOE && get_bool(src, "use_sliding_window", 0))
        FAIL(MP_EUNSUPPORTED, "qwen3_moe with use_sliding_window is not supported");

    const mp_json *at = mp_json_get(m, "attention");
    const char *kind = mp_json_as_str(mp_json_get(at, "kind"), NULL);
    if (!kind) FAIL(MP_EFORMAT, "manifest.model: attention.kind missing");
    if (!strcmp(kind, "mla")) {
        c->mla = 1;
        if ((rc = get_opt_int(at, "q_lora_rank", 1, BIG, 0, &c->q_lora_rank, err, errlen)) ||
            (rc = get_int(at, "kv_lora_rank", 1, BIG, &c->kv_lora_rank, err, errlen)) ||
            (rc = get_int(at, "qk_nope_head_dim", 1, 65536, &c->qk_nope_dim, err, errlen)) ||
            (rc = get_int(at, "qk_rope_head_dim", 2, 65536, &c->qk_rope_dim, err, errlen)) ||
            (rc = get_int(at, "v_head_dim", 1, 65536, &c->v_head_dim, err, errlen)))
            return rc;
        if (c->qk_rope_dim % 2 || c->qk_rope_dim > 1024) FAIL(MP_EFORMAT, "manifest.model: qk_rope_head_dim must be even and <= 1024");
    } else if (strcmp(kind, "gqa")) {
        FAIL(MP_EUNSUPPORTED, "attention kind %s is not supported (gqa, mla)", kind);
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
    if (any_dense && (rc = get_int(m, "dense_intermediate_size", 1, BIG, &c->dense_inter, err, errlen))) return rc;

    const mp_json *moe = mp_json_get(m, "moe");
    if (mp_json_type_of(moe) != MP_JSON_OBJECT) FAIL(MP_EFORMAT, "manifest.model: moe missing");
    if ((rc = get_int(moe, "num_experts", 1, 65536, &c->n_experts, err, errlen)) ||
        (rc = get_int(moe, "top_k", 1, c->n_experts, &c->top_k, err, errlen)) ||
        (rc = get_int(moe, "moe_intermediate_size", 1, BIG, &c->moe_inter, err, errlen)) ||
        (rc = get_opt_int(moe, "n_group", 1, MPM_MAX_GROUPS, 1, &c->n_group, err, errlen)) ||
        (rc = get_opt_int(moe, "topk_group", 1, c->n_group, 1, &c->topk_group, err, errlen)) ||
        (rc = get_opt_int(moe, "num_shared_experts", 0, 1024, 0, &c->n_shared, err, errlen)))
        return rc;
    if (c->n_experts % c->n_group) FAIL(MP_EFORMAT, "manifest.model: num_experts not a multiple of n_group");
    if (c->n_shared && (rc = get_int(moe, "shared_intermediate_size", 1, BIG, &c->shared_inter, err, errlen))) return rc;
    const char *sc = mp_json_as_str(mp_json_get(moe, "scoring"), NULL);
    if (!sc || (strcmp(sc, "softmax") && strcmp(sc, "sigmoid"))) FAIL(MP_EUNSUPPORTED, "moe.scoring must be softmax or sigmoid");
    c->sigmoid = !strcmp(sc, "sigmoid");
    c->norm_topk = get_bool(moe, "norm_topk_prob", 1);
    if (get_num(moe, "routed_scaling_factor", 1.0, &d)) FAIL(MP_EFORMAT, "manifest.model: bad routed_scaling_factor");
    c->routed_scale = (float)d;

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
}

int mpm_config_moe_layers(const mpm_config *c) {
    int n = 0;
    for (int64_t i = 0; i < c->n_layers; i++) n += c->layer_is_moe[i];
    return n;
}
