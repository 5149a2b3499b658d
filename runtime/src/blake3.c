/* Portable BLAKE3 from the specification (https://github.com/BLAKE3-team/BLAKE3-specs):
 * chunk chaining, binary tree with a CV stack, ROOT flag on the final compression.
 * Scalar only: correctness first; hashing is not on the decode critical path. */
#include "blake3.h"

#include <string.h>

#include "moepack.h"

enum { CHUNK_START = 1, CHUNK_END = 2, PARENT = 4, ROOT = 8 };

static const uint32_t IV[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                               0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};

static const uint8_t PERM[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static uint32_t load32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void store32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

static void g(uint32_t *s, int a, int b, int c, int d, uint32_t mx, uint32_t my) {
    s[a] = s[a] + s[b] + mx; s[d] = rotr(s[d] ^ s[a], 16);
    s[c] = s[c] + s[d];      s[b] = rotr(s[b] ^ s[c], 12);
    s[a] = s[a] + s[b] + my; s[d] = rotr(s[d] ^ s[a], 8);
    s[c] = s[c] + s[d];      s[b] = rotr(s[b] ^ s[c], 7);
}

/* Full 16-word output of the compression function. */
static void compress(const uint32_t cv[8], const uint8_t block[64], uint64_t counter,
                     uint32_t block_len, uint32_t flags, uint32_t out[16]) {
    uint32_t m[16], t[16], s[16];
    for (int i = 0; i < 16; i++) m[i] = load32(block + 4 * i);
    for (int i = 0; i < 8; i++) s[i] = cv[i];
    for (int i = 0; i < 4; i++) s[8 + i] = IV[i];
    s[12] = (uint32_t)counter; s[13] = (uint32_t)(counter >> 32);
    s[14] = block_len; s[15] = flags;
    for (int r = 0; r < 7; r++) {
        g(s, 0, 4, 8, 12, m[0], m[1]);   g(s, 1, 5, 9, 13, m[2], m[3]);
        g(s, 2, 6, 10, 14, m[4], m[5]);  g(s, 3, 7, 11, 15, m[6], m[7]);
        g(s, 0, 5, 10, 15, m[8], m[9]);  g(s, 1, 6, 11, 12, m[10], m[11]);
        g(s, 2, 7, 8, 13, m[12], m[13]); g(s, 3, 4, 9, 14, m[14], m[15]);
        if (r < 6) {
            for (int i = 0; i < 16; i++) t[i] = m[PERM[i]];
            memcpy(m, t, sizeof m);
        }
    }
    for (int i = 0; i < 8; i++) { out[i] = s[i] ^ s[i + 8]; out[i + 8] = s[i + 8] ^ cv[i]; }
}

/* A node's inputs kept back until we know whether it is the root. */
typedef struct {
    uint32_t cv[8];
    uint8_t block[64];
    uint64_t counter;
    uint32_t block_len, flags;
} node;

static void node_cv(const node *n, uint32_t cv[8]) {
    uint32_t out[16];
    compress(n->cv, n->block, n->counter, n->block_len, n->flags, out);
    memcpy(cv, out, 32);
}

static void parent_node(const uint32_t l[8], const uint32_t r[8], node *n) {
    memcpy(n->cv, IV, 32);
    for (int i = 0; i < 8; i++) { store32(n->block + 4 * i, l[i]); store32(n->block + 32 + 4 * i, r[i]); }
    n->counter = 0; n->block_len = 64; n->flags = PARENT;
}

static void chunk_reset(mp_blake3 *h, uint64_t counter) {
    memcpy(h->cv, IV, 32);
    h->chunk_counter = counter;
    h->block_len = 0;
    h->blocks_compressed = 0;
    memset(h->block, 0, 64);
}

void mp_blake3_init(mp_blake3 *h) {
    memset(h, 0, sizeof *h);
    chunk_reset(h, 0);
}

static uint32_t chunk_start_flag(const mp_blake3 *h) { return h->blocks_compressed == 0 ? CHUNK_START : 0; }

static void chunk_node(const mp_blake3 *h, node *n) {
    memcpy(n->cv, h->cv, 32);
    memcpy(n->block, h->block, 64);
    n->counter = h->chunk_counter;
    n->block_len = h->block_len;
    n->flags = chunk_start_flag(h) | CHUNK_END;
}

/* Merge completed subtrees: after chunk number total_chunks-1, pop once per trailing zero bit. */
static void push_cv(mp_blake3 *h, uint32_t cv[8], uint64_t total_chunks) {
    while ((total_chunks & 1) == 0) {
        node n;
        h->cv_stack_len--;
        parent_node(h->cv_stack[h->cv_stack_len], cv, &n);
        node_cv(&n, cv);
        total_chunks >>= 1;
    }
    memcpy(h->cv_stack[h->cv_stack_len], cv, 32);
    h->cv_stack_len++;
}

void mp_blake3_update(mp_blake3 *h, const void *data, size_t len) {
    const uint8_t *p = data;
    while (len > 0) {
        /* A full chunk is finished only when more input arrives (the last chunk may be the root). */
        if (h->blocks_compressed * 64 + h->block_len == MP_BLAKE3_CHUNK_LEN) {
            node n;
            uint32_t cv[8];
            chunk_node(h, &n);
            node_cv(&n, cv);
            uint64_t total = h->chunk_counter + 1;
            push_cv(h, cv, total);
            chunk_reset(h, total);
        }
        if (h->block_len == 64) {
            uint32_t out[16];
            compress(h->cv, h->block, h->chunk_counter, 64, chunk_start_flag(h), out);
            memcpy(h->cv, out, 32);
            h->blocks_compressed++;
            h->block_len = 0;
            memset(h->block, 0, 64);
        }
        size_t take = 64u - h->block_len;
        if (take > len) take = len;
        memcpy(h->block + h->block_len, p, take);
        h->block_len = (uint8_t)(h->block_len + take);
        p += take;
        len -= take;
    }
}

void mp_blake3_final(const mp_blake3 *h, uint8_t out[MP_BLAKE3_OUT_LEN]) {
    node n;
    chunk_node(h, &n);
    for (int i = (int)h->cv_stack_len - 1; i >= 0; i--) {
        uint32_t cv[8];
        node_cv(&n, cv);
        parent_node(h->cv_stack[i], cv, &n);
    }
    uint32_t words[16];
    compress(n.cv, n.block, n.counter, n.block_len, n.flags | ROOT, words);
    for (int i = 0; i < 8; i++) store32(out + 4 * i, words[i]);
}

void mp_blake3_hash(const void *data, size_t len, uint8_t out[MP_BLAKE3_OUT_LEN]) {
    mp_blake3 h;
    mp_blake3_init(&h);
    mp_blake3_update(&h, data, len);
    mp_blake3_final(&h, out);
}

void mp_blake3_hex(const uint8_t d[MP_BLAKE3_OUT_LEN], char out[65]) {
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) { out[2 * i] = hx[d[i] >> 4]; out[2 * i + 1] = hx[d[i] & 15]; }
    out[64] = 0;
}

/* Exported for tests (Python compares with the reference `blake3` package). */
MP_API int mp_blake3_digest(const void *data, size_t len, uint8_t *out32) {
    if (!out32 || (!data && len)) return -1;
    mp_blake3_hash(data, len, out32);
    return 0;
}
