/* cache.c on spec/vectors/valid/mixtral2.moepack (2 banks x 4 experts, stride 4096): records are
 * the file's bytes under every budget; the budget holds; LRU vs frequency-first on a pattern
 * where they differ; pins survive pressure; prefetch hits; warm-up reads every record once when
 * the budget holds them all (and nothing otherwise); verify-reads names layer and expert, warm or
 * not; concurrent acquirers. Usage: test_cache VECTORS_DIR SCRATCH_DIR */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "io.h"
#include "t.h"

static mp_container *C;
static uint8_t *FILEBUF; /* whole file */
static size_t FILELEN;

static int same_as_file(int layer, int ex, const uint8_t *rec) {
    const mp_bank_info *b = mpc_bank(C, layer);
    return memcmp(rec, FILEBUF + b->offset + (uint64_t)ex * b->stride, b->stride) == 0;
}

static mp_experts *make(uint64_t budget, int policy, int direct, int verify) {
    mp_expert_options o;
    char err[256];
    mpe_options_default(&o);
    o.budget_bytes = budget; o.policy = policy; o.o_direct = direct; o.verify_reads = verify; o.reader_threads = 3;
    mp_experts *e = mpe_create(C, &o, err, sizeof err);
    CHECK(e != NULL, "mpe_create: %s", err);
    return e;
}

static int get1(mp_experts *e, int layer, int ex) { /* acquire + check + release one record */
    const uint8_t *r;
    char err[256];
    int rc = mpe_acquire(e, layer, &ex, 1, &r, err, sizeof err);
    CHECK(rc == MP_OK, "acquire %d/%d: %s", layer, ex, err);
    if (rc) return rc;
    CHECK(same_as_file(layer, ex, r), "bytes of %d/%d", layer, ex);
    CHECK(((uintptr_t)r % mpc_alignment(C)) == 0, "record alignment");
    mpe_release(e, layer, &ex, 1);
    return 0;
}

static void test_budgets(void) {
    uint64_t stride = mpc_bank(C, 0)->stride;
    uint64_t budgets[] = {0, stride, 3 * stride, 100 * stride};
    int directs[] = {MP_ODIRECT_AUTO, MP_ODIRECT_OFF};
    for (int d = 0; d < 2; d++)
        for (int bi = 0; bi < 4; bi++)
            for (int pol = 0; pol < 2; pol++) {
                mp_experts *e = make(budgets[bi], pol, directs[d], 1);
                if (!e) continue;
                mp_expert_stats s;
                for (int round = 0; round < 3; round++)
                    for (int L = 0; L < 2; L++)
                        for (int x = 0; x < 4; x++) {
                            get1(e, L, x);
                            mpe_stats(e, &s);
                            CHECK(s.used <= budgets[bi], "used %llu > budget", (unsigned long long)s.used);
                            CHECK(s.transient == 0, "transient after release");
                        }
                mpe_stats(e, &s);
                CHECK(s.hits + s.misses == 24, "counts");
                if (budgets[bi] == 0) CHECK(s.hits == 0 && s.used == 0, "budget 0 caches nothing");
                if (budgets[bi] >= 8 * stride) CHECK(s.misses == 8 && s.hits == 16, "large budget: %llu misses", (unsigned long long)s.misses);
                CHECK(s.bytes_read == s.misses * stride, "bytes_read");
                /* the memory plan's reserve: one record pinned at a time here */
                CHECK(s.peak_used <= budgets[bi], "peak used %llu", (unsigned long long)s.peak_used);
                CHECK(s.peak_allocated <= budgets[bi] + 2 * stride, "peak allocated %llu", (unsigned long long)s.peak_allocated);
                mpe_destroy(e);
            }
}

/* capacity 2 records; A is hot, then the cycle B C A: LRU evicts A every time, frequency-first
 * keeps it. */
