/* The gated delta rule of one linear-attention head over the tokens of a call (model_linear.c:
 * Gated DeltaNet, one decay per token; model_kda.c: KDA, one decay per key channel), in two
 * forms (docs/RUNTIME.md, "Linear attention"):
 *
 * token form, per token:  S = diag(a) S;  S += k (x) ((v - S^T k) * beta);  o = S^T q
 *
 * chunk form, per sub-chunk of L tokens (the WY / UT form of fla and of transformers'
 * torch_chunk_gated_delta_rule and chunk_kda), with D(i,j) = prod_{j<s<=i} a_s and
 * G_i = prod_{s<=i} a_s (per channel, from the sub-chunk's first token):
 *     N_ij = -beta_i k_i . (D(i,j) k_j)  (j < i),   (I - N) [U | Wn] = [beta v | -beta G.k]
 *     Delta = U + Wn S0                          (the rows (v - S^T k) * beta of the token form)
 *     o_i = (G_i q_i)^T S0 + sum_{j<=i} (q_i . D(i,j) k_j) Delta_j
 *     S = diag(G_{L-1}) S0 + sum_j (D(L-1,j) k_j) (x) Delta_j
 * The state is read twice and written once per sub-chunk instead of twice per token, in
 * register tiles of 4 rows x 16 columns.  D(i,j) k_j are running products of the token form's
 * own factors a (never a division by a cumulative decay, which overflows).
 *
 * A sub-chunk, aligned to a multiple of L positions, takes the chunk form when all its tokens are
 * in the call; every other token takes the token form.  Both are fixed sequences of f32
 * multiplies and adds (no fma), the same on the SSE2 and AVX2 builds of this file, so bits
 * depend neither on the thread count nor on the kernel path. */
#include "linear_ops.h"

#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
#define AI static inline __attribute__((always_inline))
#define LD(p) __extension__({ v8 v_; memcpy(&v_, (p), sizeof v_); v_; })
#define ST(p, x) __extension__({ v8 s_ = (x); memcpy((p), &s_, sizeof s_); })
#define BC(a) __extension__({ const float b_ = (a); (v8){b_, b_, b_, b_, b_, b_, b_, b_}; })

/* y = x * a (y may be x) */
AI void vscale(float *y, const float *x, float a, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) ST(y + i, LD(x + i) * BC(a));
    for (; i < n; i++) y[i] = x[i] * a;
}

/* y = x * a, elementwise (y may be x) */
AI void vmul(float *y, const float *x, const float *a, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) ST(y + i, LD(x + i) * LD(a + i));
    for (; i < n; i++) y[i] = x[i] * a[i];
}

/* x[0] . b_j and x[1] . b_j (b_j = B + j * dk) for NB rows j = j0.. at once: each dot puts
 * element c into lane c % 8 in order, then adds the lanes in a fixed tree (the same bits however
 * many rows go together) */
AI void vdots(const float *const x[2], const float *B, int64_t dk, int j0, const int NB, float *out0,
              float *out1) {
    v8 acc[2][4];
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) acc[0][b] = acc[1][b] = BC(0.0f);
    int64_t c = 0;
    for (; c + 8 <= dk; c += 8) {
        const v8 x0 = LD(x[0] + c), x1 = LD(x[1] + c);
#pragma GCC unroll 4
        for (int b = 0; b < NB; b++) {
            const v8 y = LD(B + (j0 + b) * dk + c);
            acc[0][b] += x0 * y;
            acc[1][b] += x1 * y;
        }
    }
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++)
        for (int h = 0; h < 2; h++) {
            float l[8];
            ST(l, acc[h][b]);
            for (int64_t e = c; e < dk; e++) l[e & 7] += x[h][e] * B[(j0 + b) * dk + e];
            (h ? out1 : out0)[j0 + b] = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
        }
}

/* Y[r][0..n) = y0 term + sum_{i<m} A[r*ar + i*ai] * B[i*bs + 0..n) for r < rows, added in the
 * order of i.  The y0 term: 0 (y0 NULL), y0[r][.], or sc[r] * y0[r][.] (sc not NULL).  Y may be
 * y0 (a row is read before it is written), never B.  lower: A[r][i] = 0 for i > r, and rows
 * stop at i = r + 1 (a tile at the end of its last row). */
typedef struct {
    float *Y;
    const float *y0, *sc, *A, *B;
    int64_t ys, y0s, ar, ai, bs, rows, m, n;
    int lower;
} gemm_args;

AI void gemm_init(const gemm_args *g, int64_t r, int64_t j, v8 *acc) {
    if (!g->y0) *acc = BC(0.0f);
    else if (g->sc) *acc = BC(g->sc[r]) * LD(g->y0 + r * g->y0s + j);
    else *acc = LD(g->y0 + r * g->y0s + j);
}

