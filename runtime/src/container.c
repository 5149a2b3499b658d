/* Container open + validation, a line-by-line mirror of format/reader.py, header.py, rules.py,
 * sections.py and codecs.validate_codec: same checks in the same order with the same stable
 * codes (FAIL's first argument, moepack.format.errors.CODES) and messages, so both readers
 * refuse every damaged file the same way (spec/vectors). */
#define _GNU_SOURCE
#include "container.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blake3.h"
#include "seterr.h"

#define HEADER_SIZE 128
#define SECTION_ALIGNMENT 64
#define MIN_ALIGNMENT 512u
#define MAX_ALIGNMENT (1u << 24)
#define MIN_INDEX_LENGTH 2u
#define MAX_INDEX_LENGTH (64u << 20)
#define MAX_U63 ((uint64_t)INT64_MAX)
#define MAX_SECTIONS 1000000u
#define MAX_NAME_BYTES 512u
#define MAX_FILE_NAME_BYTES 255u /* NAME_MAX: blob names become file names (moepack.safefs) */
#define MAX_DIM ((uint64_t)INT32_MAX)
#define MAX_ELEMENTS ((uint64_t)1 << 40)
#define MAX_EXPERTS 65536u
#define MAX_LAYER ((uint64_t)INT32_MAX)
#define MAX_BLOB_RAW ((uint64_t)1 << 30)
#define REQUIRED_FLAGS_MASK 0x0000FFFFu
#define FLAG_RVQ_TILED 0x0001u /* 1.1: rvq codes in 64-row tiles (FORMAT.md §2, CODECS.md §3) */
#define KNOWN_REQUIRED_FLAGS FLAG_RVQ_TILED

static const uint8_t MAGIC[8] = {'M', 'O', 'E', 'P', 'A', 'C', 'K', 0};

struct mp_container {
    char *path;
    int fd;
    uint16_t major, minor;
    uint32_t flags, alignment;
    uint64_t file_size, index_offset, index_length;
    char id[65];
    char *index_text;
    mp_json_doc *doc;
    const mp_json *manifest, *model;
    mp_tensor_info *tensors; size_t ntensors;
    const mp_tensor_info **tensors_by_name;
    mp_bank_info *banks; size_t nbanks;
    const mp_bank_info **banks_by_layer;
    mp_blob_info *blobs; size_t nblobs;
    size_t nsections; /* entries of tensors, blobs and banks as allocated */
};

/* ---------- messages ---------- */
typedef struct { char *err; size_t errlen; mpc_error_info *info; } E;

/* A format error "FIELD[ at offset N]: WHY" with its stable code (spec/FORMAT.md §11.1,
 * moepack.format.errors.CODES). FIELD and N are recorded in e->info by formatting the part of
 * fmt before its first ": " (with_field = 0: the message names no field; offset as given). */
__attribute__((format(printf, 5, 6)))
static int fail_at(E *e, const char *code, int with_field, int64_t offset, const char *fmt, ...) {
    va_list ap, aq;
    va_start(ap, fmt);
    va_copy(aq, ap);
    if (e->err && e->errlen) vsnprintf(e->err, e->errlen, fmt, ap);
    mpc_error_info *in = e->info;
    if (in) {
        in->code = code; in->field[0] = 0; in->offset = offset;
        const char *sep = with_field ? strstr(fmt, ": ") : NULL;
        char pre[128];
        if (sep && (size_t)(sep - fmt) < sizeof pre) {
            memcpy(pre, fmt, (size_t)(sep - fmt));
            pre[sep - fmt] = 0;
            vsnprintf(in->field, sizeof in->field, pre, aq); /* the field's arguments come first */
            char *at = NULL;
            for (char *p = strstr(in->field, " at offset "); p; p = strstr(p + 1, " at offset ")) at = p;
            if (at && at[11] && strspn(at + 11, "0123456789") == strlen(at + 11)) {
                in->offset = strtoll(at + 11, NULL, 10);
                *at = 0;
            }
        }
    }
    va_end(aq);
    va_end(ap);
    return MP_EFORMAT;
}

#define FAIL(CODE, ...) fail_at(e, CODE, 1, -1, __VA_ARGS__)

typedef char rbuf[600];
static const char *R(const mp_json *j, char *buf) { mp_json_pyrepr(j, buf, sizeof(rbuf)); return buf; }
static const char *RS(const char *s, char *buf) { mp_json_pyrepr_str(s, strlen(s), buf, sizeof(rbuf)); return buf; }
static unsigned long long U(uint64_t v) { return (unsigned long long)v; }

/* where + suffix (bounded; not inlined so the compiler does not second-guess the bound) */
__attribute__((noinline)) static void wcat(char *out, size_t n, const char *where, const char *suffix) {
    snprintf(out, n, "%s%s", where, suffix);
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; } /* callers keep x <= 2^63 */

/* ---------- rules.py ---------- */
static int chk_int(E *e, const mp_json *v, const char *where, uint64_t lo, uint64_t hi, uint64_t *out) {
    rbuf b;
    if (mp_json_type_of(v) != MP_JSON_INT || !v)
        return FAIL("wrong_type", "%s: expected an integer, got %s", where, mp_json_pytype(v));
    uint64_t u;
    if (mp_json_as_u64(v, &u) || u < lo || u > hi)
        return FAIL("out_of_range", "%s: %s outside %llu..%llu", where, R(v, b), U(lo), U(hi));
    *out = u;
    return 0;
}

static int chk_str(E *e, const mp_json *v, const char *where, const char **s, size_t *len) {
    const char *p = mp_json_as_str(v, len);
    if (!p) return FAIL("wrong_type", "%s: expected a string, got %s", where, mp_json_pytype(v));
    if (s) *s = p;
    return 0;
}

static int chk_obj(E *e, const mp_json *v, const char *where) {
    if (mp_json_type_of(v) != MP_JSON_OBJECT || !v)
        return FAIL("wrong_type", "%s: expected an object, got %s", where, mp_json_pytype(v));
    return 0;
}

static int chk_list(E *e, const mp_json *v, const char *where) {
    if (mp_json_type_of(v) != MP_JSON_ARRAY || !v)
        return FAIL("wrong_type", "%s: expected an array, got %s", where, mp_json_pytype(v));
    return 0;
}

/* rules.required: obj's value for key, or NULL after the failure `WHERE: missing key 'KEY'`
 * (missing_key; WHERE names the object) when the key is absent. A JSON null is a node, not
 * NULL: the type check that follows refuses it as wrong_type, so absent and null stay distinct. */
static const mp_json *req(E *e, const mp_json *obj, const char *key, const char *where) {
    const mp_json *v = mp_json_get(obj, key);
    rbuf b;
    if (!v) FAIL("missing_key", "%s: missing key %s", where, RS(key, b));
    return v;
}

