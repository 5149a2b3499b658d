/* Expert read bandwidth: the disk's O_DIRECT random-read bandwidth at the record size and queue
 * depth T (T threads doing pread, no engine code) vs the same kind of reads through
 * mpe_acquire (cache off, T reader threads, T experts per acquire = one layer's misses).
 * Not a test: `make -C runtime bench BENCH_FILE=x.moepack`. Usage: bench_io FILE [T] [RECORDS] [VERIFY 0|1] */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "io.h"

static const mp_container *C;
static int T;
static long PER;

typedef struct { unsigned seed; uint64_t bytes; } arg;

static void pick(unsigned *seed, const mp_bank_info **b, int *ex) {
    *b = mpc_bank_at(C, (size_t)rand_r(seed) % mpc_bank_count(C));
    *ex = (int)((unsigned)rand_r(seed) % (*b)->count);
}

static void *raw(void *p) {
    arg *a = p;
    int fd = open(mpc_path(C), O_RDONLY | O_DIRECT);
    if (fd < 0) return NULL;
    const mp_bank_info *b = mpc_bank_at(C, 0);
    void *buf = mp_aligned_alloc(4096, b->stride);
    for (long i = 0; i < PER; i++) {
        int ex;
        pick(&a->seed, &b, &ex);
        if (pread(fd, buf, b->stride, (off_t)(b->offset + (uint64_t)ex * b->stride)) == (ssize_t)b->stride) a->bytes += b->stride;
    }
    mp_aligned_free(buf);
    close(fd);
    return NULL;
}

static double raw_bw(void) {
    pthread_t th[64];
    arg a[64];
    uint64_t t0 = mp_now_ns(), bytes = 0;
    for (int i = 0; i < T; i++) { a[i].seed = 100u + (unsigned)i; a[i].bytes = 0; pthread_create(&th[i], NULL, raw, &a[i]); }
    for (int i = 0; i < T; i++) { pthread_join(th[i], NULL); bytes += a[i].bytes; }
    return (double)bytes / (double)(mp_now_ns() - t0);
}

static int VERIFY;

static double engine_bw(int direct, mp_expert_stats *s) {
    mp_expert_options o;
    char err[256];
    mpe_options_default(&o);
    o.budget_bytes = 0; o.reader_threads = T; o.o_direct = direct; o.verify_reads = VERIFY;
    mp_experts *e = mpe_create(C, &o, err, sizeof err);
    if (!e) { fprintf(stderr, "%s\n", err); return 0; }
    unsigned seed = 7;
    const uint8_t *rec[64];
    int ex[64];
    uint64_t t0 = mp_now_ns();
    for (long i = 0; i < PER; i++) {
        const mp_bank_info *b = mpc_bank_at(C, (size_t)rand_r(&seed) % mpc_bank_count(C));
        for (int k = 0; k < T; k++) { /* T distinct experts, like one layer's routed misses */
            int x, dup;
            do { x = (int)((unsigned)rand_r(&seed) % b->count); dup = 0; for (int j = 0; j < k; j++) dup |= ex[j] == x; } while (dup && (uint32_t)k < b->count);
            ex[k] = x;
        }
        if (mpe_acquire(e, b->layer, ex, T, rec, err, sizeof err) != MP_OK) { fprintf(stderr, "%s\n", err); break; }
        mpe_release(e, b->layer, ex, T);
    }
    uint64_t dt = mp_now_ns() - t0;
    mpe_stats(e, s);
    mpe_destroy(e);
    return (double)s->bytes_read / (double)dt;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: bench_io FILE [THREADS] [RECORDS]\n"); return 2; }
    T = argc > 2 ? atoi(argv[2]) : 4;
    long total = argc > 3 ? atol(argv[3]) : 512;
    VERIFY = argc > 4 && atoi(argv[4]) == 1;
    if (T < 1 || T > 64) T = 4;
    char err[512];
    mp_container *c = mpc_open(argv[1], err, sizeof err);
    if (!c) { fprintf(stderr, "%s\n", err); return 1; }
    C = c;
    PER = total / T;
    const mp_bank_info *b = mpc_bank_at(c, 0);
    printf("file %s: %zu banks x %u experts, stride %llu bytes; queue depth %d, %ld records per run\n", argv[1],
           mpc_bank_count(c), b->count, (unsigned long long)b->stride, T, PER * T);
    mp_expert_stats s;
    double r1 = raw_bw();
    double e1 = engine_bw(MP_ODIRECT_AUTO, &s);
    double r2 = raw_bw();
    printf("raw O_DIRECT pread, %d threads:       %.3f GB/s, %.3f GB/s (before/after)\n", T, r1, r2);
    printf("mpe_acquire%s (%s): %.3f GB/s  -> ratio %.2f of the mean raw\n", VERIFY ? " verify-reads" : "", s.o_direct_note, e1, e1 / ((r1 + r2) / 2));
    printf("  wait %.3f s, reader time %.3f s over %llu reads\n", s.wait_ns / 1e9, s.read_ns / 1e9, (unsigned long long)s.reads);
    double e2 = engine_bw(MP_ODIRECT_OFF, &s);
    printf("mpe_acquire buffered (page cache may serve it): %.3f GB/s\n", e2);
    mpc_close(c);
    return 0;
}
