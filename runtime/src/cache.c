/* Expert cache: records keyed by (bank, expert), bounded by a byte budget, filled through the
 * reader pool. One mutex guards everything; reads and hashing run on reader threads outside it.
 * Victim search is a linear scan of the cached records: O(cached) per miss, negligible next to
 * a multi-MB read, and it keeps the policies exact and easy to test. */
#define _GNU_SOURCE
#include "cache.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blake3.h"
#include "io.h"
#include "seterr.h"

enum { ST_LOADING, ST_READY, ST_ERROR };

typedef struct entry {
    struct mp_experts *owner;
    size_t bank;
    int expert;
    uint8_t *buf;
    uint64_t size;      /* bank stride */
    int state;
    int status;         /* MP_OK or the read / verify error */
    int pins;
    int cached;         /* 1: counts against the budget and sits in e->cached */
    int warm;           /* a warm-up read still in flight */
    size_t cpos;        /* index in e->cached */
    uint64_t last_use;
    mp_io_req req;
} entry;

typedef struct {
    const mp_bank_info *b;
    entry **slot;       /* [count]: present (loading, ready, or failed) records */
    uint32_t *freq;     /* [count]: accesses; persists across evictions (frequency-first policy) */
    uint8_t *hashes;    /* [count * 32] when verify_reads */
} bankrt;

struct mp_experts {
    const mp_container *c;
    mp_expert_options opt;
    mp_io *io;
    mp_io_pool *pool;
    size_t balign;
    bankrt *banks;
    size_t nbanks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    entry **cached;
    size_t ncached, capcached;
    uint64_t used, transient, tick;
    /* recycled record buffers (already faulted in): a fresh multi-MB buffer per read costs page
     * faults and zeroing. Kept to at most max(peak transient, one stride) bytes: memory the
     * process has already held at once. */
    void *spare;                  /* singly linked through the first bytes of each buffer */
    uint64_t spare_bytes, peak_transient, max_stride;
    uint64_t allocated, peak_allocated, peak_used; /* record buffer bytes (memory plan checks) */
    /* warm-up: the next (bank, expert) to read, its reads in flight and their limit */
    size_t warm_bank;
    uint32_t warm_next;
    int warm_inflight, warm_max, warm_stop;
    mp_expert_stats st;
};

static entry *start_read(mp_experts *e, size_t bi, int ex, int pins, int may_cache, int *rc);

uint64_t mpe_bookkeeping_bytes(uint64_t records) {
    /* an entry while it is read or cached (with its malloc header), its slot, access count and
     * hash, and its place in e->cached (which grows by doubling) */
    return records * (sizeof(entry) + 16 + sizeof(entry *) + sizeof(uint32_t) + 32 + 2 * sizeof(entry *));
}

/* Issues warm-up reads in file order up to warm_max in flight (so the forward pass's reads queue
 * behind at most that many); lock held. Stops for good at the first record that would not fit
 * without evicting, or when a buffer cannot be had. */
static void warm_more(mp_experts *e) {
    while (!e->warm_stop && e->warm_inflight < e->warm_max &&
           e->warm_bank < e->nbanks) {
        const mp_bank_info *bi = mpc_bank_at(e->c, e->warm_bank);
        if (e->warm_next >= bi->count) {
            e->warm_bank++;
            e->warm_next = 0;
            continue;
        }
        int ex = (int)e->warm_next++, rc;
        if (e->banks[e->warm_bank].slot[ex]) continue;
        entry *en = e->used + bi->stride <= e->opt.budget_bytes ? start_read(e, e->warm_bank, ex, 0, 1, &rc) : NULL;
        if (!en) {
            e->warm_stop = 1;
            break;
        }
        en->warm = 1;
        e->warm_inflight++;
        e->st.warm_reads++;
    }
}

typedef struct spare_hdr { void *next; uint64_t size; } spare_hdr;

