/* Strict JSON parser: recursive descent (depth-bounded), children copied into one arena.
 * Messages follow Python's json module so the C and Python readers report the same text. */
#include "json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mp_json_member mp_json_member;

struct mp_json {
    uint8_t type;
    uint8_t neg;     /* INT: negative */
    uint8_t big;     /* INT: magnitude does not fit 64 bits; v.s holds the literal text */
    uint8_t boolean; /* BOOL value */
    size_t len;      /* STRING bytes, ARRAY/OBJECT element count, big INT text length */
    union {
        uint64_t u;  /* INT magnitude */
        double f;    /* FLOAT */
        char *s;     /* STRING, big INT text */
        mp_json *items;
        mp_json_member *members;
    } v;
};

struct mp_json_member {
    char *key;
    size_t keylen;
    mp_json val;
};

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    max_align_t data[];
} chunk;

struct mp_json_doc {
    chunk *chunks;
    size_t total, limit;
    mp_json root;
};

typedef struct {
    const char *t;
    size_t n, pos;
    int depth;
    mp_json_doc *doc;
    mp_json *vals; size_t nvals, capvals;           /* pending array elements */
    mp_json_member *mems; size_t nmems, capmems;    /* pending object members */
    char *sbuf; size_t scap;                        /* string decode scratch */
    char *err; size_t errlen;
    int failed;
    const char *code; /* stable code of the failure (spec/FORMAT.md §11) */
} parser;

/* ---- small growable byte buffer (serialisation, repr) ---- */
typedef struct { char *b; size_t n, cap, max; int trunc; } sbuf;

static void sb_put(sbuf *s, const char *p, size_t k) {
    if (s->trunc) return;
    if (s->max && s->n + k > s->max) { k = s->max - s->n; s->trunc = 1; }
    if (s->cap - s->n < k + 1) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap - s->n < k + 1) {
            if (cap > ((size_t)-1) / 4) { s->trunc = 1; return; }
            cap *= 2;
        }
        char *nb = realloc(s->b, cap);
        if (!nb) { s->trunc = 1; return; }
        s->b = nb; s->cap = cap;
    }
    memcpy(s->b + s->n, p, k);
    s->n += k;
    s->b[s->n] = 0;
}
static void sb_str(sbuf *s, const char *p) { sb_put(s, p, strlen(p)); }

size_t mp_json_doc_bytes(const mp_json_doc *d) {
    size_t n = sizeof *d;
    for (const chunk *c = d ? d->chunks : NULL; c; c = c->next) n += sizeof *c + c->cap;
    return d ? n : 0;
}

/* ---- arena ---- */
static void *arena_alloc(mp_json_doc *d, size_t size) {
    size = (size + 15) & ~(size_t)15;
    if (size == 0) size = 16;
    chunk *c = d->chunks;
    if (!c || c->cap - c->used < size) {
        size_t cap = size > 65536 ? size : 65536;
        if (d->total + cap > d->limit) return NULL; /* bounded by a multiple of the input size */
        c = malloc(sizeof(chunk) + cap);
        if (!c) return NULL;
        c->next = d->chunks; c->used = 0; c->cap = cap;
        d->chunks = c;
        d->total += cap;
    }
    void *p = (char *)c->data + c->used;
    c->used += size;
    return p;
}

/* Python's JSONDecodeError format: "MSG: line L column C (char N)"; positions in characters. */
static void fail(parser *p, size_t at, const char *msg) {
    if (p->failed) return;
    p->failed = 1;
    p->code = "json_syntax";
    if (!p->err || !p->errlen) return;
    size_t line = 1, col = 1, ch = 0;
    for (size_t i = 0; i < at && i < p->n; i++) {
        unsigned char c = (unsigned char)p->t[i];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: same character */
        ch++;
        if (c == '\n') { line++; col = 1; } else col++;
    }
    snprintf(p->err, p->errlen, "bad JSON: %s: line %zu column %zu (char %zu)", msg, line, col, ch);
}

static void fail_text(parser *p, const char *code, const char *msg) {
    if (p->failed) return;
    p->failed = 1;
    p->code = code;
    if (p->err && p->errlen) snprintf(p->err, p->errlen, "bad JSON: %s", msg);
}