static int chk_name(E *e, const mp_json *v, const char *where, const char **out) {
    const char *s = NULL; size_t n = 0;
    if (chk_str(e, v, where, &s, &n)) return MP_EFORMAT;
    int ok = n >= 1 && n <= MAX_NAME_BYTES;
    for (size_t i = 0; ok && i < n; i++) ok = (unsigned char)s[i] >= 0x21 && (unsigned char)s[i] <= 0x7E;
    if (!ok) return FAIL("bad_name", "%s: name must be 1-%u printable ASCII characters", where, MAX_NAME_BYTES);
    if (out) *out = s;
    return 0;
}

static int chk_hex(E *e, const mp_json *v, const char *where, uint8_t out[32]) {
    const char *s = NULL; size_t n = 0;
    if (chk_str(e, v, where, &s, &n)) return MP_EFORMAT;
    int ok = n == 64;
    for (size_t i = 0; ok && i < 64; i++) ok = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f');
    if (!ok) return FAIL("bad_hash_string", "%s: bad hash string (want 64 lowercase hex characters)", where);
    if (out)
        for (int i = 0; i < 32; i++) {
            int hi = s[2 * i] <= '9' ? s[2 * i] - '0' : s[2 * i] - 'a' + 10;
            int lo = s[2 * i + 1] <= '9' ? s[2 * i + 1] - '0' : s[2 * i + 1] - 'a' + 10;
            out[i] = (uint8_t)(hi * 16 + lo);
        }
    return 0;
}

static int chk_shape(E *e, const mp_json *v, const char *where, int *ndim, int64_t shape[4]) {
    if (chk_list(e, v, where)) return MP_EFORMAT;
    size_t n = mp_json_len(v);
    if (n < 1 || n > 4) return FAIL("bad_shape", "%s: shape must have 1..4 dimensions, has %zu", where, n);
    uint64_t prod = 1;
    int over = 0;
    for (size_t i = 0; i < n; i++) {
        char w[700];
        uint64_t d;
        snprintf(w, sizeof w, "%s[%zu]", where, i);
        if (chk_int(e, mp_json_at(v, i), w, 1, MAX_DIM, &d)) return MP_EFORMAT;
        shape[i] = (int64_t)d;
        if (__builtin_mul_overflow(prod, d, &prod)) over = 1;
    }
    if (over || prod > MAX_ELEMENTS) return FAIL("bad_shape", "%s: shape has more than %llu elements", where, U(MAX_ELEMENTS));
    *ndim = (int)n;
    return 0;
}

static int is_str(const mp_json *v, const char *lit) {
    size_t n;
    const char *s = mp_json_as_str(v, &n);
    return s && n == strlen(lit) && memcmp(s, lit, n) == 0;
}

/* ---------- codecs.validate_codec + encoded_nbytes (the trait table, codecs.c) ---------- */
/* rules.codec_nbytes: validate the codec object for shape and give its encoded size. */
static int codec_check(E *e, const mp_json *codec, int ndim, const int64_t *shape, const char *where,
                       mp_codec_info *ci, uint64_t *nbytes) {
    char pre[700], w[720], msg[1400];
    wcat(pre, sizeof pre, where, ".codec");
    if (chk_obj(e, codec, pre)) return MP_EFORMAT;
    snprintf(w, sizeof w, "%s.codec.name", where);
    const mp_json *name = req(e, codec, "name", pre);
    if (!name || chk_str(e, name, w, NULL, NULL)) return MP_EFORMAT;
    const char *code = "unknown_codec";
    for (int k = 0; k < MP_CODEC_COUNT; k++)
        if (is_str(name, mp_codecs[k].name)) code = "bad_codec";
    int rc = mp_codec_parse(codec, ndim, shape, ci, msg, sizeof msg);
    if (rc == MP_ENOMEM) return mp_seterr(e->err, e->errlen, MP_ENOMEM, "out of memory");
    if (rc) return FAIL(code, "%s: %s", pre, msg);
    *nbytes = mp_codec_nbytes(ci, ndim, shape);
    if (*nbytes == 0 || *nbytes > MAX_U63) return FAIL("out_of_range", "%s.codec size: size out of range", where);
    return 0;
}

/* ---------- name hash set ---------- */
typedef struct { uint32_t *slot; size_t mask; } htab;

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    while (*s) { h ^= (unsigned char)*s++; h *= 1099511628211ull; }
    return h;
}

static int htab_init(htab *t, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2) cap *= 2;
    t->slot = calloc(cap, sizeof *t->slot);
    t->mask = cap - 1;
    return t->slot ? 0 : -1;
}

/* Inserts key (index idx) unless present; returns the index already there, or -1 if inserted. */
static long htab_put(htab *t, const char *const *names, const char *key, uint32_t idx) {
    size_t i = (size_t)fnv1a(key) & t->mask;
    while (t->slot[i]) {
        uint32_t j = t->slot[i] - 1;
        if (strcmp(names[j], key) == 0) return (long)j;
        i = (i + 1) & t->mask;
    }
    t->slot[i] = idx + 1;
    return -1;
}

static long htab_get(const htab *t, const char *const *names, const char *key) {
    size_t i = (size_t)fnv1a(key) & t->mask;
    while (t->slot[i]) {
        uint32_t j = t->slot[i] - 1;
        if (strcmp(names[j], key) == 0) return (long)j;
        i = (i + 1) & t->mask;
    }
    return -1;
}

/* ---------- sections.py ---------- */
enum { K_TENSOR, K_BLOB, K_HASHES, K_BANK, K_OTHER };

#define WHERE_CAP 600

typedef struct {
    int kind;
    const char *name;
    uint64_t off, len;
    const mp_json *j;
    const char *where; /* points at the caller's buffer while this section is being checked */
} sec;

static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

static void make_where(size_t i, const mp_json *s, char *out, size_t n) {
    size_t nl;
    const char *name = mp_json_as_str(mp_json_get(s, "name"), &nl);
    if (name && utf8_chars(name, nl) <= 128) {
        char r[600];
        mp_json_pyrepr_str(name, nl, r, sizeof r);
        char head[40], tmp[700];
        snprintf(head, sizeof head, "index.sections[%zu] (", i);
        wcat(tmp, sizeof tmp, head, r);
        wcat(out, n, tmp, ")");
    } else {
        snprintf(out, n, "index.sections[%zu]", i);
    }
}

