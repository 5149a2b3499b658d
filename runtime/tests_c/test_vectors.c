/* The C reader on every spec vector: valid files open (and their payload hashes check out
 * through the read accessors); invalid files are refused with MP_EFORMAT, the code of their
 * .expected.json and a message that contains its substring. Usage: test_vectors SPEC_VECTORS_DIR */
#define _GNU_SOURCE
#include <dirent.h>
#include <string.h>

#include "blake3.h"
#include "container.h"
#include "t.h"

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[len] = 0; *n = (size_t)len; }
    return b;
}

static void check_valid(const char *path) {
    char err[2048];
    int rc;
    mp_container *c = mpc_open_rc(path, &rc, err, sizeof err);
    CHECK(c && rc == MP_OK, "%s: %s", path, err);
    if (!c) return;
    CHECK(strlen(mpc_id(c)) == 64, "id");
    CHECK(mp_json_as_str(mp_json_get(mpc_model(c), "arch"), NULL) != NULL, "%s: model.arch", path);
    for (size_t i = 0; i < mpc_tensor_count(c); i++) {
        const mp_tensor_info *t = mpc_tensor_at(c, i);
        CHECK(mpc_tensor(c, t->name) == t, "lookup %s", t->name);
        void *buf = malloc(t->length);
        CHECK(mpc_read_tensor(c, t, buf, t->length, 1, err, sizeof err) == MP_OK, "%s: %s", t->name, err);
        CHECK(mp_codec_nbytes(&t->codec, t->ndim, t->shape) == t->length, "%s size", t->name);
        free(buf);
    }
    CHECK(mpc_tensor(c, "no.such.tensor") == NULL, "absent tensor");
    for (size_t i = 0; i < mpc_blob_count(c); i++) {
        const mp_blob_info *b = mpc_blob_at(c, i);
        void *buf = malloc(b->length);
        CHECK(mpc_read_blob(c, b, buf, b->length, 1, err, sizeof err) == MP_OK, "%s: %s", b->name, err);
        free(buf);
    }
    for (size_t i = 0; i < mpc_bank_count(c); i++) {
        const mp_bank_info *b = mpc_bank_at(c, i);
        CHECK(mpc_bank(c, b->layer) == b, "bank lookup %d", b->layer);
        CHECK(b->stride % mpc_alignment(c) == 0 && b->parts[0].offset == 0, "bank layout");
        uint8_t *h = malloc(32ull * b->count), *rec = malloc(b->stride);
        CHECK(mpc_read_expert_hashes(c, b, h, 32ull * b->count, err, sizeof err) == MP_OK, "%s", err);
        for (uint32_t e = 0; e < b->count; e++) {
            uint8_t d[32];
            CHECK(mpc_read_at(c, b->offset + e * b->stride, rec, b->stride, err, sizeof err) == MP_OK, "%s", err);
            mp_blake3_hash(rec, b->stride, d);
            CHECK(memcmp(d, h + 32 * e, 32) == 0, "record hash layer %d expert %u", b->layer, e);
        }
        free(h);
        free(rec);
    }
    CHECK(mpc_bank(c, 1 << 30) == NULL, "absent bank");
    mpc_close(c);
}

static void check_invalid(const char *path) {
    char exp_path[4096], err[2048];
    size_t n = 0;
    snprintf(exp_path, sizeof exp_path, "%.*s.expected.json", (int)(strlen(path) - 8), path);
    char *text = slurp(exp_path, &n);
    CHECK(text != NULL, "no %s", exp_path);
    if (!text) return;
    mp_json_doc *doc = mp_json_parse(text, n, 1 << 20, err, sizeof err);
    const char *want = doc ? mp_json_as_str(mp_json_get(mp_json_root(doc), "error"), NULL) : NULL;
    const char *want_code = doc ? mp_json_as_str(mp_json_get(mp_json_root(doc), "code"), NULL) : NULL;
    CHECK(want != NULL && want_code != NULL, "%s: no error or code key", exp_path);
    char code[64], field[768];
    int64_t offset;
    int rc = mp_container_check_info(path, code, sizeof code, field, sizeof field, &offset, err, sizeof err);
    CHECK(rc == MP_EFORMAT, "%s: rc %d (%s)", path, rc, err);
    CHECK(want && strstr(err, want), "%s:\n   want substring: %s\n   got: %s", path, want ? want : "?", err);
    CHECK(want_code && !strcmp(code, want_code), "%s: code %s, want %s", path, code, want_code ? want_code : "?");
    /* the message is "FIELD[ at offset N]: ..." with the field and offset reported */
    char head[1024];
    if (offset >= 0 && *field) snprintf(head, sizeof head, "%s at offset %lld: ", field, (long long)offset);
    else snprintf(head, sizeof head, "%s: ", field);
    CHECK(!*field || !strncmp(err, head, strlen(head)), "%s: field '%s' offset %lld vs %s", path, field, (long long)offset, err);
    mp_json_free(doc);
    free(text);
}

static int run_dir(const char *dir, int valid) {
    DIR *d = opendir(dir);
    CHECK(d != NULL, "cannot open %s", dir);
    if (!d) return 0;
    int count = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 9 || strcmp(de->d_name + l - 8, ".moepack") != 0) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (valid) check_valid(path); else check_invalid(path);
        count++;
    }
    closedir(d);
    return count;
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : "../spec/vectors";
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/valid", root);
    int nv = run_dir(dir, 1);
    snprintf(dir, sizeof dir, "%s/invalid", root);
    int ni = run_dir(dir, 0);
    CHECK(nv > 0 && ni > 0, "no vectors found under %s", root);
    char err[256];
    CHECK(mp_container_check("/nonexistent/x.moepack", err, sizeof err) == MP_EIO, "missing file");
    printf("vectors: %d valid, %d invalid\n", nv, ni);
    T_DONE("test_vectors");
}