static uint8_t *get_buf(mp_experts *e, uint64_t size) {
    void **link = &e->spare;
    while (*link) {
        spare_hdr *h = *link;
        if (h->size == size) {
            *link = h->next;
            e->spare_bytes -= size;
            return (uint8_t *)h;
        }
        link = &h->next;
    }
    uint8_t *buf = mp_buffer_alloc(e->balign, (size_t)size);
    if (buf) {
        e->allocated += size;
        if (e->allocated > e->peak_allocated) e->peak_allocated = e->allocated;
    }
    return buf;
}

static void put_buf(mp_experts *e, uint8_t *buf, uint64_t size) {
    uint64_t cap = e->peak_transient > e->max_stride ? e->peak_transient : e->max_stride;
    if (size < sizeof(spare_hdr) || e->spare_bytes + size > cap) {
        mp_buffer_free(buf, e->balign, (size_t)size);
        e->allocated -= size;
        return;
    }
    spare_hdr *h = (spare_hdr *)(void *)buf;
    h->next = e->spare;
    h->size = size;
    e->spare = h;
    e->spare_bytes += size;
}

void mpe_options_default(mp_expert_options *o) {
    memset(o, 0, sizeof *o);
    o->policy = MP_CACHE_LFU;
    o->reader_threads = 4;
    o->o_direct = MP_ODIRECT_AUTO;
}

