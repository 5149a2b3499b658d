/* The KV cache and attention over it.
 *
 * Entries are f32, or IEEE f16 when c.kv_f16 (mp_config.kv): written once per token with
 * mpk_f32_to_f16 (round to nearest even), read back exactly (f16 -> f32 is exact), so f16 only
 * changes what is stored, never how it is summed.
 *
 * Attention for one token is split into tasks fixed by the model and the number of positions,
 * never by the thread count: scores per (head group, block of positions), softmax per head,
 * weighted values per (head group, slice of value columns), each output element summed over
 * positions in increasing order.  Every number is computed by one task in one fixed order, so
 * the result is the same bits for any thread count (and the same as one head at a time). */
#include "model_internal.h"
#include "moepack.h"

#include <stdlib.h>
#include <string.h>

#define ATT_MAX_BLOCKS 32 /* position blocks per head group */
#define ATT_MIN_BLOCK 128 /* positions per block at least (short contexts: one block) */
#define ATT_SLICE 64      /* value columns per output task */
#define ATT_MLA_GROUP 16  /* MLA heads per task: all heads share each latent row */
#define ATT_INLINE 2048   /* heads x positions below which the pool is not worth waking */

static size_t elt(const mpm_config *c) { return c->kv_f16 ? 2u : 4u; }

/* columns of one cached position: GQA keys (values alike), MLA latent + rope part */
static int64_t row_width(const mpm_config *c) {
    return c->mla ? c->kv_lora_rank + c->qk_rope_dim : c->n_kv_heads * c->head_dim;
}

static int64_t kv_slots(const mpm_config *c) { return c->n_layers - c->n_linear; }

/* Head groups of a layer's attention: GQA one per KV head, MLA ATT_MLA_GROUP heads each. */
static int64_t head_groups(const mpm_config *c) {
    return c->mla ? (c->n_heads + ATT_MLA_GROUP - 1) / ATT_MLA_GROUP : c->n_kv_heads;
}

uint64_t mpm_kv_bytes(const mpm_config *c, int ctx) {
    uint64_t per = (uint64_t)row_width(c) * (c->mla ? 1u : 2u); /* MLA: one latent row */
    return per * (uint64_t)kv_slots(c) * (uint64_t)ctx * elt(c) /* linear layers: no KV */
           + mpm_dsa_cache_bytes(c, ctx);                      /* DSA indexer keys (same type) */
}

int mpm_kv_alloc(mpm_model *m) {
    const mpm_config *c = &m->c;
    uint64_t one = (uint64_t)row_width(c) * (uint64_t)kv_slots(c) * (uint64_t)m->ctx;
    m->kc = calloc(one ? (size_t)one : 1, elt(c));
    m->vc = c->mla ? m->kc : calloc(one ? (size_t)one : 1, elt(c));
    return !m->kc || !m->vc ? -1 : 0;
}

void mpm_kv_free(mpm_model *m) {
    if (m->vc != m->kc) free(m->vc);
    free(m->kc);
    m->kc = m->vc = NULL;
}

void *mpm_kv_row(const mpm_model *m, void *cache, int slot, int64_t pos) {
    size_t at = ((size_t)slot * (size_t)m->ctx + (size_t)pos) * (size_t)row_width(&m->c);
    return (char *)cache + at * elt(&m->c);
}

void mpm_kv_put(const mpm_model *m, void *dst, const float *src, int64_t n) {
    if (!m->c.kv_f16) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint8_t *h = dst; /* little-endian, as mpk_f16_to_f32_n reads it */
    for (int64_t i = 0; i < n; i++) {
        uint16_t v = mpk_f32_to_f16(src[i]);
        h[2 * i] = (uint8_t)v, h[2 * i + 1] = (uint8_t)(v >> 8);
    }
}

typedef struct {
    mpm_model *m;
    const mpm_attn_span *a;
    size_t row;          /* bytes per cached position */
    int64_t groups, hg;  /* head groups, heads per group */
    int64_t blk, nblk;   /* positions per scores task, blocks */
    int64_t nslice;      /* value slices per group */
} attend_job;

static void group_heads(const attend_job *j, int64_t g, int64_t *h0, int64_t *h1) {
    *h0 = g * j->hg;
    *h1 = *h0 + j->hg < j->a->heads ? *h0 + j->hg : j->a->heads;
}

#define ATT_KEYS 16 /* keys per mpk_dots_keys call (their scores stored a row at a time) */

/* Scores of one head group against one block of positions, ATT_KEYS keys a kernel call: each
 * score is mpk_dots' (f16 keys: mpk_dots_f16's) bits, times the scale */
