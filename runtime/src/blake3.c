/* Portable BLAKE3 from the specification (https://github.com/BLAKE3-team/BLAKE3-specs):
 * chunk chaining, binary tree with a CV stack, ROOT flag on the final compression.
 * Scalar compression, plus an AVX2 path on x86-64 that hashes eight non-root chunks at once
 * (bit-identical chaining values; mp_blake3_set_portable(1) turns it off for tests). */
#include "blake3.h"

#include <string.h>

#include "moepack.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MP_B3_X86 1
#endif

enum { CHUNK_START = 1, CHUNK_END = 2, PARENT = 4, ROOT = 8 };

static const uint32_t IV[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                               0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static uint32_t load32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void store32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

/* Message word order for each of the 7 rounds (the permutation applied r times), so rounds read
 * m[] in place instead of permuting it. */
static const uint8_t SCHED[7][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8},
    {3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1},
    {10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6},
    {12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4},
    {9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7},
    {11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13},
};

#define G(a, b, c, d, mx, my)                          \
    do {                                               \
        a = a + b + (mx); d = rotr(d ^ a, 16);         \
        c = c + d;        b = rotr(b ^ c, 12);         \
        a = a + b + (my); d = rotr(d ^ a, 8);          \
        c = c + d;        b = rotr(b ^ c, 7);          \
    } while (0)

/* Full 16-word output of the compression function; state kept in locals (registers). */
static void compress(const uint32_t cv[8], const uint8_t block[64], uint64_t counter,
                     uint32_t block_len, uint32_t flags, uint32_t out[16]) {
    uint32_t m[16];
    for (int i = 0; i < 16; i++) m[i] = load32(block + 4 * i);
    uint32_t s0 = cv[0], s1 = cv[1], s2 = cv[2], s3 = cv[3], s4 = cv[4], s5 = cv[5], s6 = cv[6], s7 = cv[7];
    uint32_t s8 = IV[0], s9 = IV[1], s10 = IV[2], s11 = IV[3];
    uint32_t s12 = (uint32_t)counter, s13 = (uint32_t)(counter >> 32), s14 = block_len, s15 = flags;
    for (int r = 0; r < 7; r++) {
        const uint8_t *x = SCHED[r];
        G(s0, s4, s8, s12, m[x[0]], m[x[1]]);
        G(s1, s5, s9, s13, m[x[2]], m[x[3]]);
        G(s2, s6, s10, s14, m[x[4]], m[x[5]]);
        G(s3, s7, s11, s15, m[x[6]], m[x[7]]);
        G(s0, s5, s10, s15, m[x[8]], m[x[9]]);
        G(s1, s6, s11, s12, m[x[10]], m[x[11]]);
        G(s2, s7, s8, s13, m[x[12]], m[x[13]]);
        G(s3, s4, s9, s14, m[x[14]], m[x[15]]);
    }
    out[0] = s0 ^ s8; out[1] = s1 ^ s9; out[2] = s2 ^ s10; out[3] = s3 ^ s11;
    out[4] = s4 ^ s12; out[5] = s5 ^ s13; out[6] = s6 ^ s14; out[7] = s7 ^ s15;
    out[8] = s8 ^ cv[0]; out[9] = s9 ^ cv[1]; out[10] = s10 ^ cv[2]; out[11] = s11 ^ cv[3];
    out[12] = s12 ^ cv[4]; out[13] = s13 ^ cv[5]; out[14] = s14 ^ cv[6]; out[15] = s15 ^ cv[7];
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

#ifdef MP_B3_X86
/* Eight whole chunks at once, one chunk per 32-bit lane (AVX2): same compression, so the chaining
 * values are bit-identical to the scalar path. Used only for chunks that cannot be the root. */
#define ROT16 _mm256_setr_epi8(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13, \
                               2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13)
#define ROT8 _mm256_setr_epi8(1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12, \
                              1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12)
#define G8(a, b, c, d, mx, my)                                                                   \
    do {                                                                                         \
        a = _mm256_add_epi32(_mm256_add_epi32(a, b), mx);                                        \
        d = _mm256_shuffle_epi8(_mm256_xor_si256(d, a), rot16);                                  \
        c = _mm256_add_epi32(c, d);                                                              \
        b = _mm256_xor_si256(b, c);                                                              \
        b = _mm256_or_si256(_mm256_srli_epi32(b, 12), _mm256_slli_epi32(b, 20));                 \
        a = _mm256_add_epi32(_mm256_add_epi32(a, b), my);                                        \
        d = _mm256_shuffle_epi8(_mm256_xor_si256(d, a), rot8);                                   \
        c = _mm256_add_epi32(c, d);                                                              \
        b = _mm256_xor_si256(b, c);                                                              \
        b = _mm256_or_si256(_mm256_srli_epi32(b, 7), _mm256_slli_epi32(b, 25));                  \
    } while (0)