/* rows r0..r0+NR, columns j..j+8*NV */
AI void gemm_tile(const gemm_args *g, int64_t r0, int64_t j, const int NR, const int NV, int64_t m) {
    v8 acc[4][2]; /* unrolled: the accumulators stay in registers */
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) gemm_init(g, r0 + r, j + 8 * v, &acc[r][v]);
    const float *a = g->A + r0 * g->ar;
    for (int64_t i = 0; i < m; i++) {
        const float *b = g->B + i * g->bs + j;
        const v8 b0 = LD(b), b1 = NV > 1 ? LD(b + 8) : b0;
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const v8 x = BC(a[r * g->ar + i * g->ai]);
            acc[r][0] += x * b0;
            if (NV > 1) acc[r][1] += x * b1;
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) ST(g->Y + (r0 + r) * g->ys + j + 8 * v, acc[r][v]);
}

/* one element: the same adds in the same order as a tile's lane */
AI void gemm_one(const gemm_args *g, int64_t r, int64_t j, int64_t m) {
    float acc = 0.0f;
    if (g->y0) acc = g->sc ? g->sc[r] * g->y0[r * g->y0s + j] : g->y0[r * g->y0s + j];
    for (int64_t i = 0; i < m; i++) acc += g->A[r * g->ar + i * g->ai] * g->B[i * g->bs + j];
    g->Y[r * g->ys + j] = acc;
}

AI void gemm_rows(const gemm_args *g, int64_t r0, const int NR) {
    const int64_t m = g->lower && r0 + NR < g->m ? r0 + NR : g->m;
    int64_t j = 0;
    for (; j + 16 <= g->n; j += 16) gemm_tile(g, r0, j, NR, 2, m);
    for (; j + 8 <= g->n; j += 8) gemm_tile(g, r0, j, NR, 1, m);
    for (; j < g->n; j++)
        for (int r = 0; r < NR; r++) gemm_one(g, r0 + r, j, m);
}

AI void gemm(const gemm_args *g) {
    int64_t r0 = 0;
    for (; r0 + 4 <= g->rows; r0 += 4) gemm_rows(g, r0, 4);
    for (; r0 < g->rows; r0++) gemm_rows(g, r0, 1);
}

/* one token: row by row, S = a S0 and S^T k; then S += k (x) delta and o = S^T q */
AI void token_step(const mpl_seq *s, int64_t t, const float *S0, float *S, float *delta) {
    const int64_t dk = s->dk, dv = s->dv;
    const float *q = s->q + t * s->qs, *k = s->k + t * s->ks, *v = s->v + t * s->vs;
    const float *a = s->decay + t * s->ds, beta = s->beta[t * s->bs];
    float *o = s->o + t * s->os;
    memset(delta, 0, (size_t)dv * sizeof(float));
    for (int64_t i = 0; i < dk; i++) {
        const float *r0 = S0 + i * dv, d = a[s->per_channel ? i : 0], ki = k[i];
        float *r = S + i * dv;
        int64_t j = 0;
        for (; j + 8 <= dv; j += 8) {
            const v8 x = LD(r0 + j) * BC(d);
            ST(r + j, x);
            ST(delta + j, LD(delta + j) + BC(ki) * x);
        }
        for (; j < dv; j++) {
            r[j] = r0[j] * d;
            delta[j] += ki * r[j];
        }
    }
    for (int64_t j = 0; j < dv; j++) delta[j] = (v[j] - delta[j]) * beta;
    memset(o, 0, (size_t)dv * sizeof(float));
    for (int64_t i = 0; i < dk; i++) {
        float *r = S + i * dv;
        const float ki = k[i], qi = q[i];
        int64_t j = 0;
        for (; j + 8 <= dv; j += 8) {
            const v8 x = LD(r + j) + BC(ki) * LD(delta + j);
            ST(r + j, x);
            ST(o + j, LD(o + j) + BC(qi) * x);
        }
        for (; j < dv; j++) {
            r[j] += ki * delta[j];
            o[j] += qi * r[j];
        }
    }
}