static void test_policies(void) {
    uint64_t stride = mpc_bank(C, 0)->stride;
    uint64_t hits[2];
    for (int pol = 0; pol < 2; pol++) {
        mp_experts *e = make(2 * stride, pol, MP_ODIRECT_OFF, 0);
        if (!e) return;
        for (int i = 0; i < 4; i++) get1(e, 0, 0);
        mpe_reset_stats(e);
        for (int cyc = 0; cyc < 10; cyc++) { get1(e, 0, 1); get1(e, 0, 2); get1(e, 0, 0); }
        mp_expert_stats s;
        mpe_stats(e, &s);
        hits[pol] = s.hits;
        mpe_destroy(e);
    }
    printf("  cycle B C A x10 with room for 2: LRU %llu hits, LFU %llu hits\n", (unsigned long long)hits[MP_CACHE_LRU],
           (unsigned long long)hits[MP_CACHE_LFU]);
    CHECK(hits[MP_CACHE_LRU] == 0, "LRU hits %llu", (unsigned long long)hits[MP_CACHE_LRU]);
    CHECK(hits[MP_CACHE_LFU] == 10, "LFU hits %llu", (unsigned long long)hits[MP_CACHE_LFU]);
}

static void test_pins_and_prefetch(void) {
    uint64_t stride = mpc_bank(C, 0)->stride;
    char err[256];
    const uint8_t *r[4];
    int all[4] = {0, 1, 2, 3};
    mp_expert_stats s;
    /* room for one record, four pinned at once: three live outside the cache until release */
    mp_experts *e = make(stride, MP_CACHE_LFU, MP_ODIRECT_AUTO, 0);
    if (!e) return;
    CHECK(mpe_acquire(e, 1, all, 4, r, err, sizeof err) == MP_OK, "%s", err);
    for (int i = 0; i < 4; i++) CHECK(same_as_file(1, i, r[i]), "pinned %d", i);
    mpe_stats(e, &s);
    CHECK(s.used == stride && s.transient == 3 * stride, "used %llu transient %llu", (unsigned long long)s.used, (unsigned long long)s.transient);
    mpe_prefetch(e, 1, all, 4); /* nothing evictable: issues nothing */
    mpe_stats(e, &s);
    CHECK(s.prefetches == 0, "prefetch evicted a pinned record");
    mpe_release(e, 1, all, 4);
    mpe_stats(e, &s);
    CHECK(s.transient == 0 && s.used == stride, "after release");
    CHECK(s.spare <= 3 * stride, "recycled buffers bounded by the peak transient: %llu", (unsigned long long)s.spare);
    CHECK(s.allocated == s.used + s.transient + s.spare, "allocated %llu", (unsigned long long)s.allocated);
    CHECK(s.peak_allocated <= stride + 2 * 4 * stride, "peak allocated %llu beyond budget + 2 x the pinned group", (unsigned long long)s.peak_allocated);
    /* duplicates pin twice */
    int dup[3] = {2, 2, 2};
    CHECK(mpe_acquire(e, 0, dup, 3, r, err, sizeof err) == MP_OK && r[0] == r[1] && r[1] == r[2], "dups");
    mpe_release(e, 0, dup, 3);
    /* bad arguments */
    int badx = 4, neg = -1;
    CHECK(mpe_acquire(e, 0, &badx, 1, r, err, sizeof err) == MP_EINVAL && strstr(err, "expert 4"), "range: %s", err);
    CHECK(mpe_acquire(e, 0, &neg, 1, r, err, sizeof err) == MP_EINVAL, "negative");
    CHECK(mpe_acquire(e, 7, all, 1, r, err, sizeof err) == MP_EINVAL && strstr(err, "layer 7"), "no bank: %s", err);
    mpe_destroy(e);
    /* prefetch then acquire: all hits, same bytes */
    e = make(8 * stride, MP_CACHE_LRU, MP_ODIRECT_AUTO, 1);
    if (!e) return;
    mpe_prefetch(e, 0, all, 4);
    CHECK(mpe_acquire(e, 0, all, 4, r, err, sizeof err) == MP_OK, "%s", err);
    for (int i = 0; i < 4; i++) CHECK(same_as_file(0, i, r[i]), "prefetched %d", i);
    mpe_release(e, 0, all, 4);
    mpe_stats(e, &s);
    CHECK(s.prefetches == 4 && s.hits == 4 && s.misses == 0, "prefetch stats %llu/%llu/%llu", (unsigned long long)s.prefetches,
          (unsigned long long)s.hits, (unsigned long long)s.misses);
    printf("  %s\n", s.o_direct_note);
    mpe_destroy(e);
    /* destroy with prefetches in flight */
    e = make(8 * stride, MP_CACHE_LFU, MP_ODIRECT_AUTO, 0);
    if (e) { mpe_prefetch(e, 1, all, 4); mpe_destroy(e); }
}

