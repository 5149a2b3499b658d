/* A fixed pseudo-random stream for the C tests (xorshift64; each test file sets its own seed by
 * defining T_SEED before including this), and float bit patterns. */
#ifndef MP_TEST_RAND_H
#define MP_TEST_RAND_H
#include <stdint.h>
#include <string.h>

static uint64_t rng = T_SEED;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float urand(void) { return (float)(rnd() % 2000001) / 1e6f - 1.0f; } /* [-1, 1] */
static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
/* a finite f16 in about [-2, 2] (exponent 0..15: never Inf/NaN) */
static inline uint16_t f16r(void) { return (uint16_t)((rnd() & 0x8000u) | ((rnd() % 16u) << 10) | (rnd() & 0x3ffu)); }
#endif
