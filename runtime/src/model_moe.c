/* Feed-forward blocks: routing (FORMAT.md §7), routed experts computed on their tiled rvq codes
 * (decode: int8 lookup tables, CODECS.md §3.5; prefill: decoded codes times all of an expert's
 * tokens, §3.6), shared experts, dense FFN.  In decode the gate and up tables are built once per
 * layer from the (rotated) normalised input and shared by every routed expert of the layer; the
 * down table is built per expert from its activation. */
#include "io.h"
#include "model_internal.h"
#include "moepack.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* indices of the k largest v[0..n) (ties: lower index first), in descending order */
static void topk(const float *v, int64_t n, int64_t k, const uint8_t *allowed, int32_t *out) {
    for (int64_t i = 0; i < k; i++) out[i] = -1;
    for (int64_t e = 0; e < n; e++) {
        if (allowed && !allowed[e]) continue;
        int64_t pos = k;
        while (pos > 0 && (out[pos - 1] < 0 || v[e] > v[out[pos - 1]])) pos--;
        if (pos >= k) continue;
        for (int64_t i = k - 1; i > pos; i--) out[i] = out[i - 1];
        out[pos] = (int32_t)e;
    }
    /* NaN scores (damaged weights) compare false everywhere: fill any empty slot with the lowest
     * unused allowed index so that callers never see -1 */
    for (int64_t i = 0; i < k; i++) {
        if (out[i] >= 0) continue;
        for (int64_t e = 0; e < n && out[i] < 0; e++) {
            int used = allowed && !allowed[e];
            for (int64_t j = 0; j < k && !used; j++) used = out[j] == e;
            if (!used) out[i] = (int32_t)e;
        }
        if (out[i] < 0) out[i] = 0;
    }
}

void mpm_route(const mpm_model *m, int layer, const float *xn, float *logits, int32_t *sel,
               float *w) {
    mpk_matvec(m->kern, m->pool, &m->layers[layer].router, xn, logits);
    mpm_select(m, layer, logits, sel, w);
}

void mpm_select(const mpm_model *m, int layer, float *logits, int32_t *sel, float *w) {
    const mpm_config *c = &m->c;
    const mpm_layer *ly = &m->layers[layer];
    const int64_t E = c->n_experts, K = c->top_k;
    if (!c->sigmoid) {
        mpk_softmax(logits, E);
        topk(logits, E, K, NULL, sel);
        float sum = 0.0f;
        for (int64_t i = 0; i < K; i++) sum += (w[i] = logits[sel[i]]);
        if (c->norm_topk)
            for (int64_t i = 0; i < K; i++) w[i] /= sum;
        return;
    }
    /* sigmoid scores s, choice scores s + bias, group-limited top-k */
    float *sg = logits, *ch = m->choice; /* sigmoid in place; choice scores */
    for (int64_t e = 0; e < E; e++) {
        sg[e] = 1.0f / (1.0f + expf(-sg[e]));
        ch[e] = sg[e] + ly->router_bias[e];
    }
    const int64_t G = c->n_group, per = E / G;
    uint8_t *ok = m->allowed;
    if (G > 1) {
        float gs[MPM_MAX_GROUPS];
        int32_t keep[MPM_MAX_GROUPS];
        int64_t ng = G;
        for (int64_t g = 0; g < ng; g++) {
            float a = -INFINITY, b = -INFINITY;
            for (int64_t e = g * per; e < (g + 1) * per; e++) {
                if (ch[e] > a) {
                    b = a;
                    a = ch[e];
                } else if (ch[e] > b) {
                    b = ch[e];
                }
            }
            gs[g] = per > 1 ? a + b : a;
        }
        topk(gs, ng, c->topk_group, NULL, keep);
        memset(ok, 0, (size_t)E);
        for (int64_t i = 0; i < c->topk_group; i++)
            if (keep[i] >= 0) memset(ok + (int64_t)keep[i] * per, 1, (size_t)per);
        topk(ch, E, K, ok, sel);
    } else {
        topk(ch, E, K, NULL, sel);
    }
    float sum = 0.0f;
    for (int64_t i = 0; i < K; i++) sum += (w[i] = sg[sel[i]]);
    for (int64_t i = 0; i < K; i++) {
        if (c->norm_topk) w[i] /= sum + 1e-20f;
        w[i] *= c->routed_scale;
    }
}

