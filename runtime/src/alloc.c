/* Aligned buffers; big ones mapped on their own. */
#define _GNU_SOURCE
#include "alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Buffers of MAPPED_MIN bytes and more are mapped directly, so freeing one returns its pages at
 * once: after the first free of a big chunk glibc raises its mmap threshold and then keeps freed
 * record buffers in its heaps (one per thread that allocated), resident but outside the memory
 * plan. A header just before the returned pointer says how the buffer was made. */
#define MAPPED_MIN ((size_t)64 << 10)

typedef struct alloc_hdr { void *raw; size_t mapped; } alloc_hdr;

void *mp_aligned_alloc(size_t alignment, size_t size) {
    if (alignment < sizeof(alloc_hdr)) alignment = sizeof(alloc_hdr);
    if ((alignment & (alignment - 1)) || size > SIZE_MAX - alignment - sizeof(alloc_hdr)) return NULL;
    size_t len = size + alignment + sizeof(alloc_hdr);
    size_t mapped = 0;
    void *raw;
    if (size >= MAPPED_MIN) {
        raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) return NULL;
        mapped = len;
    } else if (!(raw = malloc(len))) {
        return NULL;
    }
    uintptr_t at = ((uintptr_t)raw + sizeof(alloc_hdr) + alignment - 1) & ~(uintptr_t)(alignment - 1);
    alloc_hdr *h = (alloc_hdr *)at - 1;
    h->raw = raw;
    h->mapped = mapped;
    return (void *)at;
}

void *mp_aligned_calloc(uint64_t n, uint64_t size) {
    if (size && n > UINT64_MAX / size) return NULL;
    const uint64_t len = n * size ? n * size : 1;
    if (len > SIZE_MAX) return NULL;
    void *p = mp_aligned_alloc(64, (size_t)len);
    if (p && len < MAPPED_MIN) memset(p, 0, (size_t)len); /* mapped pages come zeroed */
    return p;
}

void mp_aligned_free(void *p) {
    if (!p) return;
    alloc_hdr *h = (alloc_hdr *)p - 1;
    if (h->mapped) munmap(h->raw, h->mapped);
    else free(h->raw);
}

size_t mp_page_size(void) {
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

void *mp_buffer_alloc(size_t alignment, size_t size) {
    const size_t page = mp_page_size();
    if (alignment > page || !size) return mp_aligned_alloc(alignment, size);
    if (size > SIZE_MAX - page) return NULL;
    void *p = mmap(NULL, (size + page - 1) / page * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void mp_buffer_free(void *p, size_t alignment, size_t size) {
    const size_t page = mp_page_size();
    if (!p) return;
    if (alignment > page || !size) mp_aligned_free(p);
    else munmap(p, (size + page - 1) / page * page);
}