/* Offset of the first invalid byte, or n if valid UTF-8 (no overlongs, surrogates, > U+10FFFF). */
static size_t utf8_invalid_at(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t need; unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c == 0xE0) { need = 2; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) need = 2;
        else if (c == 0xED) { need = 2; hi = 0x9F; }
        else if (c >= 0xEE && c <= 0xEF) need = 2;
        else if (c == 0xF0) { need = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) need = 3;
        else if (c == 0xF4) { need = 3; hi = 0x8F; }
        else return i;
        if (n - i - 1 < need) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
        i += need + 1;
    }
    return n;
}

/* Max bracket depth with string tokens blanked, as format/canonical.py:_max_depth counts it
 * (regex "(?:[^"\\]|\\.)*" ; an unterminated string token is not blanked). */
static long max_depth(const char *t, size_t n) {
    long d = 0, mx = 0;
    size_t i = 0;
    while (i < n) {
        char c = t[i];
        if (c == '"') {
            size_t j = i + 1;
            while (j < n && t[j] != '"') j += (t[j] == '\\' && j + 1 < n) ? 2 : 1;
            if (j < n) { i = j + 1; continue; }
            /* no closing quote: this '"' is an ordinary byte; later quotes cannot close either,
             * so count the rest without blanking (keeps this linear) */
            for (i = i + 1; i < n; i++) {
                if (t[i] == '[' || t[i] == '{') { if (++d > mx) mx = d; }
                else if (t[i] == ']' || t[i] == '}') d--;
            }
            break;
        }
        if (c == '[' || c == '{') { if (++d > mx) mx = d; }
        else if (c == ']' || c == '}') d--;
        i++;
    }
    return mx;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static void skip_ws(parser *p) { while (p->pos < p->n && is_ws(p->t[p->pos])) p->pos++; }

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_u4(parser *p, size_t at, unsigned *out) {
    if (at > p->n || p->n - at < 4) return -1;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->t[at + k]);
        if (h < 0) return -1;
        v = v * 16 + (unsigned)h;
    }
    *out = v;
    return 0;
}

static int scratch_put(parser *p, size_t *len, const char *b, size_t k) {
    if (p->scap - *len < k + 1) {
        size_t cap = p->scap ? p->scap : 256;
        while (cap - *len < k + 1) {
            if (cap > ((size_t)-1) / 2) return -1;
            cap *= 2;
        }
        char *nb = realloc(p->sbuf, cap);
        if (!nb) return -1;
        p->sbuf = nb; p->scap = cap;
    }
    memcpy(p->sbuf + *len, b, k);
    *len += k;
    return 0;
}

/* Encodes a code point as UTF-8; lone surrogates (which Python's json accepts) as WTF-8, so the
 * canonical check later reports them as a difference, like Python does. */
static size_t put_cp(char *u, unsigned cp) {
    if (cp < 0x80) { u[0] = (char)cp; return 1; }
    if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 63));
        u[2] = (char)(0x80 | (cp & 63)); return 3;
    }
    u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 63));
    u[2] = (char)(0x80 | ((cp >> 6) & 63)); u[3] = (char)(0x80 | (cp & 63)); return 4;
}

/* Parses a string at p->pos (which is '"'); returns arena copy (NUL-terminated) and its length. */
static char *parse_string(parser *p, size_t *out_len) {
    size_t start = p->pos, len = 0;
    p->pos++;
    for (;;) {
        if (p->pos >= p->n) { fail(p, start, "Unterminated string starting at"); return NULL; }
        unsigned char c = (unsigned char)p->t[p->pos];
        if (c == '"') { p->pos++; break; }
        if (c < 0x20) { fail(p, p->pos, "Invalid control character at"); return NULL; }
        if (c != '\\') {
            size_t run = p->pos;
            while (run < p->n) {
                unsigned char d = (unsigned char)p->t[run];
                if (d == '"' || d == '\\' || d < 0x20) break;
                run++;
            }
            if (scratch_put(p, &len, p->t + p->pos, run - p->pos)) { fail_text(p, "invalid", "out of memory"); return NULL; }
            p->pos = run;
            continue;
        }
        size_t esc = p->pos;
        if (p->pos + 1 >= p->n) { fail(p, start, "Unterminated string starting at"); return NULL; }
        char e = p->t[p->pos + 1], outc = 0;
        switch (e) {
        case '"': outc = '"'; break;
        case '\\': outc = '\\'; break;
        case '/': outc = '/'; break;
        case 'b': outc = '\b'; break;
        case 'f': outc = '\f'; break;
        case 'n': outc = '\n'; break;
        case 'r': outc = '\r'; break;
        case 't': outc = '\t'; break;
        case 'u': break;
        default: fail(p, esc, "Invalid \\escape"); return NULL;
        }
        if (e != 'u') {
            if (scratch_put(p, &len, &outc, 1)) { fail_text(p, "invalid", "out of memory"); return NULL; }
            p->pos += 2;
            continue;
        }
        unsigned cp, lo;
        if (read_u4(p, p->pos + 2, &cp)) { fail(p, esc + 1, "Invalid \\uXXXX escape"); return NULL; }
        p->pos += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF && p->pos + 1 < p->n && p->t[p->pos] == '\\' &&
            p->t[p->pos + 1] == 'u') {
            if (read_u4(p, p->pos + 2, &lo)) { fail(p, p->pos + 1, "Invalid \\uXXXX escape"); return NULL; }
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p->pos += 6;
            }
        }
        char u[4];
        size_t k = put_cp(u, cp);
        if (scratch_put(p, &len, u, k)) { fail_text(p, "invalid", "out of memory"); return NULL; }
    }
    char *s = arena_alloc(p->doc, len + 1);
    if (!s) { fail_text(p, "invalid", "index too large to parse (memory bound)"); return NULL; }
    if (len) memcpy(s, p->sbuf, len);
    s[len] = 0;
    *out_len = len;
    return s;
}