void mpm_ffn_dense(mpm_model *m, const mpm_ffn *f, int T, const float *xn, float *out) {
    mpm_matmat(m, &f->gate, xn, T, m->g);
    mpm_matmat(m, &f->up, xn, T, m->u);
    mpm_act_rows(&m->c, m->g, m->u, T * f->inter);
    mpm_matmat(m, &f->down, m->g, T, out);
}

static void rvq_part(const mpm_layer *ly, int p, const uint8_t *rec, int64_t rows, int64_t cols,
                     mpk_rvq *w) {
    mpk_rvq_init(w, rows, cols, ly->stages[p], rec + ly->part_off[p]);
}

/* x rotated when part p's codec says so (else x itself) */
static const float *rotated(mpm_model *m, const mpm_layer *ly, int p, const float *x, int64_t n) {
    if (!ly->rot_block[p]) return x;
    mpk_hadamard_rotate(x, ly->signs[p], n, ly->rot_block[p], m->xr);
    return m->xr;
}

/* integer tables t (memory mem) of part p from x */
static void build_tab(mpm_model *m, const mpm_layer *ly, int p, const float *x, int64_t n,
                      mpk_rvq_tab *t, void *mem) {
    mpk_rvq_tab_init(t, mem, n, ly->stages[p]);
    mpk_rvq_tables(m->kern, m->pool, ly->cbt[p], rotated(m, ly, p, x, n), t);
}

static size_t tab_stride(int64_t cols, int stages) { return (mpk_rvq_tab_bytes(cols, stages) + 63) & ~(size_t)63; }
/* decode table i in ctabmem: 0 gate, 1 up (hidden columns), 2 + e the down table of a step's
 * expert e (moe_inter columns) */
static uint8_t *tab_mem(const mpm_model *m, int i) {
    uint8_t *base = (uint8_t *)(((uintptr_t)m->ctabmem + 63) & ~(uintptr_t)63);
    const size_t wide = tab_stride(m->c.hidden, m->ctab_stages);
    return i < 2 ? base + (size_t)i * wide : base + 2 * wide + (size_t)(i - 2) * tab_stride(m->c.moe_inter, m->ctab_stages);
}
/* the experts a decode step computes in one batch (each has three products) */
static int decode_batch(const mpm_config *c) { return c->top_k < MPK_RVQ_BATCH / 2 ? (int)c->top_k : MPK_RVQ_BATCH / 2; }

/* the prefill products' workspace for a chunk: one expert's inputs at a time, at most the chunk, of
 * the wider of the experts' two input widths; planned on every machine (a plan does not depend
 * on the CPU it is made on), allocated where the kernels use it */
static int64_t prefill_ws_cols(const mpm_config *c) {
    const int64_t D = c->latent ? c->latent : c->hidden;
    return D > c->moe_inter ? D : c->moe_inter;
}
static uint64_t prefill_ws_bytes(const mpm_config *c, int chunk) {
    return mpk_rvq_gemm_ws_bound(prefill_ws_cols(c), chunk);
}

uint64_t mpm_moe_chunk_bytes(const mpm_config *c, int chunk, int stages) {
    if (!mpm_config_moe_layers(c)) return 0;
    const uint64_t T = (uint64_t)chunk, X = mpk_rvq_xq_bytes(c->hidden), Dd = mpk_rvq_xq_bytes(c->moe_inter);
    const uint64_t B = (uint64_t)decode_batch(c), D = (uint64_t)(c->latent ? c->latent : c->hidden);
    return 64 + 2 * tab_stride(c->hidden, stages) + B * tab_stride(c->moe_inter, stages) + /* decode tables */
           B * (2u * (uint64_t)c->moe_inter + D) * 4u + /* decode: a batch's gate, up, down outputs */
           3 * sizeof(mpk_rvq_icb) +           /* prefill: integer codebooks */
           T * (2 * X + Dd) +                  /* prefill: gathered inputs */
           prefill_ws_bytes(c, chunk) +        /* prefill: the kernels' own input layout */
           T * (uint64_t)c->hidden * 4u +      /* one expert's down outputs */
           T * 4u * (uint64_t)c->top_k * 4u;   /* token lists */
}

