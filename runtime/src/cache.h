/* Expert access for the forward pass: a byte-budgeted cache of expert records in front of the
 * reader pool.
 *
 *   mpe_acquire(layer, experts[n])  issues reads for every miss at once, blocks until all n
 *                                   records are present, pins them, returns pointers
 *   mpe_release(layer, experts[n])  unpins (same list as acquire)
 *   mpe_prefetch(layer, experts[n]) async hint; never evicts pinned or in-flight records, never
 *                                   changes results (records are immutable bytes)
 *
 * Warm-up (opt.warm): when the budget holds every record, create starts reading all of them in
 * file order in the background, max(1, reader_threads / 2) at a time, so the forward pass's own
 * reads wait behind at most that many; it never evicts and stops at destroy.
 * A record the forward pass needs while its warm read is in flight waits for that read (a hit).
 *
 * Budget: bytes of cached records (each costs its bank stride). Pinned records that do not fit
 * (or budget 0 = no cache) live in scratch buffers for the duration of the pin and are freed on
 * release, so the cache never exceeds the budget; the transient extra is at most one acquire's
 * working set. Policies: MP_CACHE_LRU (evict least recently used) and MP_CACHE_LFU (evict the
 * lowest access count, ties by least recent; counts persist across evictions). A peer measured
 * LRU at 5% hits where frequency-first kept 29%.
 *
 * Record buffers are aligned to mp_io_buffer_alignment (>= container alignment). With
 * verify_reads each record's BLAKE3 is compared with the bank's expert_hashes on every read;
 * a mismatch fails the acquire with MP_ECORRUPT and "layer L expert E: ..." in err.
 * All functions are thread-safe. */
#ifndef MP_CACHE_H
#define MP_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "container.h"

typedef struct {
    uint64_t budget_bytes; /* bytes of cached records; 0 = no cache */
    int policy;            /* MP_CACHE_LRU or MP_CACHE_LFU (moepack.h) */
    int reader_threads;    /* 0 = default (4) */
    int o_direct;          /* -1 auto (probe), 0 off, 1 require */
    int verify_reads;      /* 1 = hash every record read */
    int warm;              /* 1 = read every record in the background when the budget holds all */
} mp_expert_options;

typedef struct {
    uint64_t hits;          /* acquired records already cached or in flight from a prefetch */
    uint64_t misses;        /* acquired records that had to be read */
    uint64_t bytes_read;    /* all record reads (misses + prefetches) */
    uint64_t reads;         /* number of record reads */
    uint64_t read_ns;       /* time reader threads spent in pread (summed over threads) */
    uint64_t wait_ns;       /* time mpe_acquire blocked waiting for reads */
    uint64_t prefetches;    /* prefetch reads issued */
    uint64_t warm_reads;    /* warm-up reads issued */
    int warming;            /* 1 while the warm-up has records left to read or in flight */
    uint64_t evictions;
    int o_direct_active;
    char o_direct_note[160];
    uint64_t budget;        /* budget_bytes */
    uint64_t used;          /* bytes of cached records now */
    uint64_t transient;     /* bytes of pinned records held outside the cache now */
    uint32_t cached_records;
    uint64_t spare;         /* bytes of recycled record buffers kept for reuse (see cache.c) */
    uint64_t peak_used;     /* most bytes of cached records at once, since create */
    uint64_t allocated;     /* bytes of record buffers allocated now (used + transient + spare) */
    uint64_t peak_allocated;/* most of allocated at once, since create: at most budget + 2 x one
                               acquire's records (pinned beyond the cache, and as many recycled) */
} mp_expert_stats;

typedef struct mp_experts mp_experts;

void mpe_options_default(mp_expert_options *opt);
/* The most the cache's bookkeeping holds beside the record buffers, for `records` records in
 * the container (in the memory plan) */
uint64_t mpe_bookkeeping_bytes(uint64_t records);
/* c must outlive the returned object. */
mp_experts *mpe_create(const mp_container *c, const mp_expert_options *opt, char *err, size_t errlen);
void mpe_destroy(mp_experts *e);

/* records[i] = record of experts[i] (stride bytes; parts at bank->parts[p].offset).
 * MP_OK, MP_EINVAL (no bank / expert out of range), MP_EIO, MP_ECORRUPT, MP_ENOMEM.
 * On failure nothing stays pinned. Duplicates in experts[] are allowed (pinned twice). */
int mpe_acquire(mp_experts *e, int layer, const int *experts, int n, const uint8_t **records,
                char *err, size_t errlen);
void mpe_release(mp_experts *e, int layer, const int *experts, int n);
void mpe_prefetch(mp_experts *e, int layer, const int *experts, int n);

/* A new budget for the cached records: a smaller one evicts by policy at once (waiting for
 * records still being read), a larger one fills as records are used.  Pinned records stay. */
void mpe_set_budget(mp_experts *e, uint64_t budget_bytes);
void mpe_stats(mp_experts *e, mp_expert_stats *out);
void mpe_reset_stats(mp_experts *e); /* zero the counters (hits .. evictions) */

#endif