/* r[l] = 8 words of lane l  ->  r[k] = word k of the 8 lanes */
__attribute__((target("avx2"))) static inline void transpose8(__m256i r[8]) {
    __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    r[0] = _mm256_permute2x128_si256(u0, u4, 0x20); r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    r[1] = _mm256_permute2x128_si256(u1, u5, 0x20); r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    r[2] = _mm256_permute2x128_si256(u2, u6, 0x20); r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    r[3] = _mm256_permute2x128_si256(u3, u7, 0x20); r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

__attribute__((target("avx2"))) static void hash8_chunks(const uint8_t *in, uint64_t counter, uint32_t cvs[8][8]) {
    const __m256i rot16 = ROT16, rot8 = ROT8;
    __m256i h[8];
    for (int i = 0; i < 8; i++) h[i] = _mm256_set1_epi32((int)IV[i]);
    uint32_t lo[8], hi[8];
    for (int l = 0; l < 8; l++) { lo[l] = (uint32_t)(counter + (uint64_t)l); hi[l] = (uint32_t)((counter + (uint64_t)l) >> 32); }
    const __m256i clo = _mm256_loadu_si256((const __m256i *)lo), chi = _mm256_loadu_si256((const __m256i *)hi);
    for (int blk = 0; blk < 16; blk++) {
        __m256i m[16]; /* little-endian x86: words load directly */
        for (int l = 0; l < 8; l++) {
            const uint8_t *b = in + (size_t)l * 1024 + (size_t)blk * 64;
            m[l] = _mm256_loadu_si256((const __m256i *)b);
            m[8 + l] = _mm256_loadu_si256((const __m256i *)(b + 32));
        }
        transpose8(m);
        transpose8(m + 8);
        uint32_t flags = (blk == 0 ? CHUNK_START : 0) | (blk == 15 ? CHUNK_END : 0);
        __m256i s0 = h[0], s1 = h[1], s2 = h[2], s3 = h[3], s4 = h[4], s5 = h[5], s6 = h[6], s7 = h[7];
        __m256i s8 = _mm256_set1_epi32((int)IV[0]), s9 = _mm256_set1_epi32((int)IV[1]);
        __m256i s10 = _mm256_set1_epi32((int)IV[2]), s11 = _mm256_set1_epi32((int)IV[3]);
        __m256i s12 = clo, s13 = chi, s14 = _mm256_set1_epi32(64), s15 = _mm256_set1_epi32((int)flags);
        for (int r = 0; r < 7; r++) {
            const uint8_t *x = SCHED[r];
            G8(s0, s4, s8, s12, m[x[0]], m[x[1]]);
            G8(s1, s5, s9, s13, m[x[2]], m[x[3]]);
            G8(s2, s6, s10, s14, m[x[4]], m[x[5]]);
            G8(s3, s7, s11, s15, m[x[6]], m[x[7]]);
            G8(s0, s5, s10, s15, m[x[8]], m[x[9]]);
            G8(s1, s6, s11, s12, m[x[10]], m[x[11]]);
            G8(s2, s7, s8, s13, m[x[12]], m[x[13]]);
            G8(s3, s4, s9, s14, m[x[14]], m[x[15]]);
        }
        h[0] = _mm256_xor_si256(s0, s8); h[1] = _mm256_xor_si256(s1, s9);
        h[2] = _mm256_xor_si256(s2, s10); h[3] = _mm256_xor_si256(s3, s11);
        h[4] = _mm256_xor_si256(s4, s12); h[5] = _mm256_xor_si256(s5, s13);
        h[6] = _mm256_xor_si256(s6, s14); h[7] = _mm256_xor_si256(s7, s15);
    }
    uint32_t t[8][8];
    for (int i = 0; i < 8; i++) _mm256_storeu_si256((__m256i *)t[i], h[i]);
    for (int l = 0; l < 8; l++)
        for (int i = 0; i < 8; i++) cvs[l][i] = t[i][l];
}

static int force_portable;

static int have_avx2(void) {
    static int v = -1; /* benign race: every thread computes the same value */
    if (v < 0) v = __builtin_cpu_supports("avx2") ? 1 : 0;
    return v && !force_portable;
}
#endif

void mp_blake3_set_portable(int on) {
#ifdef MP_B3_X86
    force_portable = on;
#else
    (void)on;
#endif
}

void mp_blake3_update(mp_blake3 *h, const void *data, size_t len) {
    const uint8_t *p = data;
    while (len > 0) {
#ifdef MP_B3_X86
        /* At a chunk boundary with more than 8 chunks left, none of the next 8 can be the root. */
        while (h->blocks_compressed == 0 && h->block_len == 0 && len > 8 * (size_t)MP_BLAKE3_CHUNK_LEN && have_avx2()) {
            uint32_t cvs[8][8];
            hash8_chunks(p, h->chunk_counter, cvs);
            for (int l = 0; l < 8; l++) push_cv(h, cvs[l], h->chunk_counter + (uint64_t)l + 1);
            chunk_reset(h, h->chunk_counter + 8);
            p += 8 * MP_BLAKE3_CHUNK_LEN;
            len -= 8 * MP_BLAKE3_CHUNK_LEN;
        }
#endif
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