static int check_common(E *e, mp_container *c, size_t i, const mp_json *s, sec *x) {
    char w[720];
    char *wb = (char *)x->where; /* WHERE_CAP bytes owned by validate_sections */
    snprintf(wb, WHERE_CAP, "index.sections[%zu]", i);
    if (chk_obj(e, s, x->where)) return MP_EFORMAT;
    make_where(i, s, wb, WHERE_CAP);
    const char *W = x->where;
    x->j = s;
    wcat(w, sizeof w, W, ".type");
    const mp_json *t = req(e, s, "type", W), *v;
    if (!t || chk_str(e, t, w, NULL, NULL)) return MP_EFORMAT;
    x->kind = is_str(t, "tensor") ? K_TENSOR : is_str(t, "blob") ? K_BLOB : is_str(t, "expert_hashes") ? K_HASHES
              : is_str(t, "expert_bank") ? K_BANK : K_OTHER;
    wcat(w, sizeof w, W, ".name");
    if (!(v = req(e, s, "name", W)) || chk_name(e, v, w, &x->name)) return MP_EFORMAT;
    wcat(w, sizeof w, W, ".offset");
    if (!(v = req(e, s, "offset", W)) || chk_int(e, v, w, 0, MAX_U63, &x->off)) return MP_EFORMAT;
    wcat(w, sizeof w, W, ".length");
    if (!(v = req(e, s, "length", W)) || chk_int(e, v, w, 1, MAX_U63, &x->len)) return MP_EFORMAT;
    uint64_t need = x->kind == K_BANK ? c->alignment : SECTION_ALIGNMENT;
    if (x->off % need) return FAIL("misaligned", "%s.offset: %llu is not a multiple of %llu", W, U(x->off), U(need));
    if (x->off < c->alignment) return FAIL("header_region", "%s.offset: %llu lies in the header region (< %u)", W, U(x->off), c->alignment);
    if (x->off + x->len > c->index_offset) /* both <= 2^63-1: no overflow */
        return FAIL("past_index", "%s: extent %llu+%llu runs past the index at offset %llu", W, U(x->off), U(x->len), U(c->index_offset));
    if (x->kind == K_BANK) {
        if (mp_json_get(s, "hash")) return FAIL("bank_hash", "%s.hash: expert banks carry no section hash", W);
    } else {
        wcat(w, sizeof w, W, ".hash");
        if (!(v = req(e, s, "hash", W)) || chk_hex(e, v, w, NULL)) return MP_EFORMAT;
    }
    return 0;
}

/* rvq codes are tiled since 1.1; a 1.0 file (no flag bit 0) would be misread, so it is refused */
static int check_layout_flag(E *e, uint32_t flags, const mp_codec_info *ci, const char *where) {
    if (ci->kind == MP_CODEC_RVQ && !(flags & FLAG_RVQ_TILED))
        return FAIL("needs_reconversion", "%s.codec: rvq codes without header flag bit 0 (64-row tiles): the file was made by format 1.0 and must be reconverted: run `moepack convert` on its source checkpoint again", where);
    return 0;
}

static int check_tensor(E *e, uint32_t flags, sec *x, mp_tensor_info *t) {
    char w[720];
    const char *W = x->where;
    size_t n;
    const mp_json *v;
    wcat(w, sizeof w, W, ".class");
    if (!(v = req(e, x->j, "class", W)) || chk_str(e, v, w, &t->cls, &n)) return MP_EFORMAT;
    if (n == 0) return FAIL("empty_class", "%s.class: empty", W);
    wcat(w, sizeof w, W, ".shape");
    if (!(v = req(e, x->j, "shape", W)) || chk_shape(e, v, w, &t->ndim, t->shape)) return MP_EFORMAT;
    uint64_t nb;
    if (!(v = req(e, x->j, "codec", W))) return MP_EFORMAT;
    int r = codec_check(e, v, t->ndim, t->shape, W, &t->codec, &nb);
    if (r) return r;
    /* length-checked compare: a class with an embedded NUL is not 'codebook' (as in Python) */
    if (n == 8 && !memcmp(t->cls, "codebook", 8) && t->codec.kind != MP_CODEC_F32 && t->codec.kind != MP_CODEC_F16)
        return FAIL("class_codec", "%s.codec: codec '%s' not allowed for class 'codebook' (must be 'f32' or 'f16')", W,
                    mp_codecs[t->codec.kind].name);
    if ((r = check_layout_flag(e, flags, &t->codec, W))) return r;
    if (nb != x->len) return FAIL("length_mismatch", "%s.length: %llu != %llu bytes for shape \xc3\x97 codec", W, U(x->len), U(nb));
    t->name = x->name; t->offset = x->off; t->length = x->len;
    chk_hex(e, mp_json_get(x->j, "hash"), "", t->hash);
    return 0;
}

/* Why `s` is not a single plain file name, or NULL: moepack.safefs.name_problem, same order and
 * wording. chk_name already limits section names to printable ASCII; the control check stays so
 * this function is the whole rule on its own. */
static const char *file_name_problem(const char *s, size_t n) {
    if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
        return "is empty, '.' or '..'";
    if (memchr(s, '/', n) || memchr(s, '\\', n)) return "contains a path separator";
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7F) return "contains a control or format character";
    if (n > MAX_FILE_NAME_BYTES) return "is longer than 255 bytes";
    return NULL;
}

static int check_blob(E *e, uint32_t i_unused, sec *x, mp_blob_info *bl) {
    (void)i_unused;
    char w[720];
    rbuf b;
    const char *W = x->where;
    const char *why = file_name_problem(x->name, strlen(x->name));
    if (why) return FAIL("blob_name", "%s.name: %s; a blob name must be a plain file name", W, why);
    const mp_json *comp = req(e, x->j, "compression", W), *v;
    if (!comp) return MP_EFORMAT;
    int none = is_str(comp, "none"), zstd = is_str(comp, "zstd");
    if (!none && !zstd) return FAIL("blob_compression", "%s.compression: %s is not 'none' or 'zstd'", W, R(comp, b));
    uint64_t raw;
    wcat(w, sizeof w, W, ".raw_length");
    if (!(v = req(e, x->j, "raw_length", W)) || chk_int(e, v, w, 0, MAX_BLOB_RAW, &raw)) return MP_EFORMAT;
    if (none && raw != x->len)
        return FAIL("blob_raw_length", "%s.raw_length: %llu != length %llu for compression 'none'", W, U(raw), U(x->len));
    bl->name = x->name; bl->zstd = zstd; bl->offset = x->off; bl->length = x->len; bl->raw_length = raw;
    chk_hex(e, mp_json_get(x->j, "hash"), "", bl->hash);
    return 0;
}

static const char *const PARTS[3] = {"gate", "up", "down"};

