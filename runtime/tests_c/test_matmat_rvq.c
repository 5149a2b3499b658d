/* Routed-expert matrix times many inputs (mpk_rvq_matmat, the prefill path) at prompt-sized token
 * counts: every output row equals the scalar single-input mpk_rvq_matvec bit for bit, for every
 * kernel path, thread count and token count (1, a partial input set, and counts whose tables
 * outgrow the caches: 64 and 200), with a NaN input and a zero input among finite ones. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "t.h"

static uint64_t rng = 0x13198a2e03707344ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float urand(void) { return (float)(rnd() % 2000001) / 1e6f - 1.0f; }
static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

enum { NMAX = 200 };

/* One shape: random codes, f16 scales in [0.01, 0.11), codebooks shrinking per stage. */
static void check_shape(const mpk_impl *const *paths, int npaths, mpk_pool *const *pools, int npools,
                        int64_t rows, int64_t cols, int S) {
    uint64_t nbytes = mpk_rvq_nbytes(rows, cols, S);
    uint8_t *part = malloc(nbytes);
    for (uint64_t i = 0; i < nbytes; i++) part[i] = (uint8_t)rnd();
    mpk_rvq w;
    mpk_rvq_init(&w, rows, cols, S, part);
    for (int64_t r = 0; r < rows; r++) {
        uint16_t h = mpk_f32_to_f16(0.01f + (float)(rnd() % 1000) / 1e4f);
        memcpy((uint8_t *)w.scales + 2 * r, &h, 2);
    }
    float *cb = malloc((size_t)S * 2048 * 4), *cbt = malloc((size_t)S * 2048 * 4);
    for (int t = 0; t < S; t++)
        for (int i = 0; i < 2048; i++) cb[t * 2048 + i] = urand() / (float)(1 << t);
    mpk_rvq_transpose_cb(cb, S, cbt);

    size_t tb = mpk_rvq_tab_bytes(cols, S);
    uint8_t *mem = malloc(tb * NMAX);
    float *x = malloc((size_t)cols * 4), *want = malloc((size_t)(NMAX * rows) * 4);
    float *y = malloc((size_t)(NMAX * rows) * 4);
    mpk_rvq_tab tabs[NMAX];
    const mpk_rvq_tab *tp[NMAX];
    for (int i = 0; i < NMAX; i++) {
        for (int64_t c = 0; c < cols; c++) x[c] = i == 5 ? 0.0f : urand() * (float)(1 + i % 9);
        if (i == 11) x[cols / 2] = NAN; /* this input's product is NaN, its neighbours' are not */
        mpk_rvq_tab_init(&tabs[i], mem + tb * (size_t)i, cols, S);
        mpk_rvq_tables(NULL, NULL, cbt, x, &tabs[i]);
        tp[i] = &tabs[i];
        mpk_rvq_matvec(NULL, NULL, &w, &tabs[i], want + (size_t)i * (size_t)rows);
    }
    /* the block path's workspace: the caller's (exactly mpk_rvq_block_bytes, so ASan sees an
     * overrun) for odd counts, allocated by the call for even ones */
    void *wsmem = malloc(mpk_rvq_block_bytes(rows, cols, S));
    static const int64_t ns[] = {1, 3, 17, 64, 150, NMAX};
    for (int k = 0; k < npaths; k++)
        for (int p = 0; p < npools; p++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                /* inputs from 4 (n <= 3: the zero one) or 8 (the NaN one among finite ones) */
                int64_t n = ns[ni], off = n == NMAX ? 0 : n <= 3 ? 4 : 8, bad = -1;
                void *ws = n % 2 ? wsmem : NULL;
                memset(y, 0x55, (size_t)(n * rows) * 4);
                mpk_rvq_matmat(paths[k], pools[p], &w, tp + off, n, y, ws);
                for (int64_t e = 0; e < n * rows && bad < 0; e++)
                    if (bits(y[e]) != bits(want[off * rows + e])) bad = e;
                CHECK(bad < 0, "rvq %lldx%lld S %d path %s threads %d n %lld: element %lld %a != %a", (long long)rows,
                      (long long)cols, S, mpk_impl_name(paths[k]), mpk_pool_threads(pools[p]), (long long)n,
                      (long long)bad, bad < 0 ? 0.0 : (double)y[bad], bad < 0 ? 0.0 : (double)want[off * rows + bad]);
            }
    free(wsmem);
    free(part);
    free(cb);
    free(cbt);
    free(mem);
    free(x);
    free(want);
    free(y);
}

int main(void) {
    const mpk_impl *paths[3];
    int np = 0;
    paths[np++] = mpk_select(MPK_SCALAR);
    if (mpk_select(MPK_AVX2)) paths[np++] = mpk_select(MPK_AVX2);
    if (mpk_select(MPK_AVX512VBMI)) paths[np++] = mpk_select(MPK_AVX512VBMI);
    mpk_pool *pools[3] = {NULL, mpk_pool_create(2), mpk_pool_create(3)};
    /* 130 rows: a partial third tile; 264 columns: a partial second table group.  1100 rows (18
     * tiles): with few inputs the tiles split into ranges across threads. */
    check_shape(paths, np, pools, 3, 130, 264, 3);
    check_shape(paths, np, pools, 3, 1100, 72, 2);
    mpk_pool_destroy(pools[1]);
    mpk_pool_destroy(pools[2]);
    T_DONE("test_matmat_rvq");
}
