/* The codec trait table; see codecs.h.  Checks and messages mirror format/codec_*.py. */
#include "codecs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moepack.h"

typedef char rbuf[600];
static const char *R(const mp_json *j, char *buf) { mp_json_pyrepr(j, buf, sizeof(rbuf)); return buf; }

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; } /* x < 2^63 */

static int is_str(const mp_json *v, const char *lit) {
    size_t n;
    const char *s = mp_json_as_str(v, &n);
    return s && n == strlen(lit) && memcmp(s, lit, n) == 0;
}

/* codec_base.int_field: present, and type(v) is int (bool excluded) */
static int int_field(const mp_json *codec, const char *rn, const char *key, int64_t *x, char *msg,
                     size_t n) {
    rbuf b;
    const mp_json *v = mp_json_get(codec, key);
    if (!v) { /* absent; a JSON null is present and gets the type message below */
        snprintf(msg, n, "codec %s: missing key '%s'", rn, key);
        return -1;
    }
    if (mp_json_type_of(v) != MP_JSON_INT) {
        snprintf(msg, n, "codec %s: '%s' must be an integer, got %s", rn, key, R(v, b));
        return -1;
    }
    if (mp_json_as_i64(v, x)) *x = INT64_MAX; /* out of int64: fails every range check */
    return 0;
}

/* ---- float codecs: the values, little-endian ---- */
static int parse_none(const mp_json *codec, const char *rn, const int64_t *shape,
                      mp_codec_info *ci, char *msg, size_t n) {
    (void)codec, (void)rn, (void)shape, (void)ci, (void)msg, (void)n;
    return 0;
}
static uint64_t nbytes_f32(const mp_codec_info *ci, uint64_t rows, uint64_t cols) {
    (void)ci, (void)rows;
    uint64_t r;
    return __builtin_mul_overflow(cols, 4, &r) ? 0 : r;
}
static uint64_t nbytes_16(const mp_codec_info *ci, uint64_t rows, uint64_t cols) {
    (void)ci, (void)rows;
    uint64_t r;
    return __builtin_mul_overflow(cols, 2, &r) ? 0 : r;
}

/* ---- group codecs: f16 scales [rows][ng] (q4 zero point: + f16 minima), then the codes of the
 * rows padded to cols_p = ng * G columns ---- */
static int parse_group(const mp_json *codec, const char *rn, const int64_t *shape,
                       mp_codec_info *ci, char *msg, size_t n) {
    (void)shape;
    rbuf b;
    int64_t g;
    if (int_field(codec, rn, "group_size", &g, msg, n)) return -1;
    if (!(g == 16 || g == 32 || g == 64 || g == 128 || g == 256)) {
        snprintf(msg, n, "codec %s: group_size %s not in [16, 32, 64, 128, 256]", rn,
                 R(mp_json_get(codec, "group_size"), b));
        return -1;
    }
    ci->group_size = (uint32_t)g;
    return 0;
}
static int parse_q4(const mp_json *codec, const char *rn, const int64_t *shape,
                    mp_codec_info *ci, char *msg, size_t n) {
    if (parse_group(codec, rn, shape, ci, msg, n)) return -1;
    const mp_json *zp = mp_json_get(codec, "zero_point");
    int z = 0;
    if (zp && mp_json_as_bool(zp, &z)) {
        snprintf(msg, n, "codec 'q4': zero_point must be true or false");
        return -1;
    }
    ci->zero_point = z;
    return 0;
}
/* planes f16 planes of [rows][ng], then rows x cols_p codes of `bits` bits (cols < 2^31) */
static uint64_t nbytes_group(const mp_codec_info *ci, uint64_t rows, uint64_t cols, int bits) {
    uint64_t g = ci->group_size, n, t;
    if (!g) return 0;
    uint64_t cp = align_up(cols, g), planes = ci->zero_point ? 2 : 1;
    if (__builtin_mul_overflow(2 * planes * rows, cp / g, &n)) return 0;
    if (__builtin_mul_overflow(rows, cp / 8 * (uint64_t)bits, &t)) return 0; /* 8 | G | cp */
    return __builtin_add_overflow(n, t, &n) ? 0 : n;
}
static uint64_t nbytes_q8(const mp_codec_info *ci, uint64_t rows, uint64_t cols) {
    return nbytes_group(ci, rows, cols, 8);
}
static uint64_t nbytes_q4(const mp_codec_info *ci, uint64_t rows, uint64_t cols) {
    return nbytes_group(ci, rows, cols, 4);
}
static uint64_t nbytes_q6(const mp_codec_info *ci, uint64_t rows, uint64_t cols) {
    return nbytes_group(ci, rows, cols, 6);
}