static int check_parts(E *e, uint32_t flags, sec *x, mp_bank_info *bk, uint64_t *end) {
    char w[720], pw[720];
    const char *W = x->where;
    const mp_json *parts = req(e, x->j, "parts", W), *v;
    wcat(w, sizeof w, W, ".parts");
    if (!parts || chk_list(e, parts, w)) return MP_EFORMAT;
    size_t np = mp_json_len(parts);
    for (size_t j = 0; j < np; j++) {
        snprintf(pw, sizeof pw, "%s.parts[%zu]", W, j);
        if (chk_obj(e, mp_json_at(parts, j), pw) || !req(e, mp_json_at(parts, j), "name", pw)) return MP_EFORMAT;
    }
    int ok = np == 3;
    for (size_t j = 0; ok && j < 3; j++) ok = is_str(mp_json_get(mp_json_at(parts, j), "name"), PARTS[j]);
    if (!ok) return FAIL("part_names", "%s.parts: names must be ['gate', 'up', 'down'] in order", W);
    uint64_t pos = 0;
    for (size_t j = 0; j < 3; j++) {
        const mp_json *p = mp_json_at(parts, j);
        mp_part_info *pi = &bk->parts[j];
        pi->name = PARTS[j];
        snprintf(pw, sizeof pw, "%s.parts[%zu]", W, j);
        wcat(w, sizeof w, pw, ".shape");
        if (!(v = req(e, p, "shape", pw)) || chk_shape(e, v, w, &pi->ndim, pi->shape)) return MP_EFORMAT;
        uint64_t nb, off, len;
        if (!(v = req(e, p, "codec", pw))) return MP_EFORMAT;
        int r = codec_check(e, v, pi->ndim, pi->shape, pw, &pi->codec, &nb);
        if (r || (r = check_layout_flag(e, flags, &pi->codec, pw))) return r;
        wcat(w, sizeof w, pw, ".offset");
        if (!(v = req(e, p, "offset", pw)) || chk_int(e, v, w, 0, MAX_U63, &off)) return MP_EFORMAT;
        wcat(w, sizeof w, pw, ".length");
        if (!(v = req(e, p, "length", pw)) || chk_int(e, v, w, 1, MAX_U63, &len)) return MP_EFORMAT;
        if (off != align_up(pos, SECTION_ALIGNMENT)) return FAIL("part_offset", "%s.offset: %llu != %llu", pw, U(off), U(align_up(pos, SECTION_ALIGNMENT)));
        if (len != nb) return FAIL("length_mismatch", "%s.length: %llu != %llu bytes for shape \xc3\x97 codec", pw, U(len), U(nb));
        pi->offset = off; pi->length = len;
        pos = off + len; /* both <= 2^63-1 */
        if (pos > MAX_U63) return FAIL("out_of_range", "%s.length: record too large", pw);
    }
    *end = pos;
    return 0;
}

static int check_bank(E *e, mp_container *c, sec *x, mp_bank_info *bk) {
    char w[720];
    const char *W = x->where;
    uint64_t layer = 0, count = 0, stride = 0, rl = 0, end = 0, prod = 0;
    const mp_json *v;
    wcat(w, sizeof w, W, ".layer");
    if (!(v = req(e, x->j, "layer", W)) || chk_int(e, v, w, 0, MAX_LAYER, &layer)) return MP_EFORMAT;
    wcat(w, sizeof w, W, ".count");
    if (!(v = req(e, x->j, "count", W)) || chk_int(e, v, w, 1, MAX_EXPERTS, &count)) return MP_EFORMAT;
    wcat(w, sizeof w, W, ".stride");
    if (!(v = req(e, x->j, "stride", W)) || chk_int(e, v, w, 1, MAX_U63, &stride)) return MP_EFORMAT;
    wcat(w, sizeof w, W, ".record_length");
    if (!(v = req(e, x->j, "record_length", W)) || chk_int(e, v, w, 1, MAX_U63, &rl)) return MP_EFORMAT;
    wcat(w, sizeof w, W, ".hashes");
    if (!(v = req(e, x->j, "hashes", W)) || chk_name(e, v, w, &bk->hashes_name)) return MP_EFORMAT;
    if (stride % c->alignment) return FAIL("stride", "%s.stride: %llu is not a multiple of the alignment %u", W, U(stride), c->alignment);
    if (__builtin_mul_overflow(count, stride, &prod) || prod != x->len)
        return FAIL("bank_length", "%s.length: %llu != count %llu \xc3\x97 stride %llu", W, U(x->len), U(count), U(stride));
    int r = check_parts(e, c->flags, x, bk, &end);
    if (r) return r;
    if (rl != end) return FAIL("record_length", "%s.record_length: %llu != end of last part %llu", W, U(rl), U(end));
    if (stride != align_up(rl, c->alignment))
        return FAIL("stride", "%s.stride: %llu != record_length rounded up to the alignment (%llu)", W, U(stride), U(align_up(rl, c->alignment)));
    bk->name = x->name; bk->layer = (int)layer; bk->count = (uint32_t)count; bk->offset = x->off;
    bk->stride = stride; bk->record_length = rl; bk->length = x->len;
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp((*(const mp_tensor_info *const *)a)->name, (*(const mp_tensor_info *const *)b)->name);
}
static int cmp_bank_layer(const void *a, const void *b) {
    int x = (*(const mp_bank_info *const *)a)->layer, y = (*(const mp_bank_info *const *)b)->layer;
    return (x > y) - (x < y);
}

