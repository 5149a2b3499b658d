/* Open and validate a moepack container exactly like format/reader.py (spec/FORMAT.md):
 * header (check order of section 2), header padding, root hash, canonical index JSON, manifest
 * keys, every section (common keys, extents, packing, per-type rules, codec sizes), bank ↔ hash
 * table cross-references. Same stable codes and message texts as the Python reader; errors
 * return MP_EFORMAT (or MP_EIO / MP_ENOMEM) with the message in err. No payload hashing at open.
 *
 * All pointers returned by accessors live until mpc_close. Thread-safe for concurrent readers
 * (reads use pread on a shared descriptor). */
#ifndef MP_CONTAINER_H
#define MP_CONTAINER_H

#include <stddef.h>
#include <stdint.h>

#include "codecs.h"
#include "json.h"
#include "moepack.h"

typedef struct {
    const char *name;
    const char *cls;         /* tensor class (embed, attn, norm, codebook, ...) */
    int ndim;
    int64_t shape[4];
    mp_codec_info codec;
    uint64_t offset, length; /* absolute file extent */
    uint8_t hash[32];        /* BLAKE3 of the stored bytes */
} mp_tensor_info;

enum { MP_PART_GATE = 0, MP_PART_UP = 1, MP_PART_DOWN = 2 };

typedef struct {
    const char *name;        /* "gate", "up", "down" */
    int ndim;
    int64_t shape[4];
    mp_codec_info codec;
    uint64_t offset, length; /* within the record */
} mp_part_info;

typedef struct {
    const char *name;        /* "experts.L" */
    int layer;
    uint32_t count;
    uint64_t offset, stride, record_length, length; /* record e at offset + e*stride, stride bytes */
    mp_part_info parts[3];   /* gate, up, down */
    const char *hashes_name;
    uint64_t hashes_offset;  /* count x 32 bytes of BLAKE3 record hashes */
} mp_bank_info;

typedef struct {
    const char *name;
    int zstd;                /* 1 = one zstd frame (the engine does not decompress; Python does) */
    uint64_t offset, length, raw_length;
    uint8_t hash[32];
} mp_blob_info;

typedef struct mp_container mp_container;

/* Open + full structural validation. NULL on failure (message in err). *rc (may be NULL) gets
 * MP_OK, MP_EFORMAT, MP_EIO or MP_ENOMEM. */
mp_container *mpc_open_rc(const char *path, int *rc, char *err, size_t errlen);
/* Where a refusal is: its stable code, field and byte offset (spec/FORMAT.md §11). */
typedef struct {
    const char *code;  /* §11.1 code of a format error (and not_regular_file); NULL for I/O,
                        * memory and argument errors */
    char field[768];   /* header.FIELD, index, index.manifest.KEY…, index.sections[I] ('NAME').KEY…;
                        * "" when the message names none */
    int64_t offset;    /* byte offset in the file, -1 when not known */
} mpc_error_info;
/* The same; on failure *info (may be NULL) says where. */
mp_container *mpc_open_info(const char *path, int *rc, mpc_error_info *info, char *err, size_t errlen);
mp_container *mpc_open(const char *path, char *err, size_t errlen);
void mpc_close(mp_container *c);

const char *mpc_path(const mp_container *c);
int mpc_fd(const mp_container *c);               /* buffered O_RDONLY descriptor */
uint32_t mpc_alignment(const mp_container *c);
uint64_t mpc_file_size(const mp_container *c);
int mpc_version(const mp_container *c, int *minor); /* returns major */
const char *mpc_id(const mp_container *c);       /* container ID: hex of root_hash */

const mp_json *mpc_manifest(const mp_container *c);
const mp_json *mpc_model(const mp_container *c); /* manifest.model */

/* What the open container holds in memory: its index as read and parsed, the section tables */
uint64_t mpc_held_bytes(const mp_container *c);
size_t mpc_tensor_count(const mp_container *c);
const mp_tensor_info *mpc_tensor_at(const mp_container *c, size_t i); /* file order */
const mp_tensor_info *mpc_tensor(const mp_container *c, const char *name); /* NULL if absent */

size_t mpc_bank_count(const mp_container *c);
const mp_bank_info *mpc_bank_at(const mp_container *c, size_t i);    /* file order */
const mp_bank_info *mpc_bank(const mp_container *c, int layer);       /* NULL if no bank */

size_t mpc_blob_count(const mp_container *c);
const mp_blob_info *mpc_blob_at(const mp_container *c, size_t i);
const mp_blob_info *mpc_blob(const mp_container *c, const char *name);

/* Reads len bytes at an absolute offset (loops over short reads). MP_OK / MP_EIO / MP_EINVAL. */
int mpc_read_at(const mp_container *c, uint64_t offset, void *dst, uint64_t len, char *err, size_t errlen);
/* Reads a tensor's stored bytes into dst (dst_len >= info->length). verify = 1 also checks the
 * section hash (MP_ECORRUPT on mismatch, message names the tensor and offset). */
int mpc_read_tensor(const mp_container *c, const mp_tensor_info *t, void *dst, uint64_t dst_len,
                    int verify, char *err, size_t errlen);
/* Stored (possibly zstd) bytes of a blob; same contract as mpc_read_tensor. */
int mpc_read_blob(const mp_container *c, const mp_blob_info *b, void *dst, uint64_t dst_len,
                  int verify, char *err, size_t errlen);
/* The bank's expert hash table (count x 32 bytes) into dst. */
int mpc_read_expert_hashes(const mp_container *c, const mp_bank_info *b, uint8_t *dst,
                           uint64_t dst_len, char *err, size_t errlen);

/* Exported for tests and the Python binding: open + validate + close. Returns MP_OK or an error
 * code with the message in err. */
MP_API int mp_container_check(const char *path, char *err, size_t errlen);
/* The same, also writing the refusal's code and field ("" when none) and offset (-1 when none). */
MP_API int mp_container_check_info(const char *path, char *code, size_t codelen, char *field, size_t fieldlen,
                                   int64_t *offset, char *err, size_t errlen);

#endif
