/* Token sampling: greedy, temperature, top-k, top-p, with a seeded xoshiro256** RNG whose whole
 * state is one u64 (splitmix64 stepping), so Python can hold it. */
#include "moepack.h"

#include <math.h>
#include <stdlib.h>

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t mp_rng_seed(uint64_t seed) { return seed ^ 0x6A09E667F3BCC909ull; }

typedef struct {
    float p;
    int32_t id;
} cand;

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id); /* ties: lower id first */
}

static int32_t argmax(const float *l, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

int32_t mp_sample(const float *logits, int vocab, const mp_sampler *s, uint64_t *rng) {
    if (vocab <= 0 || !logits) return -1;
    if (!s || !(s->temperature > 0.0f) || s->top_k == 1) return argmax(logits, vocab);
    cand *c = malloc((size_t)vocab * sizeof *c);
    if (!c) return argmax(logits, vocab);
    float m = logits[argmax(logits, vocab)];
    for (int i = 0; i < vocab; i++) {
        c[i].p = (float)exp((double)(logits[i] - m) / s->temperature);
        c[i].id = i;
    }
    qsort(c, (size_t)vocab, sizeof *c, cand_cmp);
    int n = vocab;
    if (s->top_k > 0 && s->top_k < n) n = s->top_k;
    double total = 0.0;
    for (int i = 0; i < n; i++) total += c[i].p;
    if (s->top_p > 0.0f && s->top_p < 1.0f) { /* smallest prefix with mass >= top_p */
        double acc = 0.0;
        for (int i = 0; i < n; i++) {
            acc += c[i].p;
            if (acc >= s->top_p * total) {
                n = i + 1;
                total = acc;
                break;
            }
        }
    }
    uint64_t st = rng ? *rng : 0;
    double u = (double)(splitmix(&st) >> 11) * 0x1.0p-53 * total;
    if (rng) *rng = st;
    int32_t pick = c[n - 1].id;
    double acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc) {
            pick = c[i].id;
            break;
        }
    }
    free(c);
    return pick;
}
