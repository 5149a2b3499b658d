/* DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the lightning indexer picks, per query token,
 * the index_topk past positions its MLA heads attend to (FORMAT.md §7 `attention.dsa`).
 *
 * Per full layer and token: indexer queries from the q LoRA latent (idx_q), one indexer key from
 * the layer input (idx_k, LayerNorm with bias), both rotated on their first qk_rope_head_dim dims
 * (half-split or interleaved); score of a past position s = Σ_h w_h · relu(q_h·k_s / √dim) with
 * w = idx_weights·x / √heads.  The keys are cached per position (one vector per token per full
 * layer), in the KV cache's entry type: f16 (kv_f16, rounded by mpk_f32_to_f16 as the KV entries)
 * are read back exactly as f32 for the same dot products, so threads and chunking still give
 * the same bits; only the stored keys differ from f32.  Shared layers reuse the latest full layer's selection for the same tokens.  While
 * pos + 1 <= index_topk every position is selected and the layer is dense MLA, bit for bit.
 *
 * k-pool (GLM-5.3-Flash, FORMAT.md 7.2, kpool > 0): gate scores idx_pool_gate·x are cached per
 * position beside the keys (same entry type).  When a token completes pool j (positions
 * j·kpool .. j·kpool+kpool-1), the pool's key (per dim, the softmax over the pool of gate score
 * + idx_pool_ape weighting the cached keys) is built from the cache entries and stored over the
 * key of the pool's last position, which nothing reads again: every cache stays indexed by
 * position, so truncation, snapshots and failed calls behave as the KV cache does.  A query
 * scores the complete pools ending at or before it, keeps the index_topk / kpool best (ties:
 * lower pool) and attends to their positions plus the incomplete tail; while no more pools
 * than that are complete, every position is selected (dense, bit for bit). */
#include "io.h"
#include "model_internal.h"
#include "moepack.h"
#include "seterr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSA_LN_EPS 1e-6 /* the indexer key LayerNorm's eps (fixed in both reference models) */
#define DSA_BLOCK 64    /* positions per scoring task */
#define DSA_MAX_DIM 4096 /* index_head_dim's bound (model_config.c MAX_HEAD_DIM): one f16 key row
                          * read back as f32 on a scoring task's stack */

int mpm_dsa_load(mpm_model *m, void *L, int l) {
    const mpm_config *c = &m->c;
    const mpm_dsa_config *d = &c->dsa;
    mpm_layer *ly = &m->layers[l];
    ly->idx_slot = -1;
    if (!d->layer_full[l]) return 0;
    int slot = 0;
    for (int i = 0; i < l; i++) slot += d->layer_full[i];
    ly->idx_slot = slot;
    char n[160];
    int rc;
#define NAME(s) snprintf(n, sizeof n, "layers.%d.attn.%s", l, s)
    NAME("idx_q");
    if ((rc = mpm_load_mat(L, n, d->heads * d->dim, c->q_lora_rank, &ly->idx_q))) return rc;
    NAME("idx_k");
    if ((rc = mpm_load_mat(L, n, d->dim, c->hidden, &ly->idx_k))) return rc;
    NAME("idx_k_norm");
    if ((rc = mpm_load_f32(L, n, (uint64_t)d->dim, &ly->idx_kn_w))) return rc;
    NAME("idx_k_norm_bias");
    if ((rc = mpm_load_f32(L, n, (uint64_t)d->dim, &ly->idx_kn_b))) return rc;
    NAME("idx_weights");
    if ((rc = mpm_load_mat(L, n, d->heads, c->hidden, &ly->idx_w)) || !d->kpool) return rc;
    NAME("idx_pool_ape");
    if ((rc = mpm_load_f32(L, n, (uint64_t)(d->kpool * d->dim), &ly->idx_ape))) return rc;
    NAME("idx_pool_gate");
    return mpm_load_mat(L, n, d->dim, c->hidden, &ly->idx_pg);
#undef NAME
}