static void scores_task(void *ctx, size_t task) {
    const attend_job *j = ctx;
    const mpm_attn_span *a = j->a;
    const mpm_config *c = &j->m->c;
    int64_t g = (int64_t)task / j->nblk, b = (int64_t)task % j->nblk, h0, h1;
    group_heads(j, g, &h0, &h1);
    int64_t t1 = (b + 1) * j->blk < a->n ? (b + 1) * j->blk : a->n;
    const size_t es = elt(c);
    const char *K = (const char *)a->K + (size_t)(g * a->goff) * es;
    float s[ATT_KEYS][64], s2[ATT_KEYS][64]; /* a block of heads' scores for a block of keys */
    const size_t kb = (size_t)(a->kd + a->kd2) * es; /* this group's bytes of a key row */
    for (int64_t t = b * j->blk; t < t1; t += ATT_KEYS) {
        const int nk = (int)(t1 - t < ATT_KEYS ? t1 - t : ATT_KEYS);
        const char *k = K + (size_t)t * j->row;
        for (int i = 0; i < nk; i++)
            if (t + i + MPK_ROWS_AHEAD < t1)
                for (size_t o = 0; o < kb; o += 64) __builtin_prefetch(k + (size_t)(i + MPK_ROWS_AHEAD) * j->row + o, 0, 2);
        for (int64_t hb = h0; hb < h1; hb += 64) { /* the group's heads against these keys at once */
            const int nh = (int)(h1 - hb < 64 ? h1 - hb : 64);
            const float *q = a->q + hb * a->qs;
            mpk_dots_keys(k, j->row, nk, c->kv_f16, q, a->qs, nh, a->kd, s[0], 64);
            if (a->kd2) mpk_dots_keys(k + (size_t)a->kd * es, j->row, nk, c->kv_f16, q + a->kd, a->qs, nh, a->kd2, s2[0], 64);
            for (int i = 0; i < nh; i++) {
                float *row = j->m->scores + (size_t)(hb + i) * (size_t)j->m->ctx + (size_t)t;
                for (int p = 0; p < nk; p++) row[p] = (a->kd2 ? s[p][i] + s2[p][i] : s[p][i]) * a->scale;
            }
        }
    }
}

static void softmax_task(void *ctx, size_t h) {
    const attend_job *j = ctx;
    mpk_softmax(j->m->scores + h * (size_t)j->m->ctx, j->a->n);
}

/* out[h][c0 .. c0+cw) = sum over t of p[h][t] v[t][..], t increasing (mpk_axpy's order) */
static void values_task(void *ctx, size_t task) {
    const attend_job *j = ctx;
    const mpm_attn_span *a = j->a;
    const mpm_config *c = &j->m->c;
    int64_t g = (int64_t)task / j->nslice, c0 = (int64_t)task % j->nslice * ATT_SLICE, h0, h1;
    int64_t cw = a->vw - c0 < ATT_SLICE ? a->vw - c0 : ATT_SLICE;
    group_heads(j, g, &h0, &h1);
    const char *V = (const char *)a->V + (size_t)(g * a->goff + c0) * elt(c);
    /* out = sum over positions of score x value row, in position order (mpk_axpy's bits) */
    mpk_wsum(a->out + h0 * a->os + c0, a->os, (int)(h1 - h0), j->m->scores + (size_t)h0 * (size_t)j->m->ctx,
             (int64_t)j->m->ctx, V, j->row, c->kv_f16, a->n, cw);
}

void mpm_attend(mpm_model *m, const mpm_attn_span *a) {
    const mpm_config *c = &m->c;
    attend_job j = {m, a, (size_t)row_width(c) * elt(c), head_groups(c), 0, 0, 0, 0};
    j.hg = c->mla ? ATT_MLA_GROUP : c->n_heads / c->n_kv_heads;
    j.blk = (a->n + ATT_MAX_BLOCKS - 1) / ATT_MAX_BLOCKS;
    if (j.blk < ATT_MIN_BLOCK) j.blk = ATT_MIN_BLOCK;
    j.nblk = (a->n + j.blk - 1) / j.blk;
    j.nslice = (a->vw + ATT_SLICE - 1) / ATT_SLICE;
    mpk_pool *pool = a->heads * a->n < ATT_INLINE ? NULL : m->pool; /* same bits either way */
    mpk_pool_run(pool, (size_t)(j.groups * j.nblk), scores_task, &j);
    mpk_pool_run(pool, (size_t)a->heads, softmax_task, &j);
    mpk_pool_run(pool, (size_t)(j.groups * j.nslice), values_task, &j);
}

/* mpk_f32_to_f16 over an array, exported so that tests compare the cache's rounding with numpy's
 * astype(float16) bit for bit */
MP_API void mp_f32_to_f16(const float *in, uint16_t *out, size_t n);
void mp_f32_to_f16(const float *in, uint16_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = mpk_f32_to_f16(in[i]);
}