/* Python's repr(float): shortest round-trip digits; fixed notation when -4 < decpt <= 16. */
static void py_float_repr(double d, sbuf *o) {
    char buf[40], tmp[48];
    if (isnan(d)) { sb_str(o, "nan"); return; }
    if (isinf(d)) { sb_str(o, d < 0 ? "-inf" : "inf"); return; }
    if (signbit(d)) sb_str(o, "-");
    d = fabs(d);
    if (d == 0) { sb_str(o, "0.0"); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
        if (strtod(buf, NULL) == d) break;
    }
    char digits[24]; int nd = 0;
    const char *q = buf;
    while (*q && *q != 'e') { if (*q != '.' && nd < 23) digits[nd++] = *q; q++; }
    int exp10 = (*q == 'e') ? atoi(q + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1;
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            sb_str(o, "0.");
            for (int i = 0; i < -decpt; i++) sb_str(o, "0");
            sb_str(o, digits);
        } else if (decpt < nd) {
            sb_put(o, digits, (size_t)decpt); sb_str(o, "."); sb_str(o, digits + decpt);
        } else {
            sb_str(o, digits);
            for (int i = nd; i < decpt; i++) sb_str(o, "0");
            sb_str(o, ".0");
        }
    } else {
        sb_put(o, digits, 1);
        if (nd > 1) { sb_str(o, "."); sb_str(o, digits + 1); }
        int e = decpt - 1;
        snprintf(tmp, sizeof tmp, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
        sb_str(o, tmp);
    }
}

static int parse_value(parser *p, mp_json *out);

static int parse_number(parser *p, mp_json *out) {
    size_t start = p->pos, i = p->pos;
    int neg = 0, isfloat = 0;
    if (p->t[i] == '-') { neg = 1; i++; }
    if (i >= p->n || p->t[i] < '0' || p->t[i] > '9') {
        if (neg && p->n - i >= 8 && memcmp(p->t + i, "Infinity", 8) == 0) {
            fail_text(p, "forbidden_constant", "forbidden constant -Infinity"); return -1;
        }
        fail(p, start, "Expecting value"); return -1;
    }
    size_t int_start = i;
    if (p->t[i] == '0') i++;
    else while (i < p->n && p->t[i] >= '0' && p->t[i] <= '9') i++;
    size_t int_end = i;
    /* Python's number regex: fraction and exponent are optional and only taken when complete */
    if (i + 1 < p->n && p->t[i] == '.' && p->t[i + 1] >= '0' && p->t[i + 1] <= '9') {
        i += 2;
        while (i < p->n && p->t[i] >= '0' && p->t[i] <= '9') i++;
        isfloat = 1;
    }
    if (i < p->n && (p->t[i] == 'e' || p->t[i] == 'E')) {
        size_t j = i + 1;
        if (j < p->n && (p->t[j] == '+' || p->t[j] == '-')) j++;
        if (j < p->n && p->t[j] >= '0' && p->t[j] <= '9') {
            while (j < p->n && p->t[j] >= '0' && p->t[j] <= '9') j++;
            i = j;
            isfloat = 1;
        }
    }
    size_t toklen = i - start;
    p->pos = i;
    if (!isfloat) {
        out->type = MP_JSON_INT;
        out->neg = (uint8_t)neg;
        uint64_t m = 0;
        int big = 0;
        for (size_t k = int_start; k < int_end && !big; k++)
            big = __builtin_mul_overflow(m, (uint64_t)10, &m) ||
                  __builtin_add_overflow(m, (uint64_t)(p->t[k] - '0'), &m);
        out->v.u = m;
        if (!big) return 0;
        out->big = 1;
        char *s = arena_alloc(p->doc, toklen + 1);
        if (!s) { fail_text(p, "invalid", "index too large to parse (memory bound)"); return -1; }
        memcpy(s, p->t + start, toklen);
        s[toklen] = 0;
        out->v.s = s;
        out->len = toklen;
        return 0;
    }
    out->type = MP_JSON_FLOAT;
    char small[64];
    char *tok = toklen < sizeof small ? small : malloc(toklen + 1);
    if (!tok) { fail_text(p, "invalid", "out of memory"); return -1; }
    memcpy(tok, p->t + start, toklen);
    tok[toklen] = 0;
    out->v.f = strtod(tok, NULL); /* may be inf: Python accepts it here, dumps() refuses later */
    if (tok != small) free(tok);
    return 0;
}