int mpm_moe_alloc(mpm_model *m) {
    const mpm_config *c = &m->c;
    int S = 1;
    for (int64_t l = 0; l < c->n_layers; l++)
        for (int p = 0; p < 3; p++) S = m->layers[l].stages[p] > S ? m->layers[l].stages[p] : S;
    const size_t B = (size_t)decode_batch(c), D = (size_t)(c->latent ? c->latent : c->hidden);
    m->ctabmem = calloc(2 * tab_stride(c->hidden, S) + B * tab_stride(c->moe_inter, S) + 64, 1);
    m->cdec = calloc(B * (2 * (size_t)c->moe_inter + D), sizeof(float));
    m->cicb = calloc(3, sizeof *m->cicb);
    m->ctab_stages = S;
    return m->ctabmem && m->cdec && m->cicb ? 0 : -1;
}

int mpm_moe_chunk_alloc(mpm_model *m) {
    const mpm_config *c = &m->c;
    const size_t T = (size_t)m->chunk;
    /* 64-byte aligned: the prefill kernels' 32-byte loads then never straddle a cache line */
    m->cxg = mp_aligned_alloc(64, T * mpk_rvq_xq_bytes(c->hidden));
    m->cxu = mp_aligned_alloc(64, T * mpk_rvq_xq_bytes(c->hidden));
    m->cxd = mp_aligned_alloc(64, T * mpk_rvq_xq_bytes(c->moe_inter));
    const uint64_t ws = mpk_rvq_gemm_ws_bytes(m->kern, prefill_ws_cols(c), 1) ? prefill_ws_bytes(c, m->chunk) : 0;
    m->cws = ws ? mp_aligned_alloc(64, ws) : NULL;
    m->ceo = mp_aligned_calloc(T * (size_t)c->hidden, sizeof(float));
    m->cpairs = mp_aligned_calloc(T * (size_t)c->top_k, sizeof(int32_t));
    m->corder = mp_aligned_calloc(T * (size_t)c->top_k, sizeof(int32_t));
    m->cstart = mp_aligned_calloc(T * (size_t)c->top_k + 1, sizeof(int32_t));
    m->cfill = mp_aligned_calloc(T * (size_t)c->top_k + 1, sizeof(int32_t));
    return m->cxg && m->cxu && m->cxd && (m->cws || !ws) && m->ceo && m->cpairs && m->corder && m->cstart &&
                   m->cfill
               ? 0
               : -1;
}

void mpm_moe_chunk_free(mpm_model *m) {
    mp_aligned_free(m->cxg);
    mp_aligned_free(m->cxu);
    mp_aligned_free(m->cxd);
    mp_aligned_free(m->cws);
    mp_aligned_free(m->ceo);
    mp_aligned_free(m->cpairs);
    mp_aligned_free(m->corder);
    mp_aligned_free(m->cstart);
    mp_aligned_free(m->cfill);
    m->cxg = m->cxu = m->cxd = m->cws = NULL;
    m->ceo = NULL;
    m->cpairs = m->corder = m->cstart = m->cfill = NULL;
}

void mpm_moe_free(mpm_model *m) {
    free(m->ctabmem);
    free(m->cdec);
    free(m->cicb);
}

/* dst = src[0 .. n) rotated for part p (in scratch[n]) and quantised for the prefill product */
static void put_row(const mpm_layer *ly, int p, const float *src, int64_t n, uint8_t *dst, float *scratch) {
    if (ly->rot_block[p]) {
        mpk_hadamard_rotate(src, ly->signs[p], n, ly->rot_block[p], scratch);
        src = scratch;
    }
    mpk_rvq_xq(src, n, dst);
}

/* One expert's prefill inputs by tokens: its tokens' gate (and up) inputs gathered and quantised
 * (down = 0; where gate and up share an unrotated input, copied from the chunk's inputs
 * quantised once per layer in cxu), or their activations and the down inputs (down = 1); over
 * the pool unless a part is rotated (then in order on this thread, rotating into the model's one
 * scratch row). */
typedef struct {
    mpm_model *m;
    const mpm_layer *ly;
    const float *xe;
    const int32_t *pr;
    int n, same, down;
    float *scratch;
} prep_job;
#define PREP_TOKENS 4 /* tokens per task */

