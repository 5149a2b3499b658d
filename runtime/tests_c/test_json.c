/* json.c: accessors, exact integers, limits, stable codes and messages (json.h's own; a syntax
 * error's text is Python json's, so only its code and position are checked here). */
#include <stdio.h>
#include <string.h>

#include "json.h"
#include "t.h"

static mp_json_doc *P(const char *s, char *err) { return mp_json_parse(s, strlen(s), 1 << 20, err, 512); }

/* refused with the stable code (spec/FORMAT.md §11) and a message containing want */
static void refused(const char *s, const char *code, const char *want) {
    char err[512];
    const char *got = NULL;
    mp_json_doc *d = mp_json_parse_coded(s, strlen(s), 1 << 20, &got, err, sizeof err);
    CHECK(d == NULL && strstr(err, want), "%s -> %s (want %s)", s, d ? "accepted" : err, want);
    CHECK(got && !strcmp(got, code), "%s -> code %s (want %s)", s, got ? got : "none", code);
    mp_json_free(d);
}

/* refused as a JSON syntax error at line, column and char (json.h: "...: line L column C (char N)") */
static void refused_at(const char *s, size_t line, size_t col, size_t ch) {
    char err[512];
    const char *got = NULL, *at = NULL;
    mp_json_doc *d = mp_json_parse_coded(s, strlen(s), 1 << 20, &got, err, sizeof err);
    CHECK(d == NULL && got && !strcmp(got, "json_syntax"), "%s -> %s (want json_syntax)", s, got ? got : "accepted");
    for (const char *p = err; d == NULL && (p = strstr(p, ": line ")) != NULL; p++) at = p; /* the last one */
    size_t l = 0, c = 0, n = 0;
    CHECK(at && sscanf(at, ": line %zu column %zu (char %zu)", &l, &c, &n) == 3 && l == line && c == col && n == ch,
          "%s -> %s (want line %zu column %zu char %zu)", s, err, line, col, ch);
    mp_json_free(d);
}

static int canon(const char *s) {
    char err[512];
    size_t at = 0;
    mp_json_doc *d = P(s, err);
    int r = d ? mp_json_canonical(d, s, strlen(s), &at, err, sizeof err) : -2;
    mp_json_free(d);
    return r == 0 ? -(int)at - 10 : r; /* encode position of the difference */
}

int main(void) {
    char err[512];
    const char *doc = "{\"a\":[1,-2,9223372036854775807,-9223372036854775808,18446744073709551615,1.5,true,null,\"x\\u0000y\"],\"b\":{}}";
    mp_json_doc *d = P(doc, err);
    CHECK(d != NULL, "%s", err);
    const mp_json *a = mp_json_get(mp_json_root(d), "a");
    int64_t i; uint64_t u; double f; int b; size_t n;
    CHECK(mp_json_len(a) == 9, "len");
    CHECK(mp_json_as_i64(mp_json_at(a, 1), &i) == 0 && i == -2, "-2");
    CHECK(mp_json_as_u64(mp_json_at(a, 1), &u) == -1, "negative as u64");
    CHECK(mp_json_as_i64(mp_json_at(a, 2), &i) == 0 && i == INT64_MAX, "max");
    CHECK(mp_json_as_i64(mp_json_at(a, 3), &i) == 0 && i == INT64_MIN, "min");
    CHECK(mp_json_as_i64(mp_json_at(a, 4), &i) == -1 && mp_json_as_u64(mp_json_at(a, 4), &u) == 0 && u == UINT64_MAX, "u64 max");
    CHECK(mp_json_as_f64(mp_json_at(a, 5), &f) == 0 && f == 1.5 && mp_json_as_i64(mp_json_at(a, 5), &i) == -1, "float");
    CHECK(mp_json_as_bool(mp_json_at(a, 6), &b) == 0 && b == 1, "bool");
    CHECK(mp_json_is_null(mp_json_at(a, 7)) && mp_json_type_of(NULL) == MP_JSON_NULL, "null");
    const char *s = mp_json_as_str(mp_json_at(a, 8), &n);
    CHECK(s && n == 3 && s[1] == 0 && s[2] == 'y', "embedded NUL");
    CHECK(mp_json_get(mp_json_root(d), "zz") == NULL && mp_json_at(a, 99) == NULL && mp_json_get(a, "a") == NULL, "absent");
    CHECK(strcmp(mp_json_key_at(mp_json_root(d), 1), "b") == 0, "key_at");
    CHECK(mp_json_check_int64(d, err, sizeof err) == -1 && strstr(err, "18446744073709551615"), "int64 walk: %s", err);
    mp_json_free(d);

    refused("{\"a\":1,\"a\":2}", "duplicate_key", "duplicate key 'a'");
    refused("[NaN]", "forbidden_constant", "forbidden constant NaN");
    refused_at("[1,]", 1, 4, 3);
    refused_at("[1,\n\n  ]", 3, 3, 7);
    refused_at("\xEF\xBB\xBF{}", 1, 1, 0);
    refused("\"\xC0\x80\"", "invalid_utf8", "invalid UTF-8 at byte 1");
    refused("\"\xED\xA0\x80\"", "invalid_utf8", "invalid UTF-8 at byte 1"); /* surrogate */
    refused_at("{} x", 1, 4, 3);
    refused_at("{}\n x", 2, 2, 4);
    refused_at("[1, \"abc", 1, 5, 4);
    char deep[200];
    memset(deep, '[', 65); memset(deep + 65, ']', 65); deep[130] = 0;
    refused(deep, "json_depth", "JSON nesting depth 65 exceeds 64");
    deep[64] = ']'; deep[129] = 0; /* 64 deep is fine */
    memset(deep, '[', 64); memset(deep + 64, ']', 64); deep[128] = 0;
    CHECK((d = P(deep, err)) != NULL, "64 deep: %s", err);
    mp_json_free(d);
    CHECK(mp_json_parse("{}", 2, 1, err, sizeof err) == NULL && strstr(err, "limit"), "size cap");

    CHECK(canon("{\"a\":1,\"b\":[1.0,1e+16,1e-05,0.0001,\"\\n\\u0001\xC3\xA9\"]}") == 1, "canonical");
    CHECK(canon("{\"b\":1,\"a\":2}") == -(2) - 10, "unsorted keys -> first difference at char 2");
    CHECK(canon("[1.0E5]") == -(2) - 10, "exponent form (100000.0 differs at char 2)");
    CHECK(canon("[-0]") == -(1) - 10, "negative zero");
    CHECK(canon(" {}") == -(0) - 10, "whitespace");
    CHECK(canon("[\"\\u00e9\"]") == -(2) - 10, "needless escape");
    CHECK(canon("[1e400]") == -1, "inf");
    char r[64];
    d = P("{\"k\":[null,true,1.5,\"it's\"]}", err);
    mp_json_pyrepr(mp_json_root(d), r, sizeof r);
    CHECK(strcmp(r, "{'k': [None, True, 1.5, \"it's\"]}") == 0, "repr: %s", r);
    CHECK(strcmp(mp_json_pytype(mp_json_root(d)), "dict") == 0, "pytype");
    mp_json_free(d);
    T_DONE("test_json");
}