/* positions per candidate: 1, or the pool size */
static int64_t pool_of(const mpm_dsa_config *d) { return d->kpool ? d->kpool : 1; }

/* selections hold at most min(index_topk (+ the k-pool tail), ctx) positions */
static int64_t kept(const mpm_dsa_config *d, int64_t ctx) {
    int64_t k = d->topk + pool_of(d) - 1;
    return k < ctx ? k : ctx;
}

static size_t key_elt(const mpm_config *c) { return c->kv_f16 ? 2u : 4u; }

/* one [ctx][dim] cache per full layer: the keys, and with k-pools the gate scores */
uint64_t mpm_dsa_cache_bytes(const mpm_config *c, int ctx) {
    if (!c->dsa.on) return 0;
    return (c->dsa.kpool ? 2u : 1u) * (uint64_t)c->dsa.n_full * (uint64_t)ctx *
           (uint64_t)c->dsa.dim * key_elt(c);
}

uint64_t mpm_dsa_scratch_bytes(const mpm_config *c, int chunk) {
    const mpm_dsa_config *d = &c->dsa;
    if (!d->on) return 0;
    /* per chunk token: queries, key, gate scores (k-pool), head weights, selection and its
     * count; per full layer the f32 LayerNorm weight and bias and the pool position embedding
     * (k-pool); one pool key; the selected latent rows of one token (f32 at most); the scores
     * reuse the attention's [heads][ctx] buffer */
    int64_t k = kept(d, c->max_pos), gate = d->kpool ? d->dim : 0;
    uint64_t per_tok = (uint64_t)(d->heads * d->dim + d->dim + gate + d->heads + k + 1);
    return 4u * ((uint64_t)chunk * per_tok + (uint64_t)(d->n_full * d->dim) * (2u + (uint64_t)d->kpool) +
                 (uint64_t)gate + (uint64_t)(k * (c->kv_lora_rank + c->qk_rope_dim)));
}

int mpm_dsa_alloc(mpm_model *m) {
    const mpm_dsa_config *d = &m->c.dsa;
    if (d->dim > DSA_MAX_DIM) return MP_EINVAL;
    m->dsa_kc = calloc((size_t)d->n_full * (size_t)m->ctx * (size_t)d->dim + 1, key_elt(&m->c));
    m->dsa_rows = calloc((size_t)kept(d, m->ctx), (size_t)(m->c.kv_lora_rank + m->c.qk_rope_dim) * 4u);
    if (d->kpool) {
        m->dsa_gc = calloc((size_t)d->n_full * (size_t)m->ctx * (size_t)d->dim + 1, key_elt(&m->c));
        m->dsa_pk = calloc((size_t)d->dim, sizeof(float));
        if (!m->dsa_gc || !m->dsa_pk) return MP_ENOMEM;
    }
    return m->dsa_kc && m->dsa_rows ? 0 : MP_ENOMEM;
}

int mpm_dsa_chunk_alloc(mpm_model *m) {
    const mpm_dsa_config *d = &m->c.dsa;
    const size_t T = (size_t)m->chunk;
    m->dsa_q = mp_aligned_calloc(T * (size_t)(d->heads * d->dim), sizeof(float));
    m->dsa_k = mp_aligned_calloc(T * (size_t)d->dim, sizeof(float));
    m->dsa_w = mp_aligned_calloc(T * (size_t)d->heads, sizeof(float));
    m->dsa_sel = mp_aligned_calloc(T * (size_t)kept(d, m->ctx), sizeof(int32_t));
    m->dsa_n = mp_aligned_calloc(T, sizeof(int32_t));
    if (d->kpool && !(m->dsa_g = mp_aligned_calloc(T * (size_t)d->dim, sizeof(float)))) return MP_ENOMEM;
    return m->dsa_q && m->dsa_k && m->dsa_w && m->dsa_sel && m->dsa_n ? 0 : MP_ENOMEM;
}