static void prep_task(void *ctx, size_t task) {
    const prep_job *j = ctx;
    mpm_model *m = j->m;
    const mpm_config *c = &m->c;
    const int64_t I = c->moe_inter, K = c->top_k, D = c->latent ? c->latent : c->hidden;
    const size_t xs = mpk_rvq_xq_bytes(D), ds = mpk_rvq_xq_bytes(I);
    const int t0 = (int)task * PREP_TOKENS, t1 = t0 + PREP_TOKENS < j->n ? t0 + PREP_TOKENS : j->n;
    float *scratch = j->scratch;
    for (int t = t0; t < t1; t++) {
        if (!j->down && j->same) {
            memcpy(m->cxg + t * xs, m->cxu + (size_t)(j->pr[t] / K) * xs, xs);
        } else if (!j->down) {
            const float *x = j->xe + (int64_t)(j->pr[t] / K) * D;
            put_row(j->ly, 0, x, D, m->cxg + t * xs, scratch);
            put_row(j->ly, 1, x, D, m->cxu + t * xs, scratch);
        } else {
            float *g = m->g + t * I;
            const float *u = m->u + t * I;
            mpm_act_rows(c, g, u, I);
            put_row(j->ly, 2, g, I, m->cxd + t * ds, scratch);
        }
    }
}

static void prep(mpm_model *m, const mpm_layer *ly, const float *xe, const int32_t *pr, int n, int same, int down) {
    const int rot = ly->rot_block[0] || ly->rot_block[1] || ly->rot_block[2];
    prep_job j = {m, ly, xe, pr, n, same, down, rot ? m->xr : NULL};
    mpk_pool_run(rot ? NULL : m->pool, (size_t)((n + PREP_TOKENS - 1) / PREP_TOKENS), prep_task, &j);
}

/* The decode step's experts recs[0 .. n) (n <= decode_batch; pair[e]: expert e's one (token,
 * rank) pair index), in three pool jobs: every gate and up product (tables ctabs[0], [1], built once
 * per layer by the caller), every down table, every down product; then each output added with
 * its routing weight to bsum in the caller's (ascending index) order. */
static void experts_decode(mpm_model *m, const mpm_layer *ly, const uint8_t *const *recs, int n,
                           const int32_t *pair) {
    const mpm_config *c = &m->c;
    const int64_t I = c->moe_inter, K = c->top_k, D = c->latent ? c->latent : c->hidden;
    mpk_rvq w[MPK_RVQ_BATCH];
    const mpk_rvq_tab *t[MPK_RVQ_BATCH];
    mpk_rvq_tab down[MPK_RVQ_BATCH / 2], *dt[MPK_RVQ_BATCH / 2];
    float *y[MPK_RVQ_BATCH], *g = m->cdec, *u = g + n * I, *o = u + n * I;
    const float *dx[MPK_RVQ_BATCH / 2];
    if (n < 1) return;
    for (int e = 0; e < n; e++) {
        rvq_part(ly, 0, recs[e], I, D, &w[2 * e]);
        rvq_part(ly, 1, recs[e], I, D, &w[2 * e + 1]);
        t[2 * e] = &m->ctabs[0], t[2 * e + 1] = &m->ctabs[1];
        y[2 * e] = g + e * I, y[2 * e + 1] = u + e * I;
    }
    mpk_rvq_matvec_batch(m->kern, m->pool, 2 * n, w, t, y);
    for (int e = 0; e < n; e++) {
        float *ge = g + e * I, *ue = u + e * I;
        mpm_act_rows(c, ge, ue, I);
        dx[e] = ge;
        if (ly->rot_block[2]) { /* rotated into the expert's up output, no longer needed */
            mpk_hadamard_rotate(ge, ly->signs[2], I, ly->rot_block[2], ue);
            dx[e] = ue;
        }
        mpk_rvq_tab_init(&down[e], tab_mem(m, 2 + e), I, ly->stages[2]);
        dt[e] = &down[e];
    }
    mpk_rvq_tables_batch(m->kern, m->pool, n, ly->cbt[2], dx, dt);
    for (int e = 0; e < n; e++) {
        rvq_part(ly, 2, recs[e], D, I, &w[e]);
        t[e] = &down[e], y[e] = o + e * D;
    }
    mpk_rvq_matvec_batch(m->kern, m->pool, n, w, t, y);
    for (int e = 0; e < n; e++) mpk_axpy(m->bsum + (int64_t)pair[e] / K * D, m->bselw[pair[e]], o + e * D, D);
}

/* gate and up see the same input (neither rotated): quantised once per chunk token and layer */
static int gate_up_same(const mpm_layer *ly) { return !ly->rot_block[0] && !ly->rot_block[1]; }

typedef struct {
    const float *xe;
    int64_t D;
    uint8_t *out;
} quant_job;

