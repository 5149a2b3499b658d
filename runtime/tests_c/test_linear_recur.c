/* The delta rule over a call (linear_recur.c): the chunk form against the token form and both
 * against a float64 token-by-token reference, over long sequences, per-head (Gated DeltaNet) and
 * per-channel (KDA) decay from near 1 to near 0, awkward head sizes; the SSE2 and AVX2 builds
 * give the same bits, a call split at a multiple of the sub-chunk the same as one call (its
 * second part reading one state and writing another, the single call in place), a split inside
 * a sub-chunk within the bound.  The bound asserted is docs/RUNTIME.md's. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "linear_ops.h"
#include "t.h"

/* largest |chunk form - token form| / largest |token form| over every output of a sequence */
#define BOUND 2e-5
/* largest |either form - the float64 reference| / largest |reference|: measured at most 7.64e-7
 * (chunk form, 128 x 128 KDA, L 32) and 4.66e-7 (token form) over the shapes below */
#define F64_BOUND 3e-6

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double unif(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}
static float gauss(void) { return (float)(sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif())); }

typedef struct {
    int64_t dk, dv;
    int per_channel, T;
    float *q, *k, *v, *decay, *beta;
} seq;

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* q, k L2-normalised (q / sqrt(dk)), v and log-decay rates as the models make them:
 * a = exp(-exp(A) softplus(x + dt)), A in [-4, 2.8] per head (or per channel) */
static void fill(seq *s, int64_t dk, int64_t dv, int per_channel, int T) {
    const int64_t nd = per_channel ? dk : 1;
    *s = (seq){dk, dv, per_channel, T, malloc(sizeof(float) * (size_t)(T * dk)),
               malloc(sizeof(float) * (size_t)(T * dk)), malloc(sizeof(float) * (size_t)(T * dv)),
               malloc(sizeof(float) * (size_t)(T * nd)), malloc(sizeof(float) * (size_t)T)};
    float A[512];
    for (int64_t c = 0; c < nd; c++) A[c] = expf((float)(-4.0 + 6.8 * unif()));
    for (int t = 0; t < T; t++) {
        float *q = s->q + t * dk, *k = s->k + t * dk;
        for (int64_t i = 0; i < dk; i++) q[i] = gauss(), k[i] = gauss();
        mpl_l2norm(q, dk, 1.0f / sqrtf((float)dk));
        mpl_l2norm(k, dk, 1.0f);
        for (int64_t i = 0; i < dv; i++) s->v[t * dv + i] = gauss();
        for (int64_t c = 0; c < nd; c++) s->decay[t * nd + c] = expf(-A[c] * softplus(gauss() - 1.0f));
        s->beta[t] = 1.0f / (1.0f + expf(-2.0f * gauss()));
    }
}

static void run(const seq *s, int pos, int t0, int T, int L, const float *S0, float *S, float *o,
                int simd) {
    const int64_t nd = s->per_channel ? s->dk : 1;
    const mpl_seq m = {s->q + t0 * s->dk, s->k + t0 * s->dk, s->v + t0 * s->dv,
                       s->decay + t0 * nd, s->beta + t0, s->dk, s->dk, s->dv, nd, 1,
                       o + t0 * s->dv, s->dv, s->dk, s->dv, s->per_channel};
    float *ws = malloc(sizeof(float) * (size_t)mpl_ws_floats(s->dk, s->dv, L));
    mpl_recur(&m, pos, T, L, S0, S, ws, simd);
    free(ws);
}

/* the token form in float64 */
static void reference(const seq *s, double *o) {
    const int64_t dk = s->dk, dv = s->dv, nd = s->per_channel ? dk : 1;
    double *S = calloc((size_t)(dk * dv), sizeof(double)), *d = malloc(sizeof(double) * (size_t)dv);
    for (int t = 0; t < s->T; t++) {
        const float *q = s->q + t * dk, *k = s->k + t * dk, *a = s->decay + t * nd;
        for (int64_t j = 0; j < dv; j++) d[j] = 0.0;
        for (int64_t i = 0; i < dk; i++)
            for (int64_t j = 0; j < dv; j++) {
                S[i * dv + j] *= a[s->per_channel ? i : 0];
                d[j] += k[i] * S[i * dv + j];
            }
        for (int64_t j = 0; j < dv; j++) d[j] = (s->v[t * dv + j] - d[j]) * s->beta[t];
        for (int64_t j = 0; j < dv; j++) {
            double acc = 0.0;
            for (int64_t i = 0; i < dk; i++) {
                S[i * dv + j] += k[i] * d[j];
                acc += q[i] * S[i * dv + j];
            }
            o[t * dv + j] = acc;
        }
    }
    free(S);
    free(d);
}

static double rel(const float *a, const float *b, const double *ref, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double x = a[i], y = b ? (double)b[i] : ref[i];
        num = fmax(num, fabs(x - y));
        den = fmax(den, fabs(y));
    }
    return num / den;
}