static int validate_sections(E *e, mp_container *c, const mp_json *value) {
    if (chk_list(e, value, "index.sections")) return MP_EFORMAT;
    size_t n = mp_json_len(value);
    if (n > MAX_SECTIONS) return FAIL("too_many_sections", "index.sections: %zu entries exceed %u", n, MAX_SECTIONS);
    int r = MP_ENOMEM;
    sec *S = calloc(n ? n : 1, sizeof *S);
    const char **names = calloc(n ? n : 1, sizeof *names);
    htab by_name = {0}, layers = {0};
    const char **layer_keys = NULL;
    long *users = NULL;
    c->nsections = n ? n : 1;
    c->tensors = calloc(n ? n : 1, sizeof *c->tensors);
    c->blobs = calloc(n ? n : 1, sizeof *c->blobs);
    c->banks = calloc(n ? n : 1, sizeof *c->banks);
    long *bank_of = calloc(n ? n : 1, sizeof *bank_of); /* section index -> bank slot */
    if (!S || !names || !c->tensors || !c->blobs || !c->banks || !bank_of || htab_init(&by_name, n)) {
        r = mp_seterr(e->err, e->errlen, MP_ENOMEM, "out of memory");
        goto out;
    }
    char wbuf[WHERE_CAP];
    for (size_t i = 0; i < n; i++) {
        sec *x = &S[i];
        x->where = wbuf;
        if ((r = check_common(e, c, i, mp_json_at(value, i), x))) goto out;
        names[i] = x->name;
        if (htab_put(&by_name, names, x->name, (uint32_t)i) >= 0) { r = FAIL("duplicate_name", "%s.name: duplicate section name", x->where); goto out; }
        bank_of[i] = -1;
        if (x->kind == K_TENSOR) {
            if ((r = check_tensor(e, c->flags, x, &c->tensors[c->ntensors]))) goto out;
            c->ntensors++;
        } else if (x->kind == K_BLOB) {
            if ((r = check_blob(e, 0, x, &c->blobs[c->nblobs]))) goto out;
            c->nblobs++;
        } else if (x->kind == K_HASHES && x->len % 32) {
            r = FAIL("hash_table_length", "%s.length: %llu is not a multiple of 32", x->where, U(x->len));
            goto out;
        } else if (x->kind == K_BANK) {
            if ((r = check_bank(e, c, x, &c->banks[c->nbanks]))) goto out;
            bank_of[i] = (long)c->nbanks++;
        }
    }
    /* extents: sorted, non-overlapping, packed as tightly as alignment allows */
    uint64_t end = c->alignment;
    for (size_t i = 0; i < n; i++) {
        sec *x = &S[i];
        make_where(i, x->j, wbuf, sizeof wbuf);
        x->where = wbuf;
        if (x->off < end) { r = FAIL("extent_overlap", "%s.offset: %llu overlaps the previous extent (ending at %llu)", x->where, U(x->off), U(end)); goto out; }
        uint64_t need = x->kind == K_BANK ? c->alignment : SECTION_ALIGNMENT;
        if (x->off - end >= need) { r = FAIL("extent_gap", "%s.offset: gap of %llu bytes before it (must be < %llu)", x->where, U(x->off - end), U(need)); goto out; }
        end = x->off + x->len;
    }
    if (c->index_offset - end >= SECTION_ALIGNMENT) {
        r = FAIL("extent_gap", "header.index_offset at offset 32: gap of %llu bytes before the index (must be < %d)", U(c->index_offset - end), SECTION_ALIGNMENT);
        goto out;
    }
    /* banks <-> hash tables */
    users = malloc((n ? n : 1) * sizeof *users); /* hash section index -> using section index, or -1 */
    layer_keys = calloc(c->nbanks ? c->nbanks : 1, sizeof *layer_keys);
    char (*lkbuf)[16] = calloc(c->nbanks ? c->nbanks : 1, 16);
    if (!users || !layer_keys || !lkbuf || htab_init(&layers, c->nbanks)) { free(lkbuf); r = mp_seterr(e->err, e->errlen, MP_ENOMEM, "out of memory"); goto out; }
    for (size_t i = 0; i < n; i++) users[i] = -1;
    rbuf b;
    size_t nb = 0;
    for (size_t i = 0; i < n; i++) {
        if (S[i].kind != K_BANK) continue;
        mp_bank_info *bk = &c->banks[bank_of[i]];
        make_where(i, S[i].j, wbuf, sizeof wbuf);
        const char *W = wbuf;
        snprintf(lkbuf[nb], 16, "%d", bk->layer);
        layer_keys[nb] = lkbuf[nb];
        if (htab_put(&layers, layer_keys, lkbuf[nb], (uint32_t)nb) >= 0) {
            r = FAIL("second_bank", "%s.layer: a second bank for layer %d", W, bk->layer); free(lkbuf); goto out;
        }
        nb++;
        long t = htab_get(&by_name, names, bk->hashes_name);
        if (t < 0 || S[t].kind != K_HASHES) {
            r = FAIL("missing_hash_table", "%s.hashes: no expert_hashes section named %s", W, RS(bk->hashes_name, b)); free(lkbuf); goto out;
        }
        if (users[t] >= 0) {
            r = FAIL("hash_table_shared", "%s.hashes: %s already used by %s", W, RS(bk->hashes_name, b), S[users[t]].name); free(lkbuf); goto out;
        }
        users[t] = (long)i;
        if (S[t].len != 32ull * bk->count) {
            r = FAIL("hash_table_length", "%s.hashes: %s has length %llu, expected count \xc3\x97 32 = %llu", W, RS(bk->hashes_name, b), U(S[t].len), 32ull * bk->count);
            free(lkbuf); goto out;
        }
        bk->hashes_offset = S[t].off;
    }
    free(lkbuf);
    for (size_t i = 0; i < n; i++)
        if (S[i].kind == K_HASHES && users[i] < 0) {
            make_where(i, S[i].j, wbuf, sizeof wbuf);
            r = FAIL("orphan_hash_table", "%s: no expert bank refers to this hash table", wbuf);
            goto out;
        }
    /* lookup tables */
    c->tensors_by_name = malloc((c->ntensors ? c->ntensors : 1) * sizeof *c->tensors_by_name);
    c->banks_by_layer = malloc((c->nbanks ? c->nbanks : 1) * sizeof *c->banks_by_layer);
    if (!c->tensors_by_name || !c->banks_by_layer) { r = mp_seterr(e->err, e->errlen, MP_ENOMEM, "out of memory"); goto out; }
    for (size_t i = 0; i < c->ntensors; i++) c->tensors_by_name[i] = &c->tensors[i];
    for (size_t i = 0; i < c->nbanks; i++) c->banks_by_layer[i] = &c->banks[i];
    qsort(c->tensors_by_name, c->ntensors, sizeof *c->tensors_by_name, cmp_tensor_name);
    qsort(c->banks_by_layer, c->nbanks, sizeof *c->banks_by_layer, cmp_bank_layer);
    r = MP_OK;
out:
    free(S); free(names); free(by_name.slot); free(layers.slot); free(layer_keys); free(users); free(bank_of);
    return r;
}