static void quant_task(void *ctx, size_t t) {
    const quant_job *j = ctx;
    mpk_rvq_xq(j->xe + (int64_t)t * j->D, j->D, j->out + t * mpk_rvq_xq_bytes(j->D));
}

/* One expert (record rec) of a prefill chunk for its n (token, rank) pairs pr: its tokens'
 * inputs gathered and multiplied with the decoded codes (mpk_rvq_gemm), each output added with
 * its routing weight to its token's sum in bsum (the caller visits experts by ascending index). */
static void expert(mpm_model *m, const mpm_layer *ly, const uint8_t *rec, const float *xe, const int32_t *pr,
                   int n) {
    const mpm_config *c = &m->c;
    const int64_t I = c->moe_inter, K = c->top_k, D = c->latent ? c->latent : c->hidden;
    const size_t xs = mpk_rvq_xq_bytes(D), ds = mpk_rvq_xq_bytes(I); /* gather strides */
    mpk_rvq wg, wu, wd;
    rvq_part(ly, 0, rec, I, D, &wg);
    rvq_part(ly, 1, rec, I, D, &wu);
    rvq_part(ly, 2, rec, D, I, &wd);
    const int same = gate_up_same(ly);
    prep(m, ly, xe, pr, n, same, 0);
    mpk_rvq_gemm(m->kern, m->pool, &wg, &m->cicb[0], m->cxg, xs, n, m->cws, m->g);
    mpk_rvq_gemm(m->kern, m->pool, &wu, &m->cicb[1], same ? m->cxg : m->cxu, xs, n, m->cws, m->u);
    prep(m, ly, xe, pr, n, same, 1);
    mpk_rvq_gemm(m->kern, m->pool, &wd, &m->cicb[2], m->cxd, ds, n, m->cws, m->ceo);
    for (int j = 0; j < n; j++) mpk_axpy(m->bsum + (int64_t)pr[j] / K * D, m->bselw[pr[j]], m->ceo + (int64_t)j * D, D);
}

/* Records per acquire: top_k (the pinned working set the memory plan allows), but in a prefill
 * pass whose cache holds fewer than two such groups, half of what it holds, so that the next
 * group's prefetch finds room while this one is pinned (with top_k it found room for one record
 * and the next acquire read the rest while the compute waited: a 512-token prompt under the
 * quick bench's 25 % cap, Zen 3, waited for reads 23-30 % of its time).  The group size changes
 * no result: each expert is computed alone, in the same order. */
static int acquire_group(const mpm_model *m) {
    const int K = (int)m->c.top_k, half = m->io.cached / 2;
    if (!m->prefill || !m->io.prefetch || half >= K) return K;
    return half > 1 ? half : 1;
}

/* MoE block for a chunk of T tokens (xn: T x hidden, normalised).  Routed experts are fetched in
 * groups of acquire_group records, each group with one acquire while the next group is
 * prefetched; in a prefill chunk each distinct expert is read once and computed for all of its
 * tokens at once (the prefill product, CODECS.md §3.6:
 * each (token, row) independent of the other tokens).  Experts are visited by ascending index and
 * each adds its weighted output to its tokens' sums, so every token's experts are summed in the
 * order of their indices: a prompt token gets the same arithmetic whatever the chunk size. */