static int push_val(parser *p, const mp_json *v) {
    if (p->nvals == p->capvals) {
        size_t cap = p->capvals ? p->capvals * 2 : 64;
        mp_json *n = realloc(p->vals, cap * sizeof *n);
        if (!n) return -1;
        p->vals = n; p->capvals = cap;
    }
    p->vals[p->nvals++] = *v;
    return 0;
}

static int push_mem(parser *p, const mp_json_member *m) {
    if (p->nmems == p->capmems) {
        size_t cap = p->capmems ? p->capmems * 2 : 64;
        mp_json_member *n = realloc(p->mems, cap * sizeof *n);
        if (!n) return -1;
        p->mems = n; p->capmems = cap;
    }
    p->mems[p->nmems++] = *m;
    return 0;
}

static int keycmp(const char *a, size_t al, const char *b, size_t bl) {
    size_t m = al < bl ? al : bl;
    int c = m ? memcmp(a, b, m) : 0;
    if (c) return c;
    return al < bl ? -1 : al > bl;
}

static int member_ptr_cmp(const void *x, const void *y) {
    const mp_json_member *a = *(const mp_json_member *const *)x, *b = *(const mp_json_member *const *)y;
    return keycmp(a->key, a->keylen, b->key, b->keylen);
}

static int parse_array(parser *p, mp_json *out) {
    size_t base = p->nvals;
    p->pos++;
    out->type = MP_JSON_ARRAY;
    skip_ws(p);
    if (p->pos < p->n && p->t[p->pos] == ']') { p->pos++; return 0; }
    for (;;) {
        mp_json v;
        if (parse_value(p, &v)) return -1;
        if (push_val(p, &v)) { fail_text(p, "invalid", "out of memory"); return -1; }
        skip_ws(p);
        if (p->pos < p->n && p->t[p->pos] == ']') { p->pos++; break; }
        if (p->pos >= p->n || p->t[p->pos] != ',') { fail(p, p->pos, "Expecting ',' delimiter"); return -1; }
        p->pos++;
        skip_ws(p);
    }
    size_t cnt = p->nvals - base;
    mp_json *items = arena_alloc(p->doc, cnt * sizeof *items);
    if (!items) { fail_text(p, "invalid", "index too large to parse (memory bound)"); return -1; }
    memcpy(items, p->vals + base, cnt * sizeof *items);
    p->nvals = base;
    out->v.items = items; out->len = cnt;
    return 0;
}