/* tokens t0..t0+L in the chunk form (the file comment's equations) */
AI void chunk_step(const mpl_seq *s, int64_t t0, int L, const float *S0, float *S, float *ws) {
    const int64_t dk = s->dk, dv = s->dv, w = dv + dk;
    /* Kd[j] = D(i,j) k_j at row i; UW rows [U | Wn]; Xq = G.q; N, P [L][L]; G [dk] */
    float *Kd = ws, *UW = Kd + L * dk, *Xq = UW + L * w, *N = Xq + L * dk, *P = N + L * L;
    float *G = P + L * L;
    for (int i = 0; i < L; i++) {
        const int64_t t = t0 + i;
        const float *q = s->q + t * s->qs, *k = s->k + t * s->ks, *a = s->decay + t * s->ds;
        const float beta = s->beta[t * s->bs];
        float *u = UW + i * w;
        if (s->per_channel) {
            if (i == 0) memcpy(G, a, (size_t)dk * sizeof(float));
            else vmul(G, G, a, dk);
            for (int j = 0; j < i; j++) vmul(Kd + j * dk, Kd + j * dk, a, dk);
        } else {
            if (i == 0) for (int64_t c = 0; c < dk; c++) G[c] = a[0];
            else vscale(G, G, a[0], dk);
            for (int j = 0; j < i; j++) vscale(Kd + j * dk, Kd + j * dk, a[0], dk);
        }
        memcpy(Kd + i * dk, k, (size_t)dk * sizeof(float));
        vmul(Xq + i * dk, q, G, dk);
        vscale(u, s->v + t * s->vs, beta, dv);
        vmul(u + dv, k, G, dk);
        vscale(u + dv, u + dv, -beta, dk);
        /* P_ij = q_i . D(i,j) k_j (j <= i, 0 above), N_ij = -beta_i k_i . D(i,j) k_j (j < i) */
        const float *qk[2] = {q, k};
        float *p = P + i * L, *nrow = N + i * L;
        int j = 0;
        for (; j + 4 <= i + 1; j += 4) vdots(qk, Kd, dk, j, 4, p, nrow);
        for (; j <= i; j++) vdots(qk, Kd, dk, j, 1, p, nrow);
        for (j = 0; j < i; j++) nrow[j] *= -beta;
        for (j = i + 1; j < L; j++) p[j] = 0.0f;
        /* forward substitution, row i: [U_i | Wn_i] += sum_{j<i} N_ij [U_j | Wn_j] */
        const gemm_args sub = {.Y = u, .y0 = u, .A = N + i * L, .ai = 1, .B = UW, .bs = w,
                               .rows = 1, .m = i, .n = w};
        gemm(&sub);
    }
    /* Delta = U + Wn S0, in place of U */
    const gemm_args delta = {.Y = UW, .ys = w, .y0 = UW, .y0s = w, .A = UW + dv, .ar = w, .ai = 1,
                             .B = S0, .bs = dv, .rows = L, .m = dk, .n = dv};
    gemm(&delta);
    /* o = Xq S0 + P Delta */
    float *o = s->o + t0 * s->os;
    const gemm_args inter = {.Y = o, .ys = s->os, .A = Xq, .ar = dk, .ai = 1, .B = S0, .bs = dv,
                             .rows = L, .m = dk, .n = dv};
    gemm(&inter);
    const gemm_args intra = {.Y = o, .ys = s->os, .y0 = o, .y0s = s->os, .A = P, .ar = L, .ai = 1,
                             .B = UW, .bs = w, .rows = L, .m = L, .n = dv, .lower = 1};
    gemm(&intra);
    /* S = diag(G) S0 + Kd^T Delta (S may be S0: row c is read before it is written) */
    const gemm_args state = {.Y = S, .ys = dv, .y0 = S0, .y0s = dv, .sc = G, .A = Kd, .ar = 1,
                             .ai = dk, .B = UW, .bs = w, .rows = dk, .m = L, .n = dv};
    gemm(&state);
}

AI void recur(const mpl_seq *s, int pos, int T, int L, const float *S0, float *S, float *ws) {
    const float *src = S0;
    for (int t = 0; t < T; src = S) {
        if (L > 1 && (pos + t) % L == 0 && t + L <= T) {
            chunk_step(s, t, L, src, S, ws);
            t += L;
        } else {
            token_step(s, t, src, S, ws);
            t++;
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) static void recur_avx2(const mpl_seq *s, int pos, int T, int L,
                                                       const float *S0, float *S, float *ws) {
    recur(s, pos, T, L, S0, S, ws);
}
#endif

uint64_t mpl_ws_floats(int64_t dk, int64_t dv, int L) {
    const uint64_t l = L > 1 ? (uint64_t)L : 0;
    return l * (uint64_t)(3 * dk + dv) + 2u * l * l + (uint64_t)dk + (uint64_t)dv;
}

void mpl_recur(const mpl_seq *s, int pos, int T, int L, const float *S0, float *S, float *ws,
               int simd) {
#if defined(__x86_64__) || defined(__i386__)
    if (simd) {
        recur_avx2(s, pos, T, L, S0, S, ws);
        return;
    }
#endif
    (void)simd;
    recur(s, pos, T, L, S0, S, ws);
}