int main(void) {
    const int simd = __builtin_cpu_supports("avx2");
    if (!simd) printf("SKIPPED: no AVX2 on this CPU, so the portable vs avx2 build comparisons are not run\n");
    /* dk, dv, per-channel decay; tiny models' heads, odd sizes, the published 128 x 128 */
    const struct { int64_t dk, dv; int per_channel, T; } shapes[] = {
        {6, 6, 1, 2048}, {8, 6, 0, 2048}, {13, 21, 0, 1500}, {24, 17, 1, 1500},
        {128, 128, 0, 600}, {128, 128, 1, 600}};
    const int Ls[] = {16, 32, 64};
    double worst = 0.0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int seed = 0; seed < 3; seed++) {
            seq s;
            fill(&s, shapes[si].dk, shapes[si].dv, shapes[si].per_channel, shapes[si].T);
            const int64_t dk = s.dk, dv = s.dv, T = s.T, n = T * dv;
            const size_t sb = sizeof(float) * (size_t)(dk * dv), ob = sizeof(float) * (size_t)n;
            float *zero = calloc(1, sb), *St = calloc(1, sb), *Sc = calloc(1, sb), *Sx = calloc(1, sb);
            float *ot = malloc(ob), *oc = malloc(ob), *ox = malloc(ob);
            double *oref = malloc(sizeof(double) * (size_t)n);
            reference(&s, oref);
            run(&s, 0, 0, (int)T, 1, zero, St, ot, simd);
            const double tok = rel(ot, NULL, oref, n);
            CHECK(tok <= F64_BOUND, "dk %lld dv %lld: token form vs f64 %g", (long long)dk, (long long)dv, tok);
            for (size_t li = 0; li < sizeof Ls / sizeof *Ls; li++) {
                const int L = Ls[li];
                run(&s, 0, 0, (int)T, L, zero, Sc, oc, simd);
                const double d = rel(oc, ot, NULL, n), dS = rel(Sc, St, NULL, dk * dv);
                worst = fmax(worst, fmax(d, dS));
                printf("dk %3lld dv %3lld %s T %4lld seed %d L %2d: |chunk - token| %.2e (state %.2e); "
                       "vs f64: chunk %.2e token %.2e\n", (long long)dk, (long long)dv,
                       s.per_channel ? "KDA" : "GDN", (long long)T, seed, L, d, dS,
                       rel(oc, NULL, oref, n), tok);
                CHECK(d <= BOUND && dS <= BOUND, "dk %lld L %d: %g %g", (long long)dk, L, d, dS);
                CHECK(rel(oc, NULL, oref, n) <= F64_BOUND, "dk %lld dv %lld L %d: chunk form vs f64 %g",
                      (long long)dk, (long long)dv, L, rel(oc, NULL, oref, n));
                /* the portable build, in place from the second call on: the same bits */
                memset(Sx, 0, sb);
                run(&s, 0, 0, 40, L, Sx, Sx, ox, 0);
                run(&s, 40, 40, (int)T - 40, L, Sx, Sx, ox, 0);
                /* calls split at 2L, the second reading one state and writing another: the
                 * same bits as one call (which updates its state in place) */
                float *Sy = calloc(1, sb), *Sw = calloc(1, sb), *oy = malloc(ob);
                run(&s, 0, 0, 2 * L, L, zero, Sy, oy, simd);
                run(&s, 2 * L, 2 * L, (int)T - 2 * L, L, Sy, Sw, oy, simd);
                CHECK(!memcmp(oy, oc, ob) && !memcmp(Sw, Sc, sb), "split at %d: other bits", 2 * L);
                free(Sw);
                /* split at 40 (inside a sub-chunk): those tokens in the token form, within the bound */
                CHECK(rel(ox, ot, NULL, n) <= BOUND, "split at 40: %g", rel(ox, ot, NULL, n));
                /* the SIMD build of the same split: the portable bits */
                float *Sz = calloc(1, sb), *oz = malloc(ob);
                run(&s, 0, 0, 40, L, Sz, Sz, oz, simd);
                run(&s, 40, 40, (int)T - 40, L, Sz, Sz, oz, simd);
                if (simd) CHECK(!memcmp(oz, ox, ob) && !memcmp(Sz, Sx, sb), "portable vs avx2 build, L %d", L);
                free(Sz);
                free(oz);
                free(Sy);
                free(oy);
            }
            /* the portable build of one whole call gives the SIMD build's bits */
            run(&s, 0, 0, (int)T, 16, zero, Sx, ox, 0);
            run(&s, 0, 0, (int)T, 16, zero, Sc, oc, simd);
            if (simd) CHECK(!memcmp(ox, oc, ob) && !memcmp(Sx, Sc, sb), "portable vs avx2 build, L 16");
            free(zero), free(St), free(Sc), free(Sx), free(ot), free(oc), free(ox), free(oref);
            free(s.q), free(s.k), free(s.v), free(s.decay), free(s.beta);
        }
    printf("largest |chunk - token| / scale: %.2e (bound %.0e)\n", worst, BOUND);
    T_DONE("test_linear_recur");
}