static int parse_object(parser *p, mp_json *out) {
    size_t base = p->nmems;
    p->pos++;
    out->type = MP_JSON_OBJECT;
    skip_ws(p);
    if (p->pos < p->n && p->t[p->pos] == '}') { p->pos++; return 0; }
    for (;;) {
        if (p->pos >= p->n || p->t[p->pos] != '"') {
            fail(p, p->pos, "Expecting property name enclosed in double quotes"); return -1;
        }
        mp_json_member m;
        memset(&m, 0, sizeof m);
        m.key = parse_string(p, &m.keylen);
        if (!m.key) return -1;
        skip_ws(p);
        if (p->pos >= p->n || p->t[p->pos] != ':') { fail(p, p->pos, "Expecting ':' delimiter"); return -1; }
        p->pos++;
        skip_ws(p);
        if (parse_value(p, &m.val)) return -1;
        if (push_mem(p, &m)) { fail_text(p, "invalid", "out of memory"); return -1; }
        skip_ws(p);
        if (p->pos < p->n && p->t[p->pos] == '}') { p->pos++; break; }
        if (p->pos >= p->n || p->t[p->pos] != ',') { fail(p, p->pos, "Expecting ',' delimiter"); return -1; }
        p->pos++;
        skip_ws(p);
    }
    size_t cnt = p->nmems - base;
    mp_json_member *mem = arena_alloc(p->doc, cnt * sizeof *mem);
    if (!mem) { fail_text(p, "invalid", "index too large to parse (memory bound)"); return -1; }
    memcpy(mem, p->mems + base, cnt * sizeof *mem);
    p->nmems = base;
    out->v.members = mem; out->len = cnt;
    if (cnt > 1) { /* duplicates: Python's hook reports the first repeated key in text order */
        const mp_json_member **ptr = malloc(cnt * sizeof *ptr);
        if (!ptr) { fail_text(p, "invalid", "out of memory"); return -1; }
        for (size_t i = 0; i < cnt; i++) ptr[i] = &mem[i];
        qsort(ptr, cnt, sizeof *ptr, member_ptr_cmp);
        /* within each group of equal keys the second occurrence in text order is where
         * Python's hook raises; report the group whose trigger comes first */
        const mp_json_member *first = NULL;
        for (size_t i = 0; i < cnt;) {
            size_t j = i + 1;
            while (j < cnt && member_ptr_cmp(&ptr[i], &ptr[j]) == 0) j++;
            if (j - i > 1) {
                const mp_json_member *m1 = NULL, *m2 = NULL; /* two lowest addresses = text order */
                for (size_t k = i; k < j; k++) {
                    if (!m1 || ptr[k] < m1) { m2 = m1; m1 = ptr[k]; }
                    else if (!m2 || ptr[k] < m2) m2 = ptr[k];
                }
                if (!first || m2 < first) first = m2;
            }
            i = j;
        }
        free(ptr);
        if (first) {
            char r[200], msg[240];
            mp_json_pyrepr_str(first->key, first->keylen, r, sizeof r);
            snprintf(msg, sizeof msg, "duplicate key %s", r);
            fail_text(p, "duplicate_key", msg);
            return -1;
        }
    }
    return 0;
}

static int lit(parser *p, const char *w) {
    size_t k = strlen(w);
    return p->n - p->pos >= k && memcmp(p->t + p->pos, w, k) == 0;
}

static int parse_value(parser *p, mp_json *out) {
    memset(out, 0, sizeof *out);
    if (p->pos >= p->n) { fail(p, p->pos, "Expecting value"); return -1; }
    char c = p->t[p->pos];
    int r;
    switch (c) {
    case '{':
    case '[':
        if (++p->depth > MP_JSON_MAX_DEPTH) { fail(p, p->pos, "nesting too deep"); return -1; }
        r = c == '{' ? parse_object(p, out) : parse_array(p, out);
        p->depth--;
        return r;
    case '"':
        out->type = MP_JSON_STRING;
        out->v.s = parse_string(p, &out->len);
        return out->v.s ? 0 : -1;
    case 'N':
        if (lit(p, "NaN")) { fail_text(p, "forbidden_constant", "forbidden constant NaN"); return -1; }
        break;
    case 'I':
        if (lit(p, "Infinity")) { fail_text(p, "forbidden_constant", "forbidden constant Infinity"); return -1; }
        break;
    case 't': if (lit(p, "true")) { out->type = MP_JSON_BOOL; out->boolean = 1; p->pos += 4; return 0; } break;
    case 'f': if (lit(p, "false")) { out->type = MP_JSON_BOOL; p->pos += 5; return 0; } break;
    case 'n': if (lit(p, "null")) { out->type = MP_JSON_NULL; p->pos += 4; return 0; } break;
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, out);
    }
    fail(p, p->pos, "Expecting value");
    return -1;
}

mp_json_doc *mp_json_parse(const char *text, size_t len, size_t max_len, char *err, size_t errlen) {
    return mp_json_parse_coded(text, len, max_len, NULL, err, errlen);
}

