/* Expert record I/O: one aligned pread per record, O_DIRECT when the file allows it, and a pool
 * of reader threads so reads overlap compute.
 *
 * O_DIRECT is probed at open against the FILE's granularity (the container alignment: record
 * offsets and strides are multiples of it), reading one alignment-sized block at offset 0 into a
 * buffer aligned like the real record buffers: a probe with any other size or alignment can
 * fail where real reads would work, and the fallback to buffered reads is silent. The outcome is
 * reported by mp_io_direct_active / mp_io_direct_note. */
#ifndef MP_IO_H
#define MP_IO_H

#include <stddef.h>
#include <stdint.h>

#include "alloc.h"

/* o_direct modes (same values as mp_config.o_direct) */
enum { MP_ODIRECT_AUTO = -1, MP_ODIRECT_OFF = 0, MP_ODIRECT_ON = 1 };

typedef struct mp_io mp_io;

/* Opens path for record reads. mode ON fails (MP_EIO) if the probe fails; AUTO falls back to
 * buffered reads. file_alignment: the container alignment (power of two >= 512). */
mp_io *mp_io_open(const char *path, int mode, uint32_t file_alignment, char *err, size_t errlen);
void mp_io_close(mp_io *io);
int mp_io_direct_active(const mp_io *io);
const char *mp_io_direct_note(const mp_io *io); /* one line: what the probe found */
/* Alignment a record buffer must have (>= file alignment, >= page size). */
size_t mp_io_buffer_alignment(const mp_io *io);

/* Reads exactly len bytes at off into dst. Uses O_DIRECT when active and dst/off/len are aligned,
 * else the buffered descriptor. MP_OK, or MP_EIO with a message (short file = error). */
int mp_io_read(mp_io *io, void *dst, uint64_t off, uint64_t len, char *err, size_t errlen);

uint64_t mp_now_ns(void); /* CLOCK_MONOTONIC */

/* ---- reader pool ---- */
typedef struct mp_io_req mp_io_req;
typedef void (*mp_io_done_fn)(mp_io_req *req);

struct mp_io_req {
    /* set by the submitter */
    void *dst;
    uint64_t off, len;
    mp_io_done_fn done;  /* called on the reader thread after the read (may be NULL) */
    void *user;
    /* set by the pool before done() */
    int status;          /* MP_OK or MP_EIO */
    char err[192];
    uint64_t read_ns;
    /* private */
    mp_io_req *next;
};

typedef struct mp_io_pool mp_io_pool;

mp_io_pool *mp_io_pool_create(mp_io *io, int threads, char *err, size_t errlen);
/* Queues a read (FIFO). The request must stay alive until done() has been called. */
void mp_io_pool_submit(mp_io_pool *pool, mp_io_req *req);
/* Waits for queued and running reads to finish, then joins the threads. */
void mp_io_pool_destroy(mp_io_pool *pool);
int mp_io_pool_threads(const mp_io_pool *pool);

#endif