/* ---- rvq: codes u8 in 64-row tiles [ceil(rows/64)][nv * stages][64], then f16 scales [rows] */
static int parse_rvq(const mp_json *codec, const char *rn, const int64_t *shape,
                     mp_codec_info *ci, char *msg, size_t n) {
    rbuf b;
    int64_t x;
    if (int_field(codec, rn, "stages", &x, msg, n)) return -1;
    if (x < 1 || x > 8) {
        snprintf(msg, n, "codec 'rvq': stages %s not in 1..8", R(mp_json_get(codec, "stages"), b));
        return -1;
    }
    ci->stages = (uint32_t)x;
    /* dim, then entries only if dim is right (Python's `or` short-circuits) */
    if (int_field(codec, rn, "dim", &x, msg, n)) return -1;
    int ok = x == 8;
    if (ok && int_field(codec, rn, "entries", &x, msg, n)) return -1;
    if (!ok || x != 256) {
        snprintf(msg, n, "codec 'rvq': only dim 8 and entries 256 exist");
        return -1;
    }
    ci->dim = 8;
    ci->entries = 256;
    const mp_json *rot = mp_json_get(codec, "rotation");
    if (rot && !is_str(rot, "none") && !is_str(rot, "hadamard")) {
        snprintf(msg, n, "codec 'rvq': rotation %s not in ['none', 'hadamard']", R(rot, b));
        return -1;
    }
    if (rot && is_str(rot, "hadamard")) {
        if (int_field(codec, rn, "rotation_block", &x, msg, n)) return -1;
        if (x < 1 || (x & (x - 1)) || shape[1] % x) {
            snprintf(msg, n, "codec 'rvq': rotation_block %s must be a power of two dividing cols %lld",
                     R(mp_json_get(codec, "rotation_block"), b), (long long)shape[1]);
            return -1;
        }
        ci->hadamard = 1;
        ci->rotation_block = (uint32_t)x;
    } else if (mp_json_get(codec, "rotation_block")) {
        snprintf(msg, n, "codec 'rvq': rotation_block given without rotation 'hadamard'");
        return -1;
    }
    return 0;
}
static uint64_t nbytes_rvq(const mp_codec_info *ci, uint64_t rows, uint64_t cols) {
    uint64_t t, n;
    if (!ci->dim || !ci->stages) return 0;
    uint64_t nv = (cols + ci->dim - 1) / ci->dim; /* rows, cols < 2^31 */
    if (__builtin_mul_overflow(align_up(rows, 64), nv, &t) ||
        __builtin_mul_overflow(t, (uint64_t)ci->stages, &t) || t > (uint64_t)INT64_MAX)
        return 0;
    return __builtin_add_overflow(t, 2 * rows, &n) ? 0 : n;
}

const mp_codec_trait mp_codecs[MP_CODEC_COUNT] = {
    [MP_CODEC_F32] = {"f32", {NULL}, 0, parse_none, nbytes_f32},
    [MP_CODEC_F16] = {"f16", {NULL}, 0, parse_none, nbytes_16},
    [MP_CODEC_BF16] = {"bf16", {NULL}, 0, parse_none, nbytes_16},
    [MP_CODEC_Q8] = {"q8", {"group_size", NULL}, 1, parse_group, nbytes_q8},
    [MP_CODEC_Q4] = {"q4", {"group_size", "zero_point", NULL}, 1, parse_q4, nbytes_q4},
    [MP_CODEC_Q6] = {"q6", {"group_size", NULL}, 1, parse_group, nbytes_q6},
    [MP_CODEC_RVQ] = {"rvq", {"stages", "dim", "entries", "rotation", "rotation_block", NULL}, 1,
                      parse_rvq, nbytes_rvq},
};