void mpm_dsa_chunk_free(mpm_model *m) {
    mp_aligned_free(m->dsa_q);
    mp_aligned_free(m->dsa_k);
    mp_aligned_free(m->dsa_g);
    mp_aligned_free(m->dsa_w);
    mp_aligned_free(m->dsa_sel);
    mp_aligned_free(m->dsa_n);
    m->dsa_q = m->dsa_k = m->dsa_g = m->dsa_w = NULL;
    m->dsa_sel = m->dsa_n = NULL;
}

void mpm_dsa_free(mpm_model *m) {
    for (int64_t l = 0; m->layers && l < m->c.n_layers; l++) {
        free(m->layers[l].idx_kn_w);
        free(m->layers[l].idx_kn_b);
        free(m->layers[l].idx_ape);
    }
    void *bufs[] = {m->dsa_kc, m->dsa_gc, m->dsa_pk, m->dsa_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
}

/* LayerNorm over n values with weight and bias (biased variance, as torch) */
static void layer_norm(float *v, const float *w, const float *b, int64_t n) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; i++) mean += v[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) var += ((double)v[i] - mean) * ((double)v[i] - mean);
    float inv = (float)(1.0 / sqrt(var / (double)n + DSA_LN_EPS));
    for (int64_t i = 0; i < n; i++) v[i] = ((float)((double)v[i] - mean)) * inv * w[i] + b[i];
}

/* element i of a cache row (f32, or f16 stored little-endian, read back exactly) */
static float entry(const mpm_model *m, const char *row, int64_t i) {
    if (!m->c.kv_f16) return ((const float *)row)[i];
    float v;
    mpk_f16_to_f32_n(row + 2 * i, 1, &v);
    return v;
}

/* The key of the pool starting at position `first`, from the cached keys and gate scores of its
 * kpool positions: per dim a softmax over the pool (as torch: max, exp, sum, divide), the keys
 * summed in position order; written over the key of the pool's last position. */
static void build_pool(mpm_model *m, const mpm_layer *ly, int first) {
    const int64_t D = m->c.dsa.dim, kp = m->c.dsa.kpool;
    const size_t e = key_elt(&m->c), row = (size_t)D * e;
    const size_t at = ((size_t)ly->idx_slot * (size_t)m->ctx + (size_t)first) * row;
    const char *K = (const char *)m->dsa_kc + at, *G = (const char *)m->dsa_gc + at;
    const float *ape = ly->idx_ape;
    for (int64_t i = 0; i < D; i++) {
        float mx = -INFINITY, sum = 0.0f, acc = 0.0f;
        for (int64_t t = 0; t < kp; t++) mx = fmaxf(mx, entry(m, G + (size_t)t * row, i) + ape[t * D + i]);
        for (int64_t t = 0; t < kp; t++) sum += expf(entry(m, G + (size_t)t * row, i) + ape[t * D + i] - mx);
        for (int64_t t = 0; t < kp; t++)
            acc += expf(entry(m, G + (size_t)t * row, i) + ape[t * D + i] - mx) / sum *
                   entry(m, K + (size_t)t * row, i);
        m->dsa_pk[i] = acc;
    }
    mpm_kv_put(m, (char *)K + (size_t)(kp - 1) * row, m->dsa_pk, D);
}

void mpm_dsa_keys(mpm_model *m, int l, int pos, int T, const float *xn) {
    const mpm_dsa_config *d = &m->c.dsa;
    const mpm_layer *ly = &m->layers[l];
    mpm_matmat(m, &ly->idx_k, xn, T, m->dsa_k);
    if (d->kpool) mpm_matmat(m, &ly->idx_pg, xn, T, m->dsa_g);
    for (int t = 0; t < T; t++) {
        float *k = m->dsa_k + (int64_t)t * d->dim;
        layer_norm(k, ly->idx_kn_w, ly->idx_kn_b, d->dim);
        mpm_rope_tables(m, pos + t);
        mpm_rope_apply(m, k, d->rope_interleave);
        size_t at = ((size_t)ly->idx_slot * (size_t)m->ctx + (size_t)(pos + t)) * (size_t)d->dim;
        mpm_kv_put(m, (char *)m->dsa_kc + at * key_elt(&m->c), k, d->dim);
        if (!d->kpool) continue;
        mpm_kv_put(m, (char *)m->dsa_gc + at * key_elt(&m->c), m->dsa_g + (int64_t)t * d->dim, d->dim);
        if ((pos + t + 1) % d->kpool == 0) build_pool(m, ly, (int)(pos + t + 1 - d->kpool));
    }
}