static void test_verify_reads(const char *scratch) {
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/damaged.moepack", scratch);
    const mp_bank_info *b = mpc_bank(C, 1);
    uint8_t *copy = malloc(FILELEN);
    memcpy(copy, FILEBUF, FILELEN);
    copy[b->offset + 2 * b->stride + 10] ^= 0x40; /* layer 1, expert 2 */
    FILE *f = fopen(path, "wb");
    fwrite(copy, 1, FILELEN, f);
    fclose(f);
    free(copy);
    mp_container *dc = mpc_open(path, err, sizeof err);
    CHECK(dc != NULL, "damaged record must still open (no payload hashing at open): %s", err);
    if (!dc) return;
    for (int budget = 0; budget < 2; budget++) {
        mp_expert_options o;
        mpe_options_default(&o);
        o.verify_reads = 1;
        o.budget_bytes = budget ? 8 * b->stride : 0;
        o.warm = budget; /* the damaged record's warm read fails; the acquire reads it again */
        mp_experts *e = mpe_create(dc, &o, err, sizeof err);
        CHECK(e != NULL, "%s", err);
        if (!e) continue;
        int ex[3] = {0, 2, 3};
        const uint8_t *r[3];
        int rc = mpe_acquire(e, 1, ex, 3, r, err, sizeof err);
        CHECK(rc == MP_ECORRUPT, "rc %d", rc);
        CHECK(strstr(err, "layer 1 expert 2") != NULL, "message: %s", err);
        CHECK(get1(e, 1, 3) == 0, "others still fine");
        mp_expert_stats s;
        mpe_stats(e, &s);
        CHECK(s.transient == 0, "nothing left pinned after a failed acquire");
        mpe_destroy(e);
    }
    mp_expert_options o;
    mpe_options_default(&o);
    mp_experts *e = mpe_create(dc, &o, err, sizeof err); /* without verify the bytes just differ */
    int ex = 2;
    const uint8_t *r;
    CHECK(e && mpe_acquire(e, 1, &ex, 1, &r, err, sizeof err) == MP_OK, "unverified read");
    if (e) { mpe_release(e, 1, &ex, 1); mpe_destroy(e); }
    mpc_close(dc);
    unlink(path);
}

static mp_experts *make_warm(uint64_t budget) {
    mp_expert_options o;
    char err[256];
    mpe_options_default(&o);
    o.budget_bytes = budget;
    o.warm = 1;
    o.reader_threads = 4;
    mp_experts *e = mpe_create(C, &o, err, sizeof err);
    CHECK(e != NULL, "mpe_create: %s", err);
    return e;
}

