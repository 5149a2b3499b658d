/* Aligned allocation for the engine's buffers: big ones mapped on their own, so that freeing one
 * gives its pages back at once (io.c reads records into them; the kernels' pool and the model
 * keep their work buffers in them). */
#ifndef MP_ALLOC_H
#define MP_ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* Aligned allocation helpers (free with mp_aligned_free). */
void *mp_aligned_alloc(size_t alignment, size_t size);
/* n x size zeroed bytes, 64-byte aligned (NULL when that overflows): the prompt chunk's buffers,
 * which a long prompt frees and makes again (mpm_set_chunk), so that big ones go back to the
 * system when freed instead of staying in malloc's heap while the cache grows back */
void *mp_aligned_calloc(uint64_t n, uint64_t size);
void mp_aligned_free(void *p);
/* Expert record buffers: mapped exactly (the size rounded up to pages, no header page beside it)
 * when `alignment` is at most the page size, which mmap's placement gives; else
 * mp_aligned_alloc. Freed with the same alignment and size. */
void *mp_buffer_alloc(size_t alignment, size_t size);
void mp_buffer_free(void *p, size_t alignment, size_t size);
size_t mp_page_size(void);

#endif