void mpm_dsa_queries(mpm_model *m, int l, int pos, int T, const float *xn, const float *qres) {
    const mpm_dsa_config *d = &m->c.dsa;
    const mpm_layer *ly = &m->layers[l];
    mpm_matmat(m, &ly->idx_q, qres, T, m->dsa_q);
    mpm_matmat(m, &ly->idx_w, xn, T, m->dsa_w);
    const float wscale = 1.0f / sqrtf((float)d->heads);
    for (int t = 0; t < T; t++) {
        mpm_rope_tables(m, pos + t);
        for (int64_t h = 0; h < d->heads; h++)
            mpm_rope_apply(m, m->dsa_q + ((int64_t)t * d->heads + h) * d->dim, d->rope_interleave);
        for (int64_t h = 0; h < d->heads; h++) m->dsa_w[(int64_t)t * d->heads + h] *= wscale;
    }
}

typedef struct {
    const mpm_model *m;
    const float *q, *w;     /* one token's queries and weights */
    const void *K;          /* candidate 0's key row in this layer's cache (f32 or f16 entries) */
    size_t stride;          /* rows from one candidate's key to the next: 1, or kpool */
    int n;                  /* candidates 0..n-1 */
    float *out;
} score_job;

static void score_block(void *ctx, size_t b) {
    const score_job *j = ctx;
    const mpm_dsa_config *d = &j->m->c.dsa;
    const float scale = 1.0f / sqrtf((float)d->dim);
    int end = (int)(b + 1) * DSA_BLOCK < j->n ? (int)(b + 1) * DSA_BLOCK : j->n;
    const int f16 = j->m->c.kv_f16;
    float row[DSA_MAX_DIM]; /* an f16 key as f32 (exact) */
    for (int s = (int)b * DSA_BLOCK; s < end; s++) {
        const float *k;
        if (f16) {
            mpk_f16_to_f32_n((const uint16_t *)j->K + (size_t)s * j->stride * (size_t)d->dim, d->dim, row);
            k = row;
        } else {
            k = (const float *)j->K + (size_t)s * j->stride * (size_t)d->dim;
        }
        float acc = 0.0f, dv[64]; /* the heads' dots with this key, a block at a time */
        for (int64_t h0 = 0; h0 < d->heads; h0 += 64) {
            const int nh = (int)(d->heads - h0 < 64 ? d->heads - h0 : 64);
            mpk_dots(k, j->q + h0 * d->dim, d->dim, nh, d->dim, dv);
            for (int i = 0; i < nh; i++) {
                float v = dv[i] * scale;
                acc += j->w[h0 + i] * (v > 0.0f ? v : 0.0f);
            }
        }
        j->out[s] = acc;
    }
}

/* candidate s: position s, or the complete pool s (its key at row s·kpool + kpool - 1) */
int mpm_dsa_scores(mpm_model *m, int l, int t, int pos, float *scores) {
    const mpm_dsa_config *d = &m->c.dsa;
    const mpm_layer *ly = &m->layers[l];
    const int64_t kp = pool_of(d);
    const size_t first = (size_t)ly->idx_slot * (size_t)m->ctx + (size_t)(kp - 1);
    score_job j = {m, m->dsa_q + (int64_t)t * d->heads * d->dim, m->dsa_w + (int64_t)t * d->heads,
                   (const char *)m->dsa_kc + first * (size_t)d->dim * key_elt(&m->c), (size_t)kp,
                   (int)((pos + 1) / kp), scores};
    size_t blocks = ((size_t)j.n + DSA_BLOCK - 1) / DSA_BLOCK;
    mpk_pool_run(blocks > 1 ? m->pool : NULL, blocks, score_block, &j);
    return j.n;
}

