/* Feed-forward blocks: routing (FORMAT.md §7), routed experts computed on their tiled rvq codes
 * with int8 lookup tables (CODECS.md §3.5), shared experts, dense FFN.  The gate and up tables are
 * built once per layer per token from the (rotated) normalised input and shared by every routed
 * expert of the layer; the down table is built per expert from its activation. */
#include "model_internal.h"
#include "moepack.h"

#include <math.h>
#include <stdio.h>
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
    const mpm_config *c = &m->c;
    const mpm_layer *ly = &m->layers[layer];
    const int64_t E = c->n_experts, K = c->top_k;
    mpk_matvec(m->kern, m->pool, &ly->router, xn, logits);
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
    mpk_matmat(m->kern, m->pool, &f->gate, xn, T, m->g);
    mpk_matmat(m->kern, m->pool, &f->up, xn, T, m->u);
    for (int64_t i = 0; i < T * f->inter; i++) m->g[i] = mpk_silu(m->g[i]) * m->u[i];
    mpk_matmat(m->kern, m->pool, &f->down, m->g, T, out);
}

static void rvq_part(const mpm_layer *ly, int p, const uint8_t *rec, int64_t rows, int64_t cols,
                     mpk_rvq *w) {
    mpk_rvq_init(w, rows, cols, ly->stages[p], rec + ly->part_off[p]);
}

/* integer tables tab[p] from x (rotated first when the part's codec says so) */
static void build_tab(mpm_model *m, const mpm_layer *ly, int p, const float *x, int64_t n) {
    const float *in = x;
    if (ly->rot_block[p]) {
        mpk_hadamard_rotate(x, ly->signs[p], n, ly->rot_block[p], m->xr);
        in = m->xr;
    }
    mpk_rvq_tab_init(&m->tab[p], m->tabmem[p], n, ly->stages[p]);
    mpk_rvq_tables(m->kern, m->pool, ly->cbt[p], in, &m->tab[p]);
}

/* MoE block for a chunk of T tokens (xn: T x hidden, normalised).  Routed experts are fetched
 * in groups of at most top_k records (the pinned working set the memory plan allows), each group
 * with one acquire, and computed for every token of the chunk routed to them; each token's
 * outputs are kept per routing rank and summed in rank order at the end, so a token gets exactly
 * the same arithmetic whatever the chunk size (chunked prefill == token by token, bit for bit). */
int mpm_moe(mpm_model *m, int l, int T, const float *xn, float *out) {
    const mpm_config *c = &m->c;
    const mpm_layer *ly = &m->layers[l];
    const int64_t H = c->hidden, I = c->moe_inter, K = c->top_k;
    for (int t = 0; t < T; t++)
        mpm_route(m, l, xn + t * H, m->router_logits, m->bsel + t * K, m->bselw + t * K);
    /* distinct experts in order of first use */
    int nu = 0;
    for (int64_t i = 0; i < T * K; i++) {
        int e = m->bsel[i], seen = 0;
        for (int u = 0; u < nu && !seen; u++) seen = m->uniq[u] == e;
        if (!seen) m->uniq[nu++] = e;
    }
    for (int g0 = 0; g0 < nu; g0 += (int)K) {
        int ng = nu - g0 < (int)K ? nu - g0 : (int)K;
        const int *grp = m->uniq + g0;
        char msg[192] = "";
        double t0 = mpm_now();
        int rc = m->io.acquire(m->io.user, l, grp, ng, m->recs, msg, sizeof msg);
        m->io_wait += mpm_now() - t0;
        if (rc) {
            snprintf(m->err, sizeof m->err, "%s", msg[0] ? msg : "expert records could not be read");
            return rc;
        }
        if (m->io.prefetch && g0 + ng < nu) /* next group's reads overlap this group's compute */
            m->io.prefetch(m->io.user, l, m->uniq + g0 + ng, nu - g0 - ng < (int)K ? nu - g0 - ng : (int)K);
        for (int t = 0; t < T; t++) {
            const float *x = xn + t * H;
            int luts = 0;
            for (int64_t i = 0; i < K; i++) {
                int gi = -1;
                for (int u = 0; u < ng; u++)
                    if (grp[u] == m->bsel[t * K + i]) gi = u;
                if (gi < 0) continue;
                if (!luts) { /* gate/up tables: once per token per group (once per token at T = 1) */
                    build_tab(m, ly, 0, x, H);
                    build_tab(m, ly, 1, x, H);
                    luts = 1;
                }
                mpk_rvq wg, wu, wd;
                rvq_part(ly, 0, m->recs[gi], I, H, &wg);
                rvq_part(ly, 1, m->recs[gi], I, H, &wu);
                rvq_part(ly, 2, m->recs[gi], H, I, &wd);
                mpk_rvq_matvec(m->kern, m->pool, &wg, &m->tab[0], m->g);
                mpk_rvq_matvec(m->kern, m->pool, &wu, &m->tab[1], m->u);
                for (int64_t j = 0; j < I; j++) m->g[j] = mpk_silu(m->g[j]) * m->u[j];
                build_tab(m, ly, 2, m->g, I);
                mpk_rvq_matvec(m->kern, m->pool, &wd, &m->tab[2], m->beo + (t * K + i) * H);
            }
        }
        m->io.release(m->io.user, l, grp, ng);
    }
    if (ly->has_shared) mpm_ffn_dense(m, &ly->shared, T, xn, out);
    for (int t = 0; t < T; t++) {
        float *o = out + t * H;
        memset(m->moe_out, 0, (size_t)H * sizeof(float));
        for (int64_t i = 0; i < K; i++) mpk_axpy(m->moe_out, m->bselw[t * K + i], m->beo + (t * K + i) * H, H);
        if (ly->has_shared) {
            for (int64_t j = 0; j < H; j++) o[j] = m->moe_out[j] + o[j];
        } else {
            memcpy(o, m->moe_out, (size_t)H * sizeof(float));
        }
    }
    return 0;
}