/* ---------- rules.validate_manifest ---------- */
static int validate_manifest(E *e, const mp_json *m) {
    static const char *const KEYS[4] = {"model", "source", "converter", "codecs"};
    char w[700];
    const char *W = "index.manifest", *SW = "index.manifest.source", *CW = "index.manifest.converter";
    const mp_json *v;
    if (chk_obj(e, m, W)) return MP_EFORMAT;
    for (int k = 0; k < 4; k++) {
        snprintf(w, sizeof w, "%s.%s", W, KEYS[k]);
        if (!(v = req(e, m, KEYS[k], W)) || chk_obj(e, v, w)) return MP_EFORMAT;
    }
    if (!(v = req(e, mp_json_get(m, "model"), "arch", "index.manifest.model")) ||
        chk_str(e, v, "index.manifest.model.arch", NULL, NULL)) return MP_EFORMAT;
    const mp_json *src = mp_json_get(m, "source");
    if (!(v = req(e, src, "architecture", SW)) || chk_str(e, v, "index.manifest.source.architecture", NULL, NULL)) return MP_EFORMAT;
    if (!(v = req(e, src, "config", SW)) || chk_obj(e, v, "index.manifest.source.config")) return MP_EFORMAT;
    const mp_json *files = req(e, src, "files", SW);
    if (!files || chk_list(e, files, "index.manifest.source.files")) return MP_EFORMAT;
    int sorted = 1;
    const char *prev = NULL; size_t prevlen = 0;
    for (size_t i = 0; i < mp_json_len(files); i++) {
        const mp_json *f = mp_json_at(files, i);
        char fw[100];
        snprintf(fw, sizeof fw, "index.manifest.source.files[%zu]", i);
        if (chk_obj(e, f, fw)) return MP_EFORMAT;
        const char *name = NULL; size_t nl = 0; uint64_t sz = 0;
        wcat(w, sizeof w, fw, ".name");
        if (!(v = req(e, f, "name", fw)) || chk_str(e, v, w, &name, &nl)) return MP_EFORMAT;
        wcat(w, sizeof w, fw, ".size");
        if (!(v = req(e, f, "size", fw)) || chk_int(e, v, w, 0, MAX_U63, &sz)) return MP_EFORMAT;
        wcat(w, sizeof w, fw, ".sha256");
        if (!(v = req(e, f, "sha256", fw)) || chk_hex(e, v, w, NULL)) return MP_EFORMAT;
        if (prev) { /* strictly increasing by code point (= UTF-8 byte order) */
            size_t mn = prevlen < nl ? prevlen : nl;
            int cmpv = mn ? memcmp(prev, name, mn) : 0;
            if (cmpv > 0 || (cmpv == 0 && prevlen >= nl)) sorted = 0;
        }
        prev = name; prevlen = nl;
    }
    if (!sorted) return FAIL("files_unsorted", "index.manifest.source.files: not sorted by name or names repeat");
    const mp_json *skipped = mp_json_get(src, "skipped"); /* optional; when present, an array of strings */
    if (skipped) {
        if (chk_list(e, skipped, "index.manifest.source.skipped")) return MP_EFORMAT;
        for (size_t i = 0; i < mp_json_len(skipped); i++) {
            snprintf(w, sizeof w, "index.manifest.source.skipped[%zu]", i);
            if (chk_str(e, mp_json_at(skipped, i), w, NULL, NULL)) return MP_EFORMAT;
        }
    }
    const mp_json *conv = mp_json_get(m, "converter");
    if (!(v = req(e, conv, "name", CW)) || chk_str(e, v, "index.manifest.converter.name", NULL, NULL)) return MP_EFORMAT;
    if (!(v = req(e, conv, "version", CW)) || chk_str(e, v, "index.manifest.converter.version", NULL, NULL)) return MP_EFORMAT;
    if (!(v = req(e, conv, "settings", CW)) || chk_obj(e, v, "index.manifest.converter.settings")) return MP_EFORMAT;
    const mp_json *codecs = mp_json_get(m, "codecs");
    for (size_t i = 0; i < mp_json_len(codecs); i++) {
        char cw[700];
        snprintf(cw, sizeof cw, "index.manifest.codecs.%s", mp_json_key_at(codecs, i));
        if (chk_obj(e, mp_json_at(codecs, i), cw)) return MP_EFORMAT;
        wcat(w, sizeof w, cw, ".name");
        if (!(v = req(e, mp_json_at(codecs, i), "name", cw)) || chk_str(e, v, w, NULL, NULL)) return MP_EFORMAT;
    }
    return 0;
}

/* ---------- header.py ---------- */
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24); }
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }

static int parse_header(E *e, mp_container *c, const uint8_t *h, uint64_t real) {
    if (real < HEADER_SIZE)
        return fail_at(e, "truncated", 0, -1, "truncated: file size %llu is below the %d-byte header", U(real), HEADER_SIZE);
    int zero = 1;
    for (int i = 0; i < HEADER_SIZE && zero; i++) zero = h[i] == 0;
    if (zero) return fail_at(e, "unfinished", 0, 0, "unfinished conversion: header is all zero (offset 0, 128 bytes)");
    if (memcmp(h, MAGIC, 8) != 0) {
        char hx[17];
        for (int i = 0; i < 8; i++) snprintf(hx + 2 * i, 3, "%02x", h[i]);
        return FAIL("bad_magic", "header.magic at offset 0: bad magic %s (not a moepack file)", hx);
    }
    c->major = rd16(h + 8); c->minor = rd16(h + 10);
    c->flags = rd32(h + 12); c->alignment = rd32(h + 16);
    uint32_t header_size = rd32(h + 20);
    c->file_size = rd64(h + 24); c->index_offset = rd64(h + 32); c->index_length = rd64(h + 40);
    if (c->major != 1) return FAIL("unsupported_major", "header.major at offset 8: unsupported major version %u (this reader supports 1)", c->major);
    uint8_t d[32];
    mp_blake3_hash(h, 96, d);
    if (memcmp(d, h + 96, 32) != 0) return FAIL("header_hash_mismatch", "header.header_hash at offset 96: header hash mismatch (header damaged)");
    if (header_size != HEADER_SIZE) return FAIL("header_size", "header.header_size at offset 20: header_size %u != %d", header_size, HEADER_SIZE);
    uint32_t unknown = c->flags & REQUIRED_FLAGS_MASK & ~KNOWN_REQUIRED_FLAGS;
    if (unknown) return FAIL("unknown_required_flag", "header.flags at offset 12: unknown required flag bits 0x%04x", unknown);
    for (int i = 80; i < 96; i++)
        if (h[i]) return FAIL("reserved_nonzero", "header.reserved at offset 80: reserved bytes are not zero");
    uint32_t a = c->alignment;
    if (a < MIN_ALIGNMENT || a > MAX_ALIGNMENT || (a & (a - 1)))
        return FAIL("bad_alignment", "header.alignment at offset 16: alignment %u is not a power of two in %u..%u", a, MIN_ALIGNMENT, MAX_ALIGNMENT);
    if (c->file_size != real)
        return FAIL("file_size_mismatch", "header.file_size at offset 24: file_size %llu != actual file size %llu", U(c->file_size), U(real));
    if (c->index_length < MIN_INDEX_LENGTH || c->index_length > MAX_INDEX_LENGTH)
        return FAIL("index_length", "header.index_length at offset 40: index length %llu outside %u..%u", U(c->index_length), MIN_INDEX_LENGTH, MAX_INDEX_LENGTH);
    if (c->index_offset < a || c->index_offset % SECTION_ALIGNMENT)
        return FAIL("index_offset", "header.index_offset at offset 32: index offset %llu must be >= alignment %u and a multiple of %d",
                    U(c->index_offset), a, SECTION_ALIGNMENT);
    uint64_t end;
    if (__builtin_add_overflow(c->index_offset, c->index_length, &end) || end != c->file_size)
        return FAIL("index_extent", "header.index_offset at offset 32: index extent %llu+%llu does not end at file size %llu",
                    U(c->index_offset), U(c->index_length), U(c->file_size));
    memcpy(c->id, "", 1);
    mp_blake3_hex(h + 48, c->id);
    return 0;
}

