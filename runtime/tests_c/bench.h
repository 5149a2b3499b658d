/* What the C benchmarks (bench_*.c, not tests) share: clocks and a fixed pseudo-random stream. */
#ifndef MP_BENCH_H
#define MP_BENCH_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

/* This thread's CPU time: on a shared machine, time spent descheduled does not count. */
static inline double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xorshift64: the same inputs on every run; a benchmark may set rs first for its own stream */
static uint64_t rs = 88172645463325252ull;
static inline uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

/* A random rvq projection: codes from rnd(), every row scale 1.0, codebook entries in
 * [-0.25, 0.25]; cbt (S x 2048 floats) gets the transposed codebook.  Returns the record part
 * (the caller frees it). */
static inline uint8_t *random_rvq(mpk_rvq *w, long rows, long cols, int S, float *cbt) {
    size_t nb = (size_t)mpk_rvq_nbytes(rows, cols, S);
    uint8_t *part = aligned_alloc(64, (nb + 63) & ~(size_t)63);
    float *cb = malloc((size_t)S * 2048 * 4);
    for (size_t i = 0; i < nb; i++) part[i] = (uint8_t)rnd();
    mpk_rvq_init(w, rows, cols, S, part);
    for (long r = 0; r < rows; r++) memcpy((uint8_t *)w->scales + 2 * r, "\x00\x3c", 2);
    for (int i = 0; i < S * 2048; i++) cb[i] = (float)((int64_t)(rnd() % 2001) - 1000) / 4000.0f;
    mpk_rvq_transpose_cb(cb, S, cbt);
    free(cb);
    return part;
}

#endif