int mpm_moe(mpm_model *m, int l, int T, const float *xn, float *out) {
    const mpm_config *c = &m->c;
    const mpm_layer *ly = &m->layers[l];
    const int64_t H = c->hidden, K = c->top_k;
    const int64_t D = c->latent ? c->latent : H; /* the routed experts' width (Kimi K3: latent) */
    if (!m->prefill && T != 1) {
        snprintf(m->err, sizeof m->err, "a decode pass holds one token, not %d", T);
        return MP_EINVAL;
    }
    /* the router reads the full-width input; one product for the chunk reads its rows once
     * (mpk_matmat: every token's logits are mpk_matvec's bits) */
    mpk_matmat(m->kern, m->pool, &ly->router, xn, T, m->router_logits);
    for (int t = 0; t < T; t++)
        mpm_select(m, l, m->router_logits + (int64_t)t * c->n_experts, m->bsel + t * K, m->bselw + t * K);
    const float *xe = xn;
    if (c->latent) {
        mpm_latent_in(m, ly, T, xn, m->klat);
        xe = m->klat;
    }
    /* distinct experts by ascending index, and each one's (token, rank) pairs in token order */
    int nu = 0;
    for (int64_t i = 0; i < T * K; i++) { /* insertion into the sorted list */
        int e = m->bsel[i], u = nu;
        while (u > 0 && m->uniq[u - 1] > e) u--;
        if (u > 0 && m->uniq[u - 1] == e) continue;
        memmove(m->uniq + u + 1, m->uniq + u, (size_t)(nu - u) * sizeof *m->uniq);
        m->uniq[u] = e, nu++;
    }
    for (int64_t i = 0; i < T * K; i++) { /* expert of pair i, for the counting sort below */
        int lo = 0, hi = nu - 1;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (m->uniq[mid] < m->bsel[i]) lo = mid + 1;
            else hi = mid;
        }
        m->cpairs[i] = lo;
    }
    /* counting sort of the pairs by expert (stable: token order within an expert) */
    int32_t *start = m->cstart, *fill = m->cfill, *pairs = m->corder;
    memset(start, 0, (size_t)(nu + 1) * sizeof *start);
    for (int64_t i = 0; i < T * K; i++) start[m->cpairs[i] + 1]++;
    for (int u = 0; u < nu; u++) start[u + 1] += start[u];
    memcpy(fill, start, (size_t)nu * sizeof *fill);
    for (int64_t i = 0; i < T * K; i++) pairs[fill[m->cpairs[i]]++] = (int32_t)i;
    if (!m->prefill) { /* decode: gate/up tables once, shared by the token's experts */
        build_tab(m, ly, 0, xe, D, &m->ctabs[0], tab_mem(m, 0));
        build_tab(m, ly, 1, xe, D, &m->ctabs[1], tab_mem(m, 1));
    } else {
        for (int p = 0; p < 3; p++) mpk_rvq_icb_init(&m->cicb[p], ly->cb[p], ly->stages[p]);
        if (gate_up_same(ly)) { /* each token's input quantised once, not once per expert */
            quant_job q = {xe, D, m->cxu};
            mpk_pool_run(m->pool, (size_t)T, quant_task, &q);
        }
    }
    memset(m->bsum, 0, (size_t)(T * D) * sizeof(float));
    const int A = acquire_group(m);
    for (int g0 = 0; g0 < nu; g0 += A) {
        int ng = nu - g0 < A ? nu - g0 : A;
        const int *grp = m->uniq + g0;
        char msg[192] = "";
        int rc = mpm_cancelled(m); /* a pass under a cap may read for seconds a layer */
        if (rc) return rc;
        double t0 = mpm_now();
        rc = m->io.acquire(m->io.user, l, grp, ng, m->recs, msg, sizeof msg);
        m->io_wait += mpm_now() - t0;
        if (rc) {
            snprintf(m->err, sizeof m->err, "%s", msg[0] ? msg : "expert records could not be read");
            return rc;
        }
        if (m->io.prefetch && g0 + ng < nu) /* next group's reads overlap this group's compute */
            m->io.prefetch(m->io.user, l, m->uniq + g0 + ng, nu - g0 - ng < A ? nu - g0 - ng : A);
        if (m->prefill) {
            for (int gi = 0; gi < ng; gi++)
                expert(m, ly, m->recs[gi], xe, pairs + start[g0 + gi], start[g0 + gi + 1] - start[g0 + gi]);
        } else {
            const int B = decode_batch(c);
            int32_t pr[MPK_RVQ_BATCH / 2];
            for (int b0 = 0; b0 < ng; b0 += B) {
                const int nb = ng - b0 < B ? ng - b0 : B;
                for (int e = 0; e < nb; e++) pr[e] = pairs[start[g0 + b0 + e]];
                experts_decode(m, ly, m->recs + b0, nb, pr);
            }
        }
        m->io.release(m->io.user, l, grp, ng);
    }
    if (ly->has_shared) mpm_ffn_dense(m, &ly->shared, T, xn, out);
    if (ly->shared_gate) mpm_shared_gate(m, ly, T, xn, out);
    const float *sum = m->bsum;
    if (c->latent) { /* the sums at the latent width: RMSNorm, up-projection */
        mpm_latent_out(m, ly, T, m->bsum, m->ceo); /* ceo: free again, T x hidden */
        sum = m->ceo;
    }
    for (int64_t j = 0; j < T * H; j++) out[j] = ly->has_shared ? sum[j] + out[j] : sum[j];
    return 0;
}
