/* Worker pool: tasks claimed from an atomic counter; every task writes a disjoint output, so the
 * claim order is free.  Between jobs a worker (and the caller waiting for the workers) polls for
 * a short while (POOL_SPIN yields, tens of microseconds) before it sleeps on a condition
 * variable: a decode step runs about a hundred short jobs, and a futex wake-up per job cost a
 * sixth of it; yielding, not spinning, hands a shared core to the work being waited for. */
#define _POSIX_C_SOURCE 200809L
#include "kernels_pool.h"

#include "alloc.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct {
    void *buf;
    size_t bytes;
} scratch;

struct mpk_pool {
    int nthreads; /* including the caller */
    pthread_t *tids;
    scratch *scratch; /* [nthreads]: [0] the caller's, [i] worker i's */
    scratch inputs;   /* mpk_pool_inputs' buffer (mp_aligned_alloc) */
    atomic_int inputs_busy;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_ulong generation; /* bumped per job (under mu) */
    atomic_int stopping;
    atomic_int active;       /* workers still inside the current job */
    mpk_task_fn fn;
    void *ctx;
    size_t ntasks;
    atomic_size_t next;
};

static void drain(mpk_pool *p, mpk_task_fn fn, void *ctx, size_t ntasks) {
    for (;;) {
        size_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= ntasks) break;
        fn(ctx, t);
    }
}

#ifndef POOL_SPIN
#define POOL_SPIN 128
#endif

/* one poll step: a yield, so that with more threads than free cores the polling thread hands
 * its core to the work it waits for (with pause instead, four threads on two cores halved the
 * decode speed) */
static inline void relax(void) { sched_yield(); }

/* which slot of its pool's scratch this thread uses: 0 for any caller, i for worker i (a worker
 * runs the tasks of its own pool only) */
static _Thread_local int slot;

typedef struct {
    mpk_pool *p;
    int slot;
} worker_arg;

static void *worker(void *arg) {
    worker_arg *a = arg;
    mpk_pool *p = a->p;
    slot = a->slot;
    free(a);
    unsigned long seen = 0;
    for (;;) {
        for (int i = 0; i < POOL_SPIN && atomic_load_explicit(&p->generation, memory_order_acquire) == seen &&
                        !atomic_load_explicit(&p->stopping, memory_order_relaxed);
             i++)
            relax();
        pthread_mutex_lock(&p->mu);
        while (!p->stopping && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stopping) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        mpk_task_fn fn = p->fn;
        void *ctx = p->ctx;
        size_t n = p->ntasks;
        pthread_mutex_unlock(&p->mu);
        drain(p, fn, ctx, n);
        if (atomic_fetch_sub_explicit(&p->active, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu); /* the caller checks active under mu before it waits */
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

mpk_pool *mpk_pool_create(int threads) {
    if (threads < 1) threads = 1;
    if (threads > MPK_POOL_MAX_THREADS) threads = MPK_POOL_MAX_THREADS;
    mpk_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nthreads = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->next, 0);
    atomic_init(&p->generation, 0);
    atomic_init(&p->stopping, 0);
    atomic_init(&p->active, 0);
    atomic_init(&p->inputs_busy, 0);
    p->scratch = calloc((size_t)threads, sizeof *p->scratch);
    if (!p->scratch) {
        mpk_pool_destroy(p);
        return NULL;
    }
    if (threads > 1) {
        p->tids = calloc((size_t)threads - 1, sizeof *p->tids);
        if (!p->tids) {
            mpk_pool_destroy(p);
            return NULL;
        }
        for (int i = 0; i < threads - 1; i++) {
            worker_arg *a = malloc(sizeof *a);
            if (!a) break;
            *a = (worker_arg){p, i + 1};
            if (pthread_create(&p->tids[i], NULL, worker, a) != 0) {
                free(a);
                break;
            }
            p->nthreads++;
        }
    }
    return p;
}

void mpk_pool_destroy(mpk_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads - 1; i++) pthread_join(p->tids[i], NULL);
    free(p->tids);
    for (int i = 0; p->scratch && i < p->nthreads; i++) free(p->scratch[i].buf);
    free(p->scratch);
    mp_aligned_free(p->inputs.buf);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
}

int mpk_pool_threads(const mpk_pool *p) { return p ? p->nthreads : 1; }

static int grow(scratch *s, size_t bytes) {
    if (s->bytes >= bytes) return 0;
    void *b = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!b) return -1;
    free(s->buf);
    s->buf = b;
    s->bytes = bytes;
    return 0;
}

void *mpk_pool_scratch(mpk_pool *p, size_t bytes) {
    if (!p) return NULL;
    scratch *s = &p->scratch[slot < p->nthreads ? slot : 0];
    return grow(s, bytes) ? NULL : s->buf;
}

int mpk_pool_reserve(mpk_pool *p, size_t bytes) {
    for (int i = 0; i < p->nthreads; i++)
        if (grow(&p->scratch[i], bytes)) return -1;
    return 0;
}

void *mpk_pool_inputs(mpk_pool *p, size_t bytes) {
    if (!p || atomic_exchange(&p->inputs_busy, 1)) return mp_aligned_alloc(64, bytes);
    if (p->inputs.bytes < bytes) {
        mp_aligned_free(p->inputs.buf); /* first: the old and the new are never held at once */
        p->inputs.buf = mp_aligned_alloc(64, bytes);
        p->inputs.bytes = p->inputs.buf ? bytes : 0;
    }
    if (!p->inputs.buf) atomic_store(&p->inputs_busy, 0);
    return p->inputs.buf;
}

void mpk_pool_inputs_done(mpk_pool *p, void *buf) {
    if (p && buf && buf == p->inputs.buf) atomic_store(&p->inputs_busy, 0);
    else mp_aligned_free(buf);
}

void mpk_pool_inputs_release(mpk_pool *p) {
    if (!p || atomic_exchange(&p->inputs_busy, 1)) return;
    mp_aligned_free(p->inputs.buf);
    p->inputs = (scratch){NULL, 0};
    atomic_store(&p->inputs_busy, 0);
}

void mpk_pool_run(mpk_pool *p, size_t ntasks, mpk_task_fn fn, void *ctx) {
    if (ntasks == 0) return;
    if (!p || p->nthreads == 1 || ntasks == 1) {
        for (size_t t = 0; t < ntasks; t++) fn(ctx, t);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->ntasks = ntasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->active = p->nthreads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p, fn, ctx, ntasks);
    for (int i = 0; i < POOL_SPIN && atomic_load_explicit(&p->active, memory_order_acquire) > 0; i++) relax();
    if (atomic_load_explicit(&p->active, memory_order_acquire) == 0) return;
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
