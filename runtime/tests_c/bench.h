/* What the C benchmarks (bench_*.c, not tests) share: clocks and a fixed pseudo-random stream. */
#ifndef MP_BENCH_H
#define MP_BENCH_H

#include <stdint.h>
#include <time.h>

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

#endif
