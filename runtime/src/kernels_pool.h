/* Fixed-size worker pool for the compute kernels.
 *
 * mpk_pool_run splits work into tasks identified by index; which thread runs a task never changes
 * what the task computes, so results are bit-identical for any thread count. */
#ifndef MP_KERNELS_POOL_H
#define MP_KERNELS_POOL_H

#include <stddef.h>

typedef struct mpk_pool mpk_pool;
typedef void (*mpk_task_fn)(void *ctx, size_t task);

#define MPK_POOL_MAX_THREADS 256

/* threads 1..MPK_POOL_MAX_THREADS (the caller counts as one; out of range: clamped); returns
 * NULL on failure. */
mpk_pool *mpk_pool_create(int threads);
void mpk_pool_destroy(mpk_pool *p);
int mpk_pool_threads(const mpk_pool *p);
/* Runs fn(ctx, 0 .. ntasks-1) on all threads and returns when all are done.  p may be NULL
 * (runs inline). */
void mpk_pool_run(mpk_pool *p, size_t ntasks, mpk_task_fn fn, void *ctx);
/* The scratch buffer of the calling thread in p (a caller's, or the worker's running a task of
 * p): at least `bytes`, 64-byte aligned, kept (and reused by the thread's later tasks) until the
 * pool is destroyed or a larger request replaces it.  Only its thread touches it, so tasks take
 * it without a lock.  NULL with p NULL or without memory. */
void *mpk_pool_scratch(mpk_pool *p, size_t bytes);
/* Every thread's scratch buffer allocated now, at least `bytes` (what the memory plan counts):
 * 0, or -1 without memory. */
int mpk_pool_reserve(mpk_pool *p, size_t bytes);
/* A product's copy of its inputs (rounded, transposed or padded; 64-byte aligned, at least
 * `bytes`, contents undefined): the one buffer p keeps for them, replaced when a larger request
 * comes and mapped on its own, so that what it held goes back to the system at once (freed C
 * library blocks stay in its heap); while that buffer is in use, or with p NULL, an allocation
 * of its own.  NULL without memory.  Give it back with mpk_pool_inputs_done. */
void *mpk_pool_inputs(mpk_pool *p, size_t bytes);
void mpk_pool_inputs_done(mpk_pool *p, void *buf);
/* The kept inputs buffer returned to the system (a long prompt's passes are over). */
void mpk_pool_inputs_release(mpk_pool *p);

#endif