/* a ranks before b: higher score, then lower position (NaN ranks last) */
static int better(const float *sc, int32_t a, int32_t b) {
    float x = isnan(sc[a]) ? -INFINITY : sc[a], y = isnan(sc[b]) ? -INFINITY : sc[b];
    return x > y || (x == y && a < b);
}

static void sift_down(const float *sc, int32_t *heap, int n, int i) {
    for (;;) { /* min-heap on rank: the worst kept position at the root */
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(sc, heap[w], heap[l])) w = l;
        if (r < n && better(sc, heap[w], heap[r])) w = r;
        if (w == i) return;
        int32_t tmp = heap[i];
        heap[i] = heap[w];
        heap[w] = tmp;
        i = w;
    }
}

static int cmp_pos(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int mpm_dsa_topk(const float *scores, int n, int k, int32_t *sel) {
    if (k >= n) {
        for (int i = 0; i < n; i++) sel[i] = i;
        return n;
    }
    for (int i = 0; i < k; i++) sel[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(scores, sel, k, i);
    for (int s = k; s < n; s++)
        if (better(scores, s, sel[0])) {
            sel[0] = s;
            sift_down(scores, sel, k, 0);
        }
    qsort(sel, (size_t)k, sizeof *sel, cmp_pos); /* attention sums in position order */
    return k;
}

/* pools sel[0..np) (ascending) -> their positions in place (back to front: pool i's positions
 * start at i·kp >= i), then the tail positions tail..n-1; returns the count */
static int expand_pools(int32_t *sel, int np, int64_t kp, int tail, int n) {
    for (int i = np - 1; i >= 0; i--) {
        int64_t first = (int64_t)sel[i] * kp;
        for (int64_t j = kp - 1; j >= 0; j--) sel[(int64_t)i * kp + j] = (int32_t)(first + j);
    }
    int got = (int)(np * kp);
    for (int s = tail; s < n; s++) sel[got++] = s;
    return got;
}

void mpm_dsa_select(mpm_model *m, int l, int pos, int T, const float *xn, const float *qres) {
    const mpm_dsa_config *d = &m->c.dsa;
    if (m->layers[l].idx_slot < 0) return; /* shared: keep the latest full layer's selection */
    mpm_dsa_keys(m, l, pos, T, xn);
    mpm_dsa_queries(m, l, pos, T, xn, qres);
    const int64_t kp = pool_of(d), want = d->topk / kp, k = kept(d, m->ctx);
    for (int t = 0; t < T; t++) {
        int n = pos + t + 1;
        if (n / kp <= want) { /* every candidate kept (and the tail): dense MLA */
            m->dsa_n[t] = -1;
            continue;
        }
        int32_t *sel = m->dsa_sel + (int64_t)t * k;
        int cand = mpm_dsa_scores(m, l, t, pos + t, m->scores);
        int got = mpm_dsa_topk(m->scores, cand, (int)want, sel);
        m->dsa_n[t] = kp > 1 ? expand_pools(sel, got, kp, (int)(cand * kp), n) : got;
    }
}

const void *mpm_dsa_rows(mpm_model *m, int slot, int t, int64_t *n) {
    const void *first = mpm_kv_row(m, m->kc, slot, 0);
    if (m->dsa_n[t] < 0) return first; /* *n stays pos + 1: every position */
    /* the cache's own entries (f32 or f16), copied whole in ascending position order */
    size_t row = (size_t)((const char *)mpm_kv_row(m, m->kc, slot, 1) - (const char *)first);
    const int32_t *sel = m->dsa_sel + (int64_t)t * kept(&m->c.dsa, m->ctx);
    for (int i = 0; i < m->dsa_n[t]; i++)
        memcpy((char *)m->dsa_rows + (size_t)i * row, (const char *)first + (size_t)sel[i] * row, row);
    *n = m->dsa_n[t];
    return m->dsa_rows;
}