/* ---------- reading ---------- */
static int pread_all(int fd, void *dst, uint64_t len, uint64_t off) {
    uint8_t *p = dst;
    while (len) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0) { if (errno == EINTR) continue; return -1; }
        if (r == 0) { errno = 0; return -1; } /* unexpected end of file */
        p += r; off += (uint64_t)r; len -= (uint64_t)r;
    }
    return 0;
}

int mpc_read_at(const mp_container *c, uint64_t off, void *dst, uint64_t len, char *err, size_t errlen) {
    E ee = {err, errlen, NULL}, *e = &ee;
    uint64_t end;
    if (!c || (!dst && len)) return mp_seterr(e->err, e->errlen, MP_EINVAL, "bad argument");
    if (__builtin_add_overflow(off, len, &end) || end > c->file_size)
        return mp_seterr(e->err, e->errlen, MP_EINVAL, "read of %llu bytes at offset %llu is outside the file (%llu bytes)", U(len), U(off), U(c->file_size));
    if (pread_all(c->fd, dst, len, off))
        return mp_seterr(e->err, e->errlen, MP_EIO, "%s: read of %llu bytes at offset %llu failed: %s", c->path, U(len), U(off),
                     errno ? strerror(errno) : "unexpected end of file");
    return MP_OK;
}

static int read_verified(const mp_container *c, const char *what, const char *name, uint64_t off, uint64_t len,
                         const uint8_t *hash, void *dst, uint64_t dst_len, int verify, char *err, size_t errlen) {
    E ee = {err, errlen, NULL}, *e = &ee;
    if (dst_len < len) return mp_seterr(e->err, e->errlen, MP_EINVAL, "%s '%s': buffer of %llu bytes < %llu", what, name, U(dst_len), U(len));
    int r = mpc_read_at(c, off, dst, len, err, errlen);
    if (r || !verify) return r;
    uint8_t d[32];
    mp_blake3_hash(dst, (size_t)len, d);
    if (memcmp(d, hash, 32) != 0)
        return mp_seterr(e->err, e->errlen, MP_ECORRUPT, "%s '%s' at offset %llu: content hash mismatch (damaged)", what, name, U(off));
    return MP_OK;
}

int mpc_read_tensor(const mp_container *c, const mp_tensor_info *t, void *dst, uint64_t dst_len, int verify, char *err, size_t errlen) {
    if (!c || !t) return mp_seterr(err, errlen, MP_EINVAL, "bad argument");
    return read_verified(c, "tensor", t->name, t->offset, t->length, t->hash, dst, dst_len, verify, err, errlen);
}

int mpc_read_blob(const mp_container *c, const mp_blob_info *b, void *dst, uint64_t dst_len, int verify, char *err, size_t errlen) {
    if (!c || !b) return mp_seterr(err, errlen, MP_EINVAL, "bad argument");
    return read_verified(c, "blob", b->name, b->offset, b->length, b->hash, dst, dst_len, verify, err, errlen);
}

int mpc_read_expert_hashes(const mp_container *c, const mp_bank_info *b, uint8_t *dst, uint64_t dst_len, char *err, size_t errlen) {
    if (!c || !b) return mp_seterr(err, errlen, MP_EINVAL, "bad argument");
    uint64_t len = 32ull * b->count;
    if (dst_len < len) return mp_seterr(err, errlen, MP_EINVAL, "hash table buffer too small");
    return mpc_read_at(c, b->hashes_offset, dst, len, err, errlen);
}

/* ---------- open ---------- */
static int open_checked(mp_container *c, E *e) {
    struct stat st;
    if (fstat(c->fd, &st) != 0) return mp_seterr(e->err, e->errlen, MP_EIO, "%s: %s", c->path, strerror(errno));
    if (!S_ISREG(st.st_mode)) {
        if (e->info) *e->info = (mpc_error_info){"not_regular_file", "file", -1};
        return mp_seterr(e->err, e->errlen, MP_EIO, "%s: not a regular file", c->path);
    }
    uint64_t real = (uint64_t)st.st_size;
    uint8_t h[HEADER_SIZE] = {0};
    if (real && pread_all(c->fd, h, real < HEADER_SIZE ? real : HEADER_SIZE, 0))
        return mp_seterr(e->err, e->errlen, MP_EIO, "%s: read failed: %s", c->path, errno ? strerror(errno) : "unexpected end of file");
    int r = parse_header(e, c, h, real);
    if (r) return r;
    /* header padding: bytes 128 .. alignment-1 are zero */
    size_t padn = c->alignment - HEADER_SIZE;
    uint8_t *pad = malloc(padn);
    if (!pad) return mp_seterr(e->err, e->errlen, MP_ENOMEM, "out of memory");
    if (pread_all(c->fd, pad, padn, HEADER_SIZE)) { free(pad); return mp_seterr(e->err, e->errlen, MP_EIO, "%s: read failed", c->path); }
    int nz = 0;
    for (size_t i = 0; i < padn && !nz; i++) nz = pad[i] != 0;
    free(pad);
    if (nz) return FAIL("header_padding", "header.padding at offset %d: header padding bytes up to the alignment (%u) are not zero", HEADER_SIZE, c->alignment);
    /* index: root hash, canonical JSON */
    c->index_text = malloc((size_t)c->index_length + 1);
    if (!c->index_text) return mp_seterr(e->err, e->errlen, MP_ENOMEM, "out of memory");
    if (pread_all(c->fd, c->index_text, c->index_length, c->index_offset))
        return mp_seterr(e->err, e->errlen, MP_EIO, "%s: read of the index failed", c->path);
    c->index_text[c->index_length] = 0;
    uint8_t d[32], root[32];
    mp_blake3_hash(c->index_text, (size_t)c->index_length, d);
    for (int i = 0; i < 32; i++) {
        unsigned v;
        sscanf(c->id + 2 * i, "%2x", &v);
        root[i] = (uint8_t)v;
    }
    if (memcmp(d, root, 32) != 0) return FAIL("index_hash_mismatch", "header.root_hash at offset 48: index hash mismatch (index damaged)");
    char jerr[400];
    const char *jcode = "json_syntax";
    c->doc = mp_json_parse_coded(c->index_text, (size_t)c->index_length, MAX_INDEX_LENGTH, &jcode, jerr, sizeof jerr);
    if (!c->doc) return FAIL(jcode, "index at offset %llu: %s", U(c->index_offset), jerr);
    if (mp_json_check_int64(c->doc, jerr, sizeof jerr)) return FAIL("integer_range", "index at offset %llu: %s", U(c->index_offset), jerr);
    size_t at;
    int canon = mp_json_canonical(c->doc, c->index_text, (size_t)c->index_length, &at, jerr, sizeof jerr);
    if (canon < 0) return FAIL("not_canonical", "index at offset %llu: not canonical JSON: %s", U(c->index_offset), jerr);
    if (canon == 0) return FAIL("not_canonical", "index at offset %llu: not canonical JSON (first difference at character %zu)", U(c->index_offset), at);
    const mp_json *root_obj = mp_json_root(c->doc);
    if (chk_obj(e, root_obj, "index")) return MP_EFORMAT;
    if (!mp_json_get(root_obj, "manifest")) return FAIL("missing_key", "index: missing key 'manifest'");
    if (!mp_json_get(root_obj, "sections")) return FAIL("missing_key", "index: missing key 'sections'");
    c->manifest = mp_json_get(root_obj, "manifest");
    if ((r = validate_manifest(e, c->manifest))) return r;
    c->model = mp_json_get(c->manifest, "model");
    return validate_sections(e, c, mp_json_get(root_obj, "sections"));
}

