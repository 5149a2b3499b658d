/* Aligned record reads, the O_DIRECT probe, and the reader thread pool. */
#define _GNU_SOURCE
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "moepack.h"

struct mp_io {
    int fd;            /* buffered descriptor: always open */
    int dfd;           /* O_DIRECT descriptor, or -1 */
    uint32_t falign;   /* container alignment: record offsets and strides are multiples */
    size_t balign;     /* buffer alignment: max(falign, page size) */
    int direct;
    char note[160];
};

uint64_t mp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int read_full(int fd, void *dst, uint64_t off, uint64_t len) {
    uint8_t *p = dst;
    while (len) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0) { if (errno == EINTR) continue; return errno ? errno : EIO; }
        if (r == 0) return -1; /* end of file before len bytes */
        p += r; off += (uint64_t)r; len -= (uint64_t)r;
    }
    return 0;
}

/* The probe reads exactly what a record read looks like at the file's granularity: falign bytes
 * at an falign-aligned offset (not 0, which is aligned to everything) into a buffer aligned like
 * the real record buffers. */
static void probe_direct(mp_io *io, const char *path) {
#ifdef O_DIRECT
    struct stat st;
    if (fstat(io->fd, &st) != 0) { snprintf(io->note, sizeof io->note, "O_DIRECT off: fstat failed"); return; }
    int dfd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (dfd < 0) {
        snprintf(io->note, sizeof io->note, "O_DIRECT off: open(O_DIRECT) failed: %s (filesystem without direct I/O?)", strerror(errno));
        return;
    }
    uint64_t off = (uint64_t)st.st_size >= 2ull * io->falign ? io->falign : 0;
    void *buf = mp_aligned_alloc(io->balign, io->falign);
    if (!buf) { close(dfd); snprintf(io->note, sizeof io->note, "O_DIRECT off: out of memory for the probe"); return; }
    ssize_t r = pread(dfd, buf, io->falign, (off_t)off);
    int er = errno;
    mp_aligned_free(buf);
    if (r != (ssize_t)io->falign) {
        close(dfd);
        snprintf(io->note, sizeof io->note, "O_DIRECT off: probe read of %u bytes at offset %llu %s%s", io->falign,
                 (unsigned long long)off, r < 0 ? "failed: " : "was short", r < 0 ? strerror(er) : "");
        return;
    }
    io->dfd = dfd;
    io->direct = 1;
    snprintf(io->note, sizeof io->note, "O_DIRECT on: probe read of %u bytes at offset %llu ok", io->falign, (unsigned long long)off);
#else
    (void)path;
    snprintf(io->note, sizeof io->note, "O_DIRECT off: not available on this platform");
#endif
}

mp_io *mp_io_open(const char *path, int mode, uint32_t falign, char *err, size_t errlen) {
    if (!path || falign < 512 || (falign & (falign - 1))) {
        if (err && errlen) snprintf(err, errlen, "mp_io_open: bad arguments");
        return NULL;
    }
    mp_io *io = calloc(1, sizeof *io);
    if (!io) { if (err && errlen) snprintf(err, errlen, "out of memory"); return NULL; }
    io->dfd = -1;
    io->falign = falign;
    io->balign = falign > mp_page_size() ? falign : mp_page_size();
    io->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (io->fd < 0) {
        if (err && errlen) snprintf(err, errlen, "%s: %s", path, strerror(errno));
        free(io);
        return NULL;
    }
    if (mode == MP_ODIRECT_OFF) {
        snprintf(io->note, sizeof io->note, "O_DIRECT off: disabled by the caller");
    } else {
        probe_direct(io, path);
        if (!io->direct && mode == MP_ODIRECT_ON) {
            if (err && errlen) snprintf(err, errlen, "%s: O_DIRECT required but unavailable (%s)", path, io->note);
            mp_io_close(io);
            return NULL;
        }
    }
#ifdef POSIX_FADV_RANDOM
    posix_fadvise(io->fd, 0, 0, POSIX_FADV_RANDOM); /* records are read at random: no read-ahead */
#endif
    return io;
}

void mp_io_close(mp_io *io) {
    if (!io) return;
    if (io->fd >= 0) close(io->fd);
    if (io->dfd >= 0) close(io->dfd);
    free(io);
}

int mp_io_direct_active(const mp_io *io) { return io ? io->direct : 0; }
const char *mp_io_direct_note(const mp_io *io) { return io ? io->note : ""; }
size_t mp_io_buffer_alignment(const mp_io *io) { return io ? io->balign : 4096; }

int mp_io_read(mp_io *io, void *dst, uint64_t off, uint64_t len, char *err, size_t errlen) {
    if (!io || (!dst && len)) { if (err && errlen) snprintf(err, errlen, "mp_io_read: bad arguments"); return MP_EINVAL; }
    int r = 0, buffered = 1;
    if (io->direct && off % io->falign == 0 && len % io->falign == 0 && (uintptr_t)dst % 512 == 0) {
        r = read_full(io->dfd, dst, off, len);
        buffered = (r == EINVAL); /* this particular read refused direct: retry buffered */
    }
    if (buffered) r = read_full(io->fd, dst, off, len);
    if (r == 0) return MP_OK;
    if (err && errlen)
        snprintf(err, errlen, "read of %llu bytes at offset %llu failed: %s", (unsigned long long)len,
                 (unsigned long long)off, r < 0 ? "unexpected end of file" : strerror(r));
    return MP_EIO;
}

/* ---- reader pool ---- */
struct mp_io_pool {
    mp_io *io;
    pthread_t *th;
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mp_io_req *head, *tail;
    int stop;
};

static void *worker(void *arg) {
    mp_io_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->head && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        mp_io_req *r = p->head;
        if (!r) { pthread_mutex_unlock(&p->mu); break; } /* stop and queue drained */
        p->head = r->next;
        if (!p->head) p->tail = NULL;
        pthread_mutex_unlock(&p->mu);
        uint64_t t0 = mp_now_ns();
        r->err[0] = 0;
        r->status = mp_io_read(p->io, r->dst, r->off, r->len, r->err, sizeof r->err);
        r->read_ns = mp_now_ns() - t0;
        if (r->done) r->done(r);
    }
    return NULL;
}

mp_io_pool *mp_io_pool_create(mp_io *io, int threads, char *err, size_t errlen) {
    if (!io) { if (err && errlen) snprintf(err, errlen, "mp_io_pool_create: no io"); return NULL; }
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    mp_io_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->th = calloc((size_t)threads, sizeof *p->th))) {
        free(p);
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return NULL;
    }
    p->io = io;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&p->th[i], NULL, worker, p) != 0) {
            if (i == 0) {
                pthread_mutex_destroy(&p->mu); pthread_cond_destroy(&p->cv);
                free(p->th); free(p);
                if (err && errlen) snprintf(err, errlen, "cannot start reader threads");
                return NULL;
            }
            break; /* run with the threads we got */
        }
        p->n++;
    }
    return p;
}

void mp_io_pool_submit(mp_io_pool *p, mp_io_req *r) {
    r->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->tail) p->tail->next = r; else p->head = r;
    p->tail = r;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void mp_io_pool_destroy(mp_io_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->th);
    free(p);
}

int mp_io_pool_threads(const mp_io_pool *p) { return p ? p->n : 0; }
