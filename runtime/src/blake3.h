/* Portable BLAKE3-256 (unkeyed hash mode), written from the BLAKE3 specification.
 * Used for the header hash, the root hash (container ID), section hashes and --verify-reads. */
#ifndef MP_BLAKE3_H
#define MP_BLAKE3_H

#include <stddef.h>
#include <stdint.h>

#define MP_BLAKE3_OUT_LEN 32
#define MP_BLAKE3_BLOCK_LEN 64
#define MP_BLAKE3_CHUNK_LEN 1024
#define MP_BLAKE3_MAX_DEPTH 54 /* 2^54 chunks of 1 KiB = 2^64 bytes */

typedef struct {
    uint32_t cv[8];          /* chaining value of the current chunk */
    uint64_t chunk_counter;  /* index of the current chunk */
    uint8_t block[MP_BLAKE3_BLOCK_LEN];
    uint8_t block_len;       /* bytes buffered in block */
    uint8_t blocks_compressed;
    uint8_t cv_stack_len;
    uint32_t cv_stack[MP_BLAKE3_MAX_DEPTH + 1][8];
} mp_blake3;

void mp_blake3_init(mp_blake3 *h);
void mp_blake3_update(mp_blake3 *h, const void *data, size_t len);
/* Writes the 32-byte digest; h stays usable (finalize does not modify it). */
void mp_blake3_final(const mp_blake3 *h, uint8_t out[MP_BLAKE3_OUT_LEN]);
/* One-shot convenience. */
void mp_blake3_hash(const void *data, size_t len, uint8_t out[MP_BLAKE3_OUT_LEN]);
/* Tests: 1 = always use the portable code path (the AVX2 path is chosen at run time). */
void mp_blake3_set_portable(int on);
/* Lowercase hex of a 32-byte digest into out[65]. */
void mp_blake3_hex(const uint8_t digest[MP_BLAKE3_OUT_LEN], char out[65]);

#endif