static void on_read(mp_io_req *r) {
    entry *en = r->user;
    mp_experts *e = en->owner;
    int status = r->status;
    if (status == MP_OK && e->opt.verify_reads) {
        uint8_t d[32];
        mp_blake3_hash(en->buf, (size_t)en->size, d);
        if (memcmp(d, e->banks[en->bank].hashes + 32ull * (uint64_t)en->expert, 32) != 0) {
            status = MP_ECORRUPT;
            snprintf(r->err, sizeof r->err, "record hash mismatch at offset %llu (damaged expert record)", (unsigned long long)r->off);
        }
    }
    pthread_mutex_lock(&e->mu);
    en->status = status;
    en->state = status == MP_OK ? ST_READY : ST_ERROR;
    e->st.reads++;
    e->st.read_ns += r->read_ns;
    if (r->status == MP_OK) e->st.bytes_read += en->size;
    if (en->warm) {
        en->warm = 0;
        e->warm_inflight--;
        warm_more(e);
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void free_entry(mp_experts *e, entry *en) {
    bankrt *b = &e->banks[en->bank];
    if (b->slot[en->expert] == en) b->slot[en->expert] = NULL;
    if (en->cached) {
        size_t last = e->ncached - 1;
        e->cached[en->cpos] = e->cached[last];
        e->cached[en->cpos]->cpos = en->cpos;
        e->ncached--;
        e->used -= en->size;
    } else {
        e->transient -= en->size;
    }
    put_buf(e, en->buf, en->size);
    free(en);
}

/* Evicts unpinned, settled records by policy until size more bytes fit. 0 ok, -1 cannot. */
static int make_room(mp_experts *e, uint64_t size) {
    if (size > e->opt.budget_bytes) return -1;
    while (e->used + size > e->opt.budget_bytes) {
        entry *v = NULL;
        uint32_t vf = 0;
        for (size_t i = 0; i < e->ncached; i++) {
            entry *x = e->cached[i];
            if (x->pins || x->state == ST_LOADING) continue;
            uint32_t f = e->opt.policy == MP_CACHE_LFU ? e->banks[x->bank].freq[x->expert] : 0;
            if (!v || f < vf || (f == vf && x->last_use < v->last_use)) { v = x; vf = f; }
        }
        if (!v) return -1;
        free_entry(e, v);
        e->st.evictions++;
    }
    return 0;
}

/* New record read for (bank, expert); caller holds the lock. */
static entry *start_read(mp_experts *e, size_t bi, int ex, int pins, int may_cache, int *rc) {
    bankrt *b = &e->banks[bi];
    entry *en = calloc(1, sizeof *en);
    uint8_t *buf = en ? get_buf(e, b->b->stride) : NULL;
    if (!buf) { free(en); *rc = MP_ENOMEM; return NULL; }
    en->owner = e; en->bank = bi; en->expert = ex; en->buf = buf; en->size = b->b->stride;
    en->state = ST_LOADING; en->pins = pins; en->last_use = e->tick;
    if (may_cache && make_room(e, en->size) == 0) {
        if (e->ncached == e->capcached) {
            size_t cap = e->capcached ? e->capcached * 2 : 64;
            entry **nc = realloc(e->cached, cap * sizeof *nc);
            if (!nc) { put_buf(e, buf, b->b->stride); free(en); *rc = MP_ENOMEM; return NULL; }
            e->cached = nc; e->capcached = cap;
        }
        en->cached = 1;
        en->cpos = e->ncached;
        e->cached[e->ncached++] = en;
        e->used += en->size;
        if (e->used > e->peak_used) e->peak_used = e->used;
    } else {
        e->transient += en->size;
        if (e->transient > e->peak_transient) e->peak_transient = e->transient;
    }
    b->slot[ex] = en;
    en->req.dst = buf;
    en->req.off = b->b->offset + (uint64_t)ex * b->b->stride;
    en->req.len = b->b->stride;
    en->req.done = on_read;
    en->req.user = en;
    mp_io_pool_submit(e->pool, &en->req);
    *rc = MP_OK;
    return en;
}

static long bank_index(const mp_experts *e, int layer) {
    const mp_bank_info *b = mpc_bank(e->c, layer);
    if (!b) return -1;
    return (long)(b - mpc_bank_at(e->c, 0));
}

mp_experts *mpe_create(const mp_container *c, const mp_expert_options *opt, char *err, size_t errlen) {
    if (!c) { mp_seterr(err, errlen, MP_EINVAL, "mpe_create: no container"); return NULL; }
    mp_experts *e = calloc(1, sizeof *e);
    if (!e) { mp_seterr(err, errlen, MP_ENOMEM, "out of memory"); return NULL; }
    if (opt) e->opt = *opt; else mpe_options_default(&e->opt);
    if (e->opt.reader_threads <= 0) e->opt.reader_threads = 4;
    if (e->opt.policy != MP_CACHE_LRU) e->opt.policy = MP_CACHE_LFU;
    e->c = c;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->nbanks = mpc_bank_count(c);
    e->banks = calloc(e->nbanks ? e->nbanks : 1, sizeof *e->banks);
    if (!e->banks) { mp_seterr(err, errlen, MP_ENOMEM, "out of memory"); goto fail; }
    for (size_t i = 0; i < e->nbanks; i++) {
        bankrt *b = &e->banks[i];
        b->b = mpc_bank_at(c, i);
        if (b->b->stride > e->max_stride) e->max_stride = b->b->stride;
        b->slot = calloc(b->b->count, sizeof *b->slot);
        b->freq = calloc(b->b->count, sizeof *b->freq);
        if (!b->slot || !b->freq) { mp_seterr(err, errlen, MP_ENOMEM, "out of memory"); goto fail; }
        if (e->opt.verify_reads) {
            b->hashes = malloc(32ull * b->b->count);
            if (!b->hashes) { mp_seterr(err, errlen, MP_ENOMEM, "out of memory"); goto fail; }
            if (mpc_read_expert_hashes(c, b->b, b->hashes, 32ull * b->b->count, err, errlen)) goto fail;
        }
    }
    e->io = mp_io_open(mpc_path(c), e->opt.o_direct, mpc_alignment(c), err, errlen);
    if (!e->io) goto fail;
    e->balign = mp_io_buffer_alignment(e->io);
    e->pool = mp_io_pool_create(e->io, e->opt.reader_threads, err, errlen);
    if (!e->pool) goto fail;
    e->st.o_direct_active = mp_io_direct_active(e->io);
    snprintf(e->st.o_direct_note, sizeof e->st.o_direct_note, "%s", mp_io_direct_note(e->io));
    uint64_t every = 0;
    for (size_t i = 0; i < e->nbanks; i++) every += (uint64_t)e->banks[i].b->count * e->banks[i].b->stride;
    if (e->opt.warm && every && every <= e->opt.budget_bytes) {
        pthread_mutex_lock(&e->mu);
        /* half the reader threads: measured against one read at a time only while the forward
         * pass reads nothing, the first 16 tokens after open ran at 26-31 vs 18-25 tok/s */
        e->warm_max = e->opt.reader_threads / 2 > 1 ? e->opt.reader_threads / 2 : 1;
        warm_more(e);
        pthread_mutex_unlock(&e->mu);
    }
    return e;
fail:
    mpe_destroy(e);
    return NULL;
}

void mpe_destroy(mp_experts *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->warm_stop = 1; /* no more warm-up reads: the pool drains what is queued */
    pthread_mutex_unlock(&e->mu);
    mp_io_pool_destroy(e->pool); /* waits for reads in flight: their entries stay valid until here */
    for (size_t i = 0; i < e->nbanks; i++) {
        bankrt *b = &e->banks[i];
        if (b->slot)
            for (uint32_t x = 0; x < b->b->count; x++)
                if (b->slot[x]) { mp_buffer_free(b->slot[x]->buf, e->balign, (size_t)b->slot[x]->size); free(b->slot[x]); }
        free(b->slot); free(b->freq); free(b->hashes);
    }
    while (e->spare) {
        spare_hdr *h = e->spare;
        e->spare = h->next;
        mp_buffer_free(h, e->balign, (size_t)h->size);
    }
    free(e->banks);
    free(e->cached);
    mp_io_close(e->io);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

/* Unpins experts[0..n) of bank bi; frees records that are neither cached nor pinned. Lock held. */
static void unpin(mp_experts *e, size_t bi, const int *experts, int n) {
    bankrt *b = &e->banks[bi];
    for (int i = 0; i < n; i++) {
        int ex = experts[i];
        if (ex < 0 || (uint32_t)ex >= b->b->count) continue;
        entry *en = b->slot[ex];
        if (!en || en->pins <= 0) continue;
        if (--en->pins == 0 && (!en->cached || en->state == ST_ERROR) && en->state != ST_LOADING) free_entry(e, en);
    }
}

int mpe_acquire(mp_experts *e, int layer, const int *experts, int n, const uint8_t **records, char *err, size_t errlen) {
    if (!e || n < 0 || (n && (!experts || !records))) return mp_seterr(err, errlen, MP_EINVAL, "mpe_acquire: bad arguments");
    long bi = bank_index(e, layer);
    if (bi < 0) return mp_seterr(err, errlen, MP_EINVAL, "no expert bank for layer %d", layer);
    bankrt *b = &e->banks[bi];
    for (int i = 0; i < n; i++)
        if (experts[i] < 0 || (uint32_t)experts[i] >= b->b->count)
            return mp_seterr(err, errlen, MP_EINVAL, "layer %d: expert %d outside 0..%u", layer, experts[i], b->b->count - 1);
    pthread_mutex_lock(&e->mu);
    int rc = MP_OK, pinned = 0;
    for (; pinned < n; pinned++) {
        int ex = experts[pinned];
        entry *en = b->slot[ex];
        e->tick++;
        if (b->freq[ex] < UINT32_MAX) b->freq[ex]++;
        if (en && en->state == ST_ERROR && en->pins == 0) { free_entry(e, en); en = NULL; } /* failed prefetch: retry */
        if (en) {
            en->pins++;
            en->last_use = e->tick;
            e->st.hits++;
            continue;
        }
        e->st.misses++;
        if (!start_read(e, (size_t)bi, ex, 1, e->opt.budget_bytes > 0, &rc)) break;
    }
    if (rc == MP_OK) {
        uint64_t t0 = 0;
        for (int i = 0; i < n; i++) {
            entry *en = b->slot[experts[i]];
            while (en->state == ST_LOADING) {
                if (!t0) t0 = mp_now_ns();
                pthread_cond_wait(&e->cv, &e->mu);
            }
        }
        if (t0) e->st.wait_ns += mp_now_ns() - t0;
        for (int i = 0; i < n && rc == MP_OK; i++) {
            entry *en = b->slot[experts[i]];
            if (en->state == ST_ERROR) {
                rc = en->status;
                mp_seterr(err, errlen, rc, "layer %d expert %d: %s", layer, experts[i], en->req.err);
            } else {
                records[i] = en->buf;
            }
        }
    } else {
        mp_seterr(err, errlen, rc, "out of memory for expert records");
        /* wait for reads already issued for this call, so their entries can be released */
        for (int i = 0; i < pinned; i++)
            while (b->slot[experts[i]]->state == ST_LOADING) pthread_cond_wait(&e->cv, &e->mu);
    }
    if (rc != MP_OK) {
        unpin(e, (size_t)bi, experts, pinned);
        for (int i = 0; i < n; i++) records[i] = NULL;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

void mpe_release(mp_experts *e, int layer, const int *experts, int n) {
    if (!e || !experts || n <= 0) return;
    long bi = bank_index(e, layer);
    if (bi < 0) return;
    pthread_mutex_lock(&e->mu);
    unpin(e, (size_t)bi, experts, n);
    pthread_mutex_unlock(&e->mu);
}

void mpe_prefetch(mp_experts *e, int layer, const int *experts, int n) {
    if (!e || !experts || n <= 0 || e->opt.budget_bytes == 0) return;
    long bi = bank_index(e, layer);
    if (bi < 0) return;
    bankrt *b = &e->banks[bi];
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < n; i++) {
        int ex = experts[i], rc;
        if (ex < 0 || (uint32_t)ex >= b->b->count || b->slot[ex]) continue;
        if (make_room(e, b->b->stride) != 0) break; /* only unpinned, settled records are evicted */
        if (!start_read(e, (size_t)bi, ex, 0, 1, &rc)) break;
        e->st.prefetches++;
    }
    pthread_mutex_unlock(&e->mu);
}

void mpe_set_budget(mp_experts *e, uint64_t budget_bytes) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->opt.budget_bytes = budget_bytes;
    /* records still loading cannot be evicted: wait for them, then evict by policy */
    while (e->used > budget_bytes) {
        if (make_room(e, 0) == 0) break;
        int loading = 0;
        for (size_t i = 0; i < e->ncached && !loading; i++) loading = e->cached[i]->state == ST_LOADING;
        if (!loading) break; /* only pinned records are left: the caller holds none between passes */
        pthread_cond_wait(&e->cv, &e->mu);
    }
    pthread_mutex_unlock(&e->mu);
}

void mpe_stats(mp_experts *e, mp_expert_stats *out) {
    if (!e || !out) return;
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    out->budget = e->opt.budget_bytes;
    out->used = e->used;
    out->transient = e->transient;
    out->spare = e->spare_bytes;
    out->cached_records = (uint32_t)e->ncached;
    out->peak_used = e->peak_used;
    out->allocated = e->allocated;
    out->peak_allocated = e->peak_allocated;
    out->warming = e->warm_inflight || (e->warm_max && !e->warm_stop && e->warm_bank < e->nbanks);
    pthread_mutex_unlock(&e->mu);
}

void mpe_reset_stats(mp_experts *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->st.hits = e->st.misses = e->st.bytes_read = e->st.reads = 0;
    e->st.read_ns = e->st.wait_ns = e->st.prefetches = e->st.evictions = e->st.warm_reads = 0;
    pthread_mutex_unlock(&e->mu);
}