mp_container *mpc_open_info(const char *path, int *rc, mpc_error_info *info, char *err, size_t errlen) {
    mpc_error_info scratch;
    E ee = {err, errlen, info ? info : &scratch};
    int r;
    if (err && errlen) err[0] = 0;
    *ee.info = (mpc_error_info){NULL, "", -1};
    if (!path) { r = mp_seterr(err, errlen, MP_EINVAL, "no path"); if (rc) *rc = r; return NULL; }
    mp_container *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        free(c);
        r = mp_seterr(err, errlen, MP_ENOMEM, "out of memory");
        if (rc) *rc = r;
        return NULL;
    }
    c->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (c->fd < 0) r = mp_seterr(err, errlen, MP_EIO, "%s: %s", path, strerror(errno));
    else r = open_checked(c, &ee);
    if (rc) *rc = r;
    if (r) { mpc_close(c); return NULL; }
    return c;
}

mp_container *mpc_open_rc(const char *path, int *rc, char *err, size_t errlen) {
    return mpc_open_info(path, rc, NULL, err, errlen);
}

mp_container *mpc_open(const char *path, char *err, size_t errlen) { return mpc_open_rc(path, NULL, err, errlen); }

void mpc_close(mp_container *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    mp_json_free(c->doc);
    free(c->index_text); free(c->tensors); free(c->tensors_by_name); free(c->banks); free(c->banks_by_layer);
    free(c->blobs); free(c->path);
    free(c);
}

/* ---------- accessors ---------- */
const char *mpc_path(const mp_container *c) { return c ? c->path : NULL; }
int mpc_fd(const mp_container *c) { return c ? c->fd : -1; }
uint32_t mpc_alignment(const mp_container *c) { return c ? c->alignment : 0; }
uint64_t mpc_file_size(const mp_container *c) { return c ? c->file_size : 0; }
int mpc_version(const mp_container *c, int *minor) { if (minor) *minor = c ? c->minor : 0; return c ? c->major : 0; }
const char *mpc_id(const mp_container *c) { return c ? c->id : NULL; }
const mp_json *mpc_manifest(const mp_container *c) { return c ? c->manifest : NULL; }
const mp_json *mpc_model(const mp_container *c) { return c ? c->model : NULL; }
uint64_t mpc_held_bytes(const mp_container *c) {
    if (!c) return 0;
    const uint64_t blocks = 16 * 8; /* a malloc header each, generously */
    return sizeof *c + strlen(c->path) + 1 + c->index_length + 1 + mp_json_doc_bytes(c->doc) + blocks +
           (uint64_t)c->nsections * (sizeof *c->tensors + sizeof *c->blobs + sizeof *c->banks) +
           (uint64_t)(c->ntensors + c->nbanks) * sizeof(void *);
}

size_t mpc_tensor_count(const mp_container *c) { return c ? c->ntensors : 0; }
const mp_tensor_info *mpc_tensor_at(const mp_container *c, size_t i) { return c && i < c->ntensors ? &c->tensors[i] : NULL; }
size_t mpc_bank_count(const mp_container *c) { return c ? c->nbanks : 0; }
const mp_bank_info *mpc_bank_at(const mp_container *c, size_t i) { return c && i < c->nbanks ? &c->banks[i] : NULL; }
size_t mpc_blob_count(const mp_container *c) { return c ? c->nblobs : 0; }
const mp_blob_info *mpc_blob_at(const mp_container *c, size_t i) { return c && i < c->nblobs ? &c->blobs[i] : NULL; }

const mp_tensor_info *mpc_tensor(const mp_container *c, const char *name) {
    if (!c || !name) return NULL;
    size_t lo = 0, hi = c->ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = strcmp(c->tensors_by_name[mid]->name, name);
        if (r == 0) return c->tensors_by_name[mid];
        if (r < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

const mp_bank_info *mpc_bank(const mp_container *c, int layer) {
    if (!c) return NULL;
    size_t lo = 0, hi = c->nbanks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int l = c->banks_by_layer[mid]->layer;
        if (l == layer) return c->banks_by_layer[mid];
        if (l < layer) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

const mp_blob_info *mpc_blob(const mp_container *c, const char *name) {
    if (!c || !name) return NULL;
    for (size_t i = 0; i < c->nblobs; i++) if (strcmp(c->blobs[i].name, name) == 0) return &c->blobs[i];
    return NULL;
}

MP_API int mp_container_check(const char *path, char *err, size_t errlen) {
    return mp_container_check_info(path, NULL, 0, NULL, 0, NULL, err, errlen);
}

MP_API int mp_container_check_info(const char *path, char *code, size_t codelen, char *field, size_t fieldlen,
                                   int64_t *offset, char *err, size_t errlen) {
    int rc = MP_OK;
    mpc_error_info info;
    mp_container *c = mpc_open_info(path, &rc, &info, err, errlen);
    mpc_close(c);
    if (code && codelen) snprintf(code, codelen, "%s", rc && info.code ? info.code : "");
    if (field && fieldlen) snprintf(field, fieldlen, "%s", rc ? info.field : "");
    if (offset) *offset = rc ? info.offset : -1;
    return rc;
}
