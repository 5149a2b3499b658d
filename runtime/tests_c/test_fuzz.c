/* Robustness under ASan/UBSan: damaged variants of each valid vector (index bytes edited, cut or
 * extended and then resealed so they reach the JSON and section checks; header bits flipped).
 * Every variant must be refused with a message or open cleanly, and an opened one must serve
 * its tensors, blobs and experts without a memory error. Deterministic (fixed seed).
 * Usage: test_fuzz VECTORS_DIR SCRATCH_DIR [ITERATIONS] */
#define _GNU_SOURCE
#include <dirent.h>
#include <string.h>
#include <unistd.h>

#include "blake3.h"
#include "cache.h"
#include "container.h"
#include "t.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

/* data[0..ioff) + index, with file_size, index_length, root_hash and header_hash recomputed */
static size_t reseal(uint8_t *out, const uint8_t *data, uint64_t ioff, const uint8_t *index, size_t ilen) {
    memcpy(out, data, ioff);
    memcpy(out + ioff, index, ilen);
    put64(out + 24, ioff + ilen);
    put64(out + 40, ilen);
    mp_blake3_hash(index, ilen, out + 48);
    mp_blake3_hash(out, 96, out + 96);
    return ioff + ilen;
}

static const char JSONISH[] = "{}[]\",:0123456789-eE.\\ ntfu\xc3\xff";

static void exercise(mp_container *c) {
    char err[512];
    for (size_t i = 0; i < mpc_tensor_count(c); i++) {
        const mp_tensor_info *t = mpc_tensor_at(c, i);
        void *b = malloc(t->length);
        if (b) mpc_read_tensor(c, t, b, t->length, 1, err, sizeof err);
        free(b);
    }
    mp_expert_options o;
    mpe_options_default(&o);
    o.verify_reads = 1;
    o.reader_threads = 2;
    o.budget_bytes = 8192;
    mp_experts *e = mpe_create(c, &o, err, sizeof err);
    if (!e) return;
    for (size_t i = 0; i < mpc_bank_count(c); i++) {
        const mp_bank_info *b = mpc_bank_at(c, i);
        for (uint32_t x = 0; x < b->count && x < 8; x++) {
            int ex = (int)x;
            const uint8_t *r;
            if (mpe_acquire(e, b->layer, &ex, 1, &r, err, sizeof err) == MP_OK) mpe_release(e, b->layer, &ex, 1);
        }
    }
    mpe_destroy(e);
}

static void fuzz_one(const char *path, const char *scratch, int iters, int *opened, int *refused) {
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = malloc(n);
    if (fread(data, 1, n, f) != n) { fclose(f); free(data); return; }
    fclose(f);
    uint64_t ioff = get64(data + 32), ilen = get64(data + 40);
    uint8_t *idx = malloc(ilen + 64), *out = malloc(n + 64);
    char tmp[4096], err[2048];
    snprintf(tmp, sizeof tmp, "%s/fuzz.moepack", scratch);
    for (int it = 0; it < iters; it++) {
        size_t len = ilen, outlen;
        memcpy(idx, data + ioff, ilen);
        int op = (int)(next() % 6);
        int edits = 1 + (int)(next() % 3);
        for (int k = 0; k < edits; k++) {
            size_t p = next() % len;
            if (op == 0) idx[p] ^= (uint8_t)(1u << (next() % 8));
            else if (op == 1) idx[p] = (uint8_t)JSONISH[next() % (sizeof JSONISH - 1)];
            else if (op == 2) { len = p ? p : 1; break; }
            else if (op == 3 && len < ilen + 60) { memmove(idx + p + 1, idx + p, len - p); idx[p] = (uint8_t)JSONISH[next() % (sizeof JSONISH - 1)]; len++; }
            else if (op == 4 && len > 2) { memmove(idx + p, idx + p + 1, len - p - 1); len--; }
        }
        if (op == 5) { memcpy(out, data, n); out[next() % 128] ^= (uint8_t)(1u << (next() % 8)); outlen = n; }
        else outlen = reseal(out, data, ioff, idx, len);
        FILE *w = fopen(tmp, "wb");
        fwrite(out, 1, outlen, w);
        fclose(w);
        int rc;
        err[0] = 0;
        mp_container *c = mpc_open_rc(tmp, &rc, err, sizeof err);
        if (c) { (*opened)++; exercise(c); mpc_close(c); }
        else {
            (*refused)++;
            CHECK(rc == MP_EFORMAT && err[0], "iteration %d: rc %d, message '%s'", it, rc, err);
        }
    }
    unlink(tmp);
    free(idx); free(out); free(data);
}

int main(int argc, char **argv) {
    const char *vec = argc > 1 ? argv[1] : "../spec/vectors";
    const char *scratch = argc > 2 ? argv[2] : "/tmp";
    int iters = argc > 3 ? atoi(argv[3]) : 300;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/valid", vec);
    DIR *d = opendir(dir);
    CHECK(d != NULL, "no %s", dir);
    if (!d) T_DONE("test_fuzz");
    int opened = 0, refused = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 9 || strcmp(de->d_name + l - 8, ".moepack")) continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        fuzz_one(p, scratch, iters, &opened, &refused);
    }
    closedir(d);
    printf("  fuzz: %d variants opened, %d refused\n", opened, refused);
    CHECK(opened + refused > 0, "nothing fuzzed");
    T_DONE("test_fuzz");
}