mp_json_doc *mp_json_parse_coded(const char *text, size_t len, size_t max_len, const char **code,
                                 char *err, size_t errlen) {
    const char *dummy;
    if (!code) code = &dummy;
    *code = "invalid";
    if (err && errlen) err[0] = 0;
    if (!text && len) { if (err && errlen) snprintf(err, errlen, "no input"); return NULL; }
    if (len > max_len) {
        if (err && errlen) snprintf(err, errlen, "JSON text of %zu bytes exceeds the limit of %zu", len, max_len);
        return NULL;
    }
    size_t bad = utf8_invalid_at((const unsigned char *)text, len);
    if (bad != len) {
        *code = "invalid_utf8";
        if (err && errlen) snprintf(err, errlen, "invalid UTF-8 at byte %zu", bad);
        return NULL;
    }
    long depth = max_depth(text, len);
    if (depth > MP_JSON_MAX_DEPTH) {
        *code = "json_depth";
        if (err && errlen) snprintf(err, errlen, "JSON nesting depth %ld exceeds %d", depth, MP_JSON_MAX_DEPTH);
        return NULL;
    }
    mp_json_doc *d = calloc(1, sizeof *d);
    if (!d) { if (err && errlen) snprintf(err, errlen, "out of memory"); return NULL; }
    /* nodes are <= 48 bytes per >= 1 input byte, strings <= their text: 64x bounds every input */
    d->limit = len > ((size_t)-1 - (1u << 20)) / 64 ? (size_t)-1 : len * 64 + (1u << 20);
    parser p;
    memset(&p, 0, sizeof p);
    p.t = text; p.n = len; p.doc = d; p.err = err; p.errlen = errlen;
    int r = -1;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        fail(&p, 0, "Unexpected UTF-8 BOM (decode using utf-8-sig)");
    } else {
        skip_ws(&p);
        r = parse_value(&p, &d->root);
        if (r == 0) {
            skip_ws(&p);
            if (p.pos != p.n) { fail(&p, p.pos, "Extra data"); r = -1; }
        }
    }
    free(p.vals); free(p.mems); free(p.sbuf);
    if (r) { *code = p.code ? p.code : "json_syntax"; mp_json_free(d); return NULL; }
    return d;
}

void mp_json_free(mp_json_doc *d) {
    if (!d) return;
    chunk *c = d->chunks;
    while (c) { chunk *n = c->next; free(c); c = n; }
    free(d);
}

const mp_json *mp_json_root(const mp_json_doc *d) { return d ? &d->root : NULL; }

/* ---- canonical serialisation (json.dumps with sort_keys, compact, ensure_ascii=False) ---- */
static void ser_str(sbuf *o, const char *s, size_t n) {
    sb_str(o, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        sb_put(o, s + run, i - run);
        run = i + 1;
        char e[8];
        switch (c) {
        case '"': sb_str(o, "\\\""); break;
        case '\\': sb_str(o, "\\\\"); break;
        case '\b': sb_str(o, "\\b"); break;
        case '\f': sb_str(o, "\\f"); break;
        case '\n': sb_str(o, "\\n"); break;
        case '\r': sb_str(o, "\\r"); break;
        case '\t': sb_str(o, "\\t"); break;
        default: snprintf(e, sizeof e, "\\u%04x", c); sb_str(o, e);
        }
    }
    sb_put(o, s + run, n - run);
    sb_str(o, "\"");
}

static void ser_int(sbuf *o, const mp_json *j) {
    if (j->big) { sb_put(o, j->v.s, j->len); return; } /* literal text (no leading zeros by grammar) */
    char b[32];
    snprintf(b, sizeof b, "%s%llu", (j->neg && j->v.u) ? "-" : "", (unsigned long long)j->v.u);
    sb_str(o, b);
}

static int ser(sbuf *o, const mp_json *j) {
    switch (j->type) {
    case MP_JSON_NULL: sb_str(o, "null"); return 0;
    case MP_JSON_BOOL: sb_str(o, j->boolean ? "true" : "false"); return 0;
    case MP_JSON_INT: ser_int(o, j); return 0;
    case MP_JSON_FLOAT:
        if (!isfinite(j->v.f)) return -1;
        py_float_repr(j->v.f, o);
        return 0;
    case MP_JSON_STRING: ser_str(o, j->v.s, j->len); return 0;
    case MP_JSON_ARRAY:
        sb_str(o, "[");
        for (size_t i = 0; i < j->len; i++) {
            if (i) sb_str(o, ",");
            if (ser(o, &j->v.items[i])) return -1;
        }
        sb_str(o, "]");
        return 0;
    case MP_JSON_OBJECT: {
        const mp_json_member **ptr = j->len ? malloc(j->len * sizeof *ptr) : NULL;
        if (j->len && !ptr) { o->trunc = 1; return 0; }
        for (size_t i = 0; i < j->len; i++) ptr[i] = &j->v.members[i];
        if (j->len > 1) qsort(ptr, j->len, sizeof *ptr, member_ptr_cmp);
        sb_str(o, "{");
        int r = 0;
        for (size_t i = 0; i < j->len && !r; i++) {
            if (i) sb_str(o, ",");
            ser_str(o, ptr[i]->key, ptr[i]->keylen);
            sb_str(o, ":");
            r = ser(o, &ptr[i]->val);
        }
        sb_str(o, "}");
        free(ptr);
        return r;
    }
    }
    return 0;
}

