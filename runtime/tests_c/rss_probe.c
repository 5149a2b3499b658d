/* RSS of the expert cache under load (driven by tests/test_runtime_cache.py): random acquires of
 * N experts for ITER steps with a byte budget; prints the peak VmRSS growth over the baseline taken
 * after mpe_create, sampled while records are pinned. Usage: rss_probe FILE BUDGET ITER N */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

static long long vmrss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    char err[512];
    mp_container *c = mpc_open(argv[1], err, sizeof err);
    if (!c) { fprintf(stderr, "%s\n", err); return 1; }
    mp_expert_options o;
    mpe_options_default(&o);
    o.budget_bytes = strtoull(argv[2], NULL, 10);
    int iters = atoi(argv[3]), n = atoi(argv[4]);
    mp_experts *e = mpe_create(c, &o, err, sizeof err);
    if (!e || n < 1 || n > 64) { fprintf(stderr, "%s\n", err); return 1; }
    const mp_bank_info *b = mpc_bank_at(c, 0);
    long long base = vmrss(), peak = base;
    unsigned seed = 1;
    int ex[64];
    const uint8_t *rec[64];
    for (int it = 0; it < iters; it++) {
        for (int k = 0; k < n; k++) { /* distinct, like a router's top-k */
            int x, dup;
            do {
                x = (int)((unsigned)rand_r(&seed) % b->count);
                dup = 0;
                for (int j = 0; j < k; j++) dup |= ex[j] == x;
            } while (dup && (uint32_t)k < b->count);
            ex[k] = x;
        }
        if (mpe_acquire(e, b->layer, ex, n, rec, err, sizeof err) != MP_OK) { fprintf(stderr, "%s\n", err); return 1; }
        long long r = vmrss();
        if (r > peak) peak = r;
        mpe_release(e, b->layer, ex, n);
    }
    mp_expert_stats s;
    mpe_stats(e, &s);
    printf("growth %lld used %llu spare %llu stride %llu hits %llu misses %llu\n", peak - base,
           (unsigned long long)s.used, (unsigned long long)s.spare, (unsigned long long)b->stride,
           (unsigned long long)s.hits, (unsigned long long)s.misses);
    mpe_destroy(e);
    mpc_close(c);
    return 0;
}
