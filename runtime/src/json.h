/* Strict JSON parser for the container index (spec/FORMAT.md section 3), mirroring
 * format/canonical.py:parse_canonical (same checks, same order, same message texts):
 *   1. valid UTF-8            "invalid UTF-8 at byte N"
 *   2. nesting depth <= 64    "JSON nesting depth D exceeds 64" (brackets counted outside strings)
 *   3. JSON syntax            "bad JSON: <Python json message>: line L column C (char N)",
 *                             "bad JSON: duplicate key 'k'", "bad JSON: forbidden constant NaN"
 *   4. canonical form         checked separately by mp_json_canonical (re-serialises and compares)
 * Integers are exact (sign + 64-bit magnitude; larger ones keep their text); floats via strtod.
 * Nodes live in one arena bounded by a multiple of the input size. Never crashes on any input. */
#ifndef MP_JSON_H
#define MP_JSON_H

#include <stddef.h>
#include <stdint.h>

#define MP_JSON_MAX_DEPTH 64

typedef enum {
    MP_JSON_NULL = 0,
    MP_JSON_BOOL,
    MP_JSON_INT,    /* integer literal (no fraction/exponent) */
    MP_JSON_FLOAT,  /* number with fraction or exponent */
    MP_JSON_STRING,
    MP_JSON_ARRAY,
    MP_JSON_OBJECT,
} mp_json_type;

typedef struct mp_json mp_json;
typedef struct mp_json_doc mp_json_doc;

/* Parses text[0..len). On failure returns NULL and writes the message to err. */
mp_json_doc *mp_json_parse(const char *text, size_t len, size_t max_len, char *err, size_t errlen);
/* The same; on failure *code (may be NULL) gets the stable code of spec/FORMAT.md §11:
 * invalid_utf8, json_depth, json_syntax, duplicate_key, forbidden_constant, or invalid. */
mp_json_doc *mp_json_parse_coded(const char *text, size_t len, size_t max_len, const char **code,
                                 char *err, size_t errlen);
void mp_json_free(mp_json_doc *doc);
size_t mp_json_doc_bytes(const mp_json_doc *doc); /* what the parsed document holds in memory */
const mp_json *mp_json_root(const mp_json_doc *doc);

/* Canonical form check of FORMAT.md section 3: re-serialises the tree exactly like
 * json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False) and
 * compares with text. Returns 1 if equal; 0 if not, with *char_at = first differing character
 * (code points, as Python counts); -1 if it cannot be serialised (float out of range), with a
 * message in err. */
int mp_json_canonical(const mp_json_doc *doc, const char *text, size_t len, size_t *char_at,
                      char *err, size_t errlen);

/* Every integer must fit int64 (format/canonical.py:_check_ints, same LIFO walk so the same
 * integer is named). Returns 0, or -1 with "integer out of range: X (JSON integers must fit
 * int64)" in err. */
int mp_json_check_int64(const mp_json_doc *doc, char *err, size_t errlen);

/* Accessors: all accept NULL and return the "absent" answer for it. */
mp_json_type mp_json_type_of(const mp_json *j);        /* NULL -> MP_JSON_NULL */
int mp_json_is_null(const mp_json *j);                  /* 1 for JSON null (not for a NULL pointer) */
const mp_json *mp_json_get(const mp_json *obj, const char *key); /* NULL if not an object or absent */
size_t mp_json_len(const mp_json *j);                   /* elements of array/object, bytes of string, else 0 */
const mp_json *mp_json_at(const mp_json *j, size_t i);  /* array element or object member value */
const char *mp_json_key_at(const mp_json *obj, size_t i); /* object member key (NUL-terminated) */
/* Conversions return 0 on success, -1 if the type does not match or the value is out of range.
 * as_i64/as_u64 accept only integer literals that fit exactly; as_f64 accepts any number. */
int mp_json_as_i64(const mp_json *j, int64_t *out);
int mp_json_as_u64(const mp_json *j, uint64_t *out);
int mp_json_as_f64(const mp_json *j, double *out);
int mp_json_as_bool(const mp_json *j, int *out);
/* NUL-terminated string (may contain \0 from \u0000; *len gives the true length) or NULL. */
const char *mp_json_as_str(const mp_json *j, size_t *len);

/* For error messages that must read like the Python reader's:
 * Python's type(value).__name__ ("dict", "list", "str", "int", "float", "bool", "NoneType"),
 * and repr(value) (truncated to outlen). */
const char *mp_json_pytype(const mp_json *j);
void mp_json_pyrepr(const mp_json *j, char *out, size_t outlen);
/* repr() of a str given as UTF-8 bytes. */
void mp_json_pyrepr_str(const char *s, size_t len, char *out, size_t outlen);

#endif