static void test_warm(void) {
    uint64_t stride = mpc_bank(C, 0)->stride;
    mp_expert_stats s;
    mp_experts *e = make_warm(8 * stride);
    if (!e) return;
    for (int i = 0; i < 5000; i++) { /* up to 5 s for eight 4 KiB reads */
        mpe_stats(e, &s);
        if (s.reads == 8) break;
        usleep(1000);
    }
    for (int i = 0; i < 5000 && s.warming; i++) { /* the last read's completion is counted first */
        usleep(1000);
        mpe_stats(e, &s);
    }
    CHECK(s.warm_reads == 8 && s.reads == 8 && s.bytes_read == 8 * stride && !s.warming,
          "warm-up read every record once: %llu reads", (unsigned long long)s.reads);
    for (int L = 0; L < 2; L++)
        for (int x = 0; x < 4; x++) get1(e, L, x);
    mpe_stats(e, &s);
    CHECK(s.hits == 8 && s.misses == 0 && s.reads == 8 && s.evictions == 0, "then every acquire hits: %llu hits",
          (unsigned long long)s.hits);
    mpe_destroy(e);
    e = make_warm(8 * stride - 1); /* one byte short of every record: no warm-up */
    if (!e) return;
    get1(e, 0, 1);
    mpe_stats(e, &s);
    CHECK(s.warm_reads == 0 && s.reads == 1 && s.misses == 1, "no warm-up below every record");
    mpe_destroy(e);
    for (int i = 0; i < 20; i++) { /* destroyed with warm reads queued or in flight: returns */
        e = make_warm(8 * stride);
        if (i % 2 && e) get1(e, 1, 3);
        mpe_destroy(e);
    }
}

typedef struct { mp_experts *e; unsigned seed; int bad; } thr;

static void *hammer(void *arg) {
    thr *t = arg;
    char err[256];
    for (int i = 0; i < 300; i++) {
        int L = (int)(rand_r(&t->seed) % 2), n = 1 + (int)(rand_r(&t->seed) % 3), ex[3];
        const uint8_t *r[3];
        for (int k = 0; k < n; k++) ex[k] = (int)(rand_r(&t->seed) % 4);
        if (rand_r(&t->seed) % 4 == 0) mpe_prefetch(t->e, 1 - L, ex, n);
        if (mpe_acquire(t->e, L, ex, n, r, err, sizeof err) != MP_OK) { t->bad++; continue; }
        for (int k = 0; k < n; k++) t->bad += !same_as_file(L, ex[k], r[k]);
        mpe_release(t->e, L, ex, n);
    }
    return NULL;
}

static void test_threads(void) {
    uint64_t stride = mpc_bank(C, 0)->stride;
    for (int pol = 0; pol < 2; pol++) {
        mp_experts *e = make(3 * stride, pol, MP_ODIRECT_AUTO, 1);
        if (!e) return;
        pthread_t th[3];
        thr t[3];
        for (int i = 0; i < 3; i++) { t[i].e = e; t[i].seed = 11u + (unsigned)i; t[i].bad = 0; pthread_create(&th[i], NULL, hammer, &t[i]); }
        for (int i = 0; i < 3; i++) { pthread_join(th[i], NULL); CHECK(t[i].bad == 0, "thread %d: %d bad", i, t[i].bad); }
        mp_expert_stats s;
        mpe_stats(e, &s);
        CHECK(s.used <= 3 * stride && s.transient == 0, "after threads");
        mpe_destroy(e);
    }
}

int main(int argc, char **argv) {
    const char *vec = argc > 1 ? argv[1] : "../spec/vectors";
    const char *scratch = argc > 2 ? argv[2] : "/tmp";
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/valid/mixtral2.moepack", vec);
    C = mpc_open(path, err, sizeof err);
    CHECK(C != NULL, "%s", err);
    if (!C) T_DONE("test_cache");
    FILELEN = mpc_file_size(C);
    FILEBUF = malloc(FILELEN);
    CHECK(mpc_read_at(C, 0, FILEBUF, FILELEN, err, sizeof err) == MP_OK, "%s", err);
    CHECK(mpc_bank_count(C) == 2 && mpc_bank(C, 0)->count == 4, "vector shape changed");
    test_budgets();
    test_policies();
    test_pins_and_prefetch();
    test_warm();
    test_verify_reads(scratch);
    test_threads();
    free(FILEBUF);
    mpc_close(C);
    T_DONE("test_cache");
}