static size_t char_index(const char *t, size_t byte) {
    size_t ch = 0;
    for (size_t i = 0; i < byte; i++)
        if (((unsigned char)t[i] & 0xC0) != 0x80) ch++;
    return ch;
}

int mp_json_canonical(const mp_json_doc *d, const char *text, size_t len, size_t *char_at,
                      char *err, size_t errlen) {
    if (char_at) *char_at = 0;
    if (!d) return -1;
    sbuf o = {0};
    if (ser(&o, &d->root)) {
        free(o.b);
        if (err && errlen) snprintf(err, errlen, "a number overflows binary64"); /* canonical.OVERFLOW */
        return -1;
    }
    if (o.trunc) {
        free(o.b);
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t m = o.n < len ? o.n : len, i = 0;
    while (i < m && o.b[i] == text[i]) i++;
    int same = (i == o.n && i == len);
    if (!same && char_at) {
        /* first differing character: back up to the start of the character holding byte i */
        size_t b = i;
        while (b > 0 && b < len && ((unsigned char)text[b] & 0xC0) == 0x80) b--;
        *char_at = char_index(text, b);
    }
    free(o.b);
    return same;
}

int mp_json_check_int64(const mp_json_doc *d, char *err, size_t errlen) {
    if (!d) return -1;
    size_t cap = 64, n = 0;
    const mp_json **st = malloc(cap * sizeof *st);
    if (!st) { if (err && errlen) snprintf(err, errlen, "out of memory"); return -1; }
    st[n++] = &d->root;
    int r = 0;
    while (n && !r) {
        const mp_json *x = st[--n];
        if (x->type == MP_JSON_ARRAY || x->type == MP_JSON_OBJECT) {
            if (cap - n < x->len) {
                while (cap - n < x->len) cap *= 2;
                const mp_json **ns = realloc(st, cap * sizeof *st);
                if (!ns) { if (err && errlen) snprintf(err, errlen, "out of memory"); r = -1; break; }
                st = ns;
            }
            for (size_t i = 0; i < x->len; i++)
                st[n++] = x->type == MP_JSON_ARRAY ? &x->v.items[i] : &x->v.members[i].val;
        } else if (x->type == MP_JSON_INT) {
            int64_t v;
            if (mp_json_as_i64(x, &v)) {
                sbuf o = {0};
                ser_int(&o, x);
                if (err && errlen)
                    snprintf(err, errlen, "integer out of range: %s (JSON integers must fit int64)", o.b ? o.b : "?");
                free(o.b);
                r = -1;
            }
        }
    }
    free(st);
    return r;
}

/* ---- accessors ---- */
mp_json_type mp_json_type_of(const mp_json *j) { return j ? (mp_json_type)j->type : MP_JSON_NULL; }
int mp_json_is_null(const mp_json *j) { return j && j->type == MP_JSON_NULL; }

const mp_json *mp_json_get(const mp_json *o, const char *key) {
    if (!o || o->type != MP_JSON_OBJECT || !key) return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < o->len; i++)
        if (o->v.members[i].keylen == kl && memcmp(o->v.members[i].key, key, kl) == 0) return &o->v.members[i].val;
    return NULL;
}

size_t mp_json_len(const mp_json *j) {
    if (!j) return 0;
    return (j->type == MP_JSON_ARRAY || j->type == MP_JSON_OBJECT || j->type == MP_JSON_STRING) ? j->len : 0;
}

const mp_json *mp_json_at(const mp_json *j, size_t i) {
    if (!j || i >= mp_json_len(j)) return NULL;
    if (j->type == MP_JSON_ARRAY) return &j->v.items[i];
    if (j->type == MP_JSON_OBJECT) return &j->v.members[i].val;
    return NULL;
}

const char *mp_json_key_at(const mp_json *o, size_t i) {
    if (!o || o->type != MP_JSON_OBJECT || i >= o->len) return NULL;
    return o->v.members[i].key;
}

