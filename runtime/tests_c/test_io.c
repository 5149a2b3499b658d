/* io.c on a synthetic file: every record read back exactly through the pool (O_DIRECT probed,
 * and forced off), unaligned reads go buffered, reads past the end fail cleanly; aligned buffers
 * of both kinds (heap and mapped) are aligned, writable to the last byte and freed (ASan run).
 * Usage: test_io VECTORS_DIR SCRATCH_DIR */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "io.h"
#include "moepack.h"
#include "t.h"

#define REC 4096u
#define NREC 64u

static unsigned char pattern(uint64_t i) { return (unsigned char)((i * 2654435761u) >> 13); }

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} waiter;

static void on_done(mp_io_req *r) {
    waiter *w = r->user;
    pthread_mutex_lock(&w->mu);
    w->done++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void pool_round(const char *path, int mode) {
    char err[256];
    mp_io *io = mp_io_open(path, mode, REC, err, sizeof err);
    CHECK(io != NULL, "open: %s", err);
    if (!io) return;
    printf("  mode %d: %s\n", mode, mp_io_direct_note(io));
    if (mode == MP_ODIRECT_OFF) CHECK(!mp_io_direct_active(io), "forced off but active");
    CHECK(mp_io_buffer_alignment(io) % REC == 0, "buffer alignment");
    mp_io_pool *pool = mp_io_pool_create(io, 4, err, sizeof err);
    CHECK(pool && mp_io_pool_threads(pool) == 4, "pool: %s", err);
    waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    mp_io_req req[NREC];
    uint8_t *bufs[NREC];
    memset(req, 0, sizeof req);
    for (unsigned i = 0; i < NREC; i++) { /* reversed order: the queue must not care */
        unsigned k = NREC - 1 - i;
        bufs[k] = mp_aligned_alloc(mp_io_buffer_alignment(io), REC);
        req[k].dst = bufs[k]; req[k].off = (uint64_t)k * REC; req[k].len = REC;
        req[k].done = on_done; req[k].user = &w;
        mp_io_pool_submit(pool, &req[k]);
    }
    pthread_mutex_lock(&w.mu);
    while (w.done < (int)NREC) pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    int bad = 0;
    for (unsigned k = 0; k < NREC; k++) {
        CHECK(req[k].status == MP_OK, "record %u: %s", k, req[k].err);
        for (unsigned j = 0; j < REC; j++) bad += bufs[k][j] != pattern((uint64_t)k * REC + j);
        mp_aligned_free(bufs[k]);
    }
    CHECK(bad == 0, "%d wrong bytes", bad);
    /* destroy with reads still queued: all complete before the threads go */
    w.done = 0;
    uint8_t *big = mp_aligned_alloc(mp_io_buffer_alignment(io), (size_t)REC * NREC);
    for (unsigned k = 0; k < NREC; k++) {
        req[k].dst = big + (size_t)k * REC; req[k].off = (uint64_t)k * REC; req[k].len = REC;
        mp_io_pool_submit(pool, &req[k]);
    }
    mp_io_pool_destroy(pool);
    CHECK(w.done == (int)NREC, "destroy drained %d of %u", w.done, NREC);
    CHECK(big[5 * REC + 7] == pattern(5 * REC + 7), "drained data");
    mp_aligned_free(big);
    /* unaligned read (buffered path) and a read past the end */
    unsigned char small[300];
    CHECK(mp_io_read(io, small, 100, sizeof small, err, sizeof err) == MP_OK, "unaligned: %s", err);
    CHECK(small[0] == pattern(100) && small[299] == pattern(399), "unaligned data");
    uint8_t *tail = mp_aligned_alloc(mp_io_buffer_alignment(io), 2 * REC);
    CHECK(mp_io_read(io, tail, (uint64_t)(NREC - 1) * REC, 2 * REC, err, sizeof err) == MP_EIO, "past end");
    CHECK(strstr(err, "end of file") != NULL, "past-end message: %s", err);
    mp_aligned_free(tail);
    mp_io_close(io);
}

static void aligned_buffers(void) {
    const size_t sizes[] = {1, 100, 4096, (64u << 10) - 1, 64u << 10, (1u << 20) + 3};
    const size_t aligns[] = {1, 8, 64, 4096, 8192};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (size_t j = 0; j < sizeof aligns / sizeof *aligns; j++) {
            uint8_t *p = mp_aligned_alloc(aligns[j], sizes[i]);
            CHECK(p != NULL, "alloc %zu aligned %zu", sizes[i], aligns[j]);
            if (!p) continue;
            CHECK(((uintptr_t)p & (aligns[j] - 1)) == 0, "%zu bytes: %p not aligned to %zu", sizes[i],
                  (void *)p, aligns[j]);
            memset(p, 0xA5, sizes[i]);
            CHECK(p[sizes[i] - 1] == 0xA5, "last byte of %zu", sizes[i]);
            mp_aligned_free(p);
        }
    CHECK(mp_aligned_alloc(48, 100) == NULL, "alignment 48 accepted");
    CHECK(mp_aligned_alloc(64, SIZE_MAX - 8) == NULL, "overflowing size accepted");
    mp_aligned_free(NULL);
}

int main(int argc, char **argv) {
    aligned_buffers();
    const char *scratch = argc > 2 ? argv[2] : "/tmp";
    char path[4096], err[256];
    snprintf(path, sizeof path, "%s/io_test.bin", scratch);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "create %s", path);
    if (!f) T_DONE("test_io");
    for (uint64_t i = 0; i < (uint64_t)REC * NREC; i++) fputc(pattern(i), f);
    fclose(f);
    pool_round(path, MP_ODIRECT_AUTO);
    pool_round(path, MP_ODIRECT_OFF);
    /* ON either works or refuses with a reason; never silently buffered */
    mp_io *io = mp_io_open(path, MP_ODIRECT_ON, REC, err, sizeof err);
    if (io) CHECK(mp_io_direct_active(io), "ON returned a buffered reader");
    else CHECK(strstr(err, "O_DIRECT required") != NULL, "ON refusal: %s", err);
    mp_io_close(io);
    CHECK(mp_io_open("/nonexistent/file", MP_ODIRECT_AUTO, REC, err, sizeof err) == NULL, "missing file");
    CHECK(mp_io_open(path, MP_ODIRECT_AUTO, 1000, err, sizeof err) == NULL, "bad alignment accepted");
    unlink(path);
    T_DONE("test_io");
}