/* ---- the codec-generic part of validate_codec ---- */

static int strcmp_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int is_key(const mp_codec_trait *t, const char *k) {
    if (!strcmp(k, "name")) return 1;
    for (int j = 0; t->keys[j]; j++)
        if (!strcmp(k, t->keys[j])) return 1;
    return 0;
}

/* "codec NAME: unknown keys [...]" listed sorted like Python's sorted(set); 0 if none */
static int extra_keys(const mp_json *codec, const mp_codec_trait *t, const char *rn, char *msg,
                      size_t msglen) {
    size_t nk = mp_json_len(codec), nextra = 0;
    const char **extra = malloc((nk ? nk : 1) * sizeof *extra);
    if (!extra) return MP_ENOMEM;
    for (size_t i = 0; i < nk; i++)
        if (!is_key(t, mp_json_key_at(codec, i))) extra[nextra++] = mp_json_key_at(codec, i);
    if (nextra) {
        rbuf b;
        qsort(extra, nextra, sizeof *extra, strcmp_ptr);
        char list[600];
        size_t k = (size_t)snprintf(list, sizeof list, "[");
        for (size_t i = 0; i < nextra && k < sizeof list; i++) {
            mp_json_pyrepr_str(extra[i], strlen(extra[i]), b, sizeof b);
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", b);
        }
        if (k < sizeof list) snprintf(list + k, sizeof list - k, "]");
        snprintf(msg, msglen, "codec %s: unknown keys %s", rn, list);
    }
    free(extra);
    return nextra ? MP_EFORMAT : MP_OK;
}

static void shape_list(int ndim, const int64_t *shape, char *out, size_t n) {
    size_t k = (size_t)snprintf(out, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(out + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (k < n) snprintf(out + k, n - k, "]");
}

int mp_codec_parse(const mp_json *codec, int ndim, const int64_t *shape, mp_codec_info *ci,
                   char *msg, size_t msglen) {
    rbuf rn;
    const mp_json *jn = mp_json_get(codec, "name");
    int kind = -1;
    for (int k = 0; k < MP_CODEC_COUNT; k++)
        if (is_str(jn, mp_codecs[k].name)) kind = k;
    R(jn, rn);
    if (kind < 0) {
        snprintf(msg, msglen, "unknown codec %s", rn);
        return MP_EFORMAT;
    }
    const mp_codec_trait *t = &mp_codecs[kind];
    int rc = extra_keys(codec, t, rn, msg, msglen);
    if (rc) return rc;
    memset(ci, 0, sizeof *ci);
    ci->kind = (mp_codec_kind)kind;
    ci->json = codec;
    if (t->matrix && ndim != 2) {
        char sl[200];
        shape_list(ndim, shape, sl, sizeof sl);
        snprintf(msg, msglen, "codec %s needs a 2-D shape, got %s", rn, sl);
        return MP_EFORMAT;
    }
    return t->parse(codec, rn, shape, ci, msg, msglen) ? MP_EFORMAT : MP_OK;
}

uint64_t mp_codec_nbytes(const mp_codec_info *c, int ndim, const int64_t *shape) {
    if (!c || (unsigned)c->kind >= MP_CODEC_COUNT || ndim < 1 || ndim > 4) return 0;
    uint64_t prod = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 1 || __builtin_mul_overflow(prod, (uint64_t)shape[i], &prod)) return 0;
    const mp_codec_trait *t = &mp_codecs[c->kind];
    if (!t->matrix) return t->nbytes(c, 1, prod);
    return ndim == 2 ? t->nbytes(c, (uint64_t)shape[0], (uint64_t)shape[1]) : 0;
}