int mp_json_as_i64(const mp_json *j, int64_t *out) {
    if (!j || !out || j->type != MP_JSON_INT || j->big) return -1;
    if (j->neg) {
        if (j->v.u > (uint64_t)INT64_MAX + 1) return -1;
        *out = j->v.u == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)j->v.u;
    } else {
        if (j->v.u > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)j->v.u;
    }
    return 0;
}

int mp_json_as_u64(const mp_json *j, uint64_t *out) {
    if (!j || !out || j->type != MP_JSON_INT || j->big) return -1;
    if (j->neg && j->v.u != 0) return -1;
    *out = j->v.u;
    return 0;
}

int mp_json_as_f64(const mp_json *j, double *out) {
    if (!j || !out) return -1;
    if (j->type == MP_JSON_FLOAT) { *out = j->v.f; return 0; }
    if (j->type == MP_JSON_INT && j->big) { *out = strtod(j->v.s, NULL); return 0; }
    if (j->type == MP_JSON_INT) { *out = j->neg ? -(double)j->v.u : (double)j->v.u; return 0; }
    return -1;
}

int mp_json_as_bool(const mp_json *j, int *out) {
    if (!j || !out || j->type != MP_JSON_BOOL) return -1;
    *out = j->boolean;
    return 0;
}

const char *mp_json_as_str(const mp_json *j, size_t *len) {
    if (!j || j->type != MP_JSON_STRING) return NULL;
    if (len) *len = j->len;
    return j->v.s;
}

/* ---- Python-flavoured descriptions for error messages ---- */
const char *mp_json_pytype(const mp_json *j) {
    switch (mp_json_type_of(j)) {
    case MP_JSON_BOOL: return "bool";
    case MP_JSON_INT: return "int";
    case MP_JSON_FLOAT: return "float";
    case MP_JSON_STRING: return "str";
    case MP_JSON_ARRAY: return "list";
    case MP_JSON_OBJECT: return "dict";
    default: return "NoneType";
    }
}

static void repr_str(sbuf *o, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    sb_put(o, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == (unsigned char)q || c == '\\') { e[0] = '\\'; e[1] = (char)c; sb_put(o, e, 2); }
        else if (c == '\n') sb_str(o, "\\n");
        else if (c == '\r') sb_str(o, "\\r");
        else if (c == '\t') sb_str(o, "\\t");
        else if (c < 0x20 || c == 0x7f) { snprintf(e, sizeof e, "\\x%02x", c); sb_str(o, e); }
        else sb_put(o, (const char *)&s[i], 1);
    }
    sb_put(o, &q, 1);
}

static void repr(sbuf *o, const mp_json *j, int depth) {
    if (o->trunc) return;
    if (depth > MP_JSON_MAX_DEPTH) { sb_str(o, "..."); return; }
    switch (mp_json_type_of(j)) {
    case MP_JSON_NULL: sb_str(o, "None"); return;
    case MP_JSON_BOOL: sb_str(o, j->boolean ? "True" : "False"); return;
    case MP_JSON_INT: ser_int(o, j); return;
    case MP_JSON_FLOAT: py_float_repr(j->v.f, o); return;
    case MP_JSON_STRING: repr_str(o, j->v.s, j->len); return;
    case MP_JSON_ARRAY:
        sb_str(o, "[");
        for (size_t i = 0; i < j->len && !o->trunc; i++) { if (i) sb_str(o, ", "); repr(o, &j->v.items[i], depth + 1); }
        sb_str(o, "]");
        return;
    case MP_JSON_OBJECT:
        sb_str(o, "{");
        for (size_t i = 0; i < j->len && !o->trunc; i++) {
            if (i) sb_str(o, ", ");
            repr_str(o, j->v.members[i].key, j->v.members[i].keylen);
            sb_str(o, ": ");
            repr(o, &j->v.members[i].val, depth + 1);
        }
        sb_str(o, "}");
        return;
    }
}

static void finish(sbuf *o, char *out, size_t outlen) {
    if (!outlen) { free(o->b); return; }
    snprintf(out, outlen, "%s", o->b ? o->b : "");
    free(o->b);
}

void mp_json_pyrepr(const mp_json *j, char *out, size_t outlen) {
    sbuf o = {0};
    o.max = outlen ? outlen - 1 : 0;
    if (!outlen) return;
    repr(&o, j, 0);
    finish(&o, out, outlen);
}

void mp_json_pyrepr_str(const char *s, size_t len, char *out, size_t outlen) {
    sbuf o = {0};
    if (!outlen) return;
    o.max = outlen - 1;
    repr_str(&o, s ? s : "", s ? len : 0);
    finish(&o, out, outlen);
}
