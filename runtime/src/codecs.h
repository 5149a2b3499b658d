/* The engine's one definition of each codec (spec/FORMAT.md §8, spec/CODECS.md), like ggml's
 * type_traits: a trait table entry per codec holds its name, allowed keys, field checks and size
 * rule.  The container parses every codec object once, at open, into an mp_codec_info (the typed
 * description the model and the kernels use; nothing re-reads the JSON).  A kernel is per codec
 * and instruction set, so each instruction set's kernel table (kernels_impl.h) holds one function
 * per trunk codec, indexed by `kind`, as ggml's type_traits_cpu does per type; no kernel branches
 * on the codec.  Python's twin is moepack.format.codecs.CODECS; messages are the same texts.
 *
 * Adding a trunk codec: a kind below (before MP_CODEC_RVQ), its entry in codecs.c, its row
 * product and row decode in each kernels*.c table. */
#ifndef MP_CODECS_H
#define MP_CODECS_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"

typedef enum {
    MP_CODEC_F32 = 0,
    MP_CODEC_F16,
    MP_CODEC_BF16,
    MP_CODEC_Q8,
    MP_CODEC_Q4,
    MP_CODEC_Q6,
    MP_CODEC_RVQ,
    MP_CODEC_COUNT
} mp_codec_kind;

typedef struct mp_codec_info {
    mp_codec_kind kind;
    uint32_t group_size;           /* q8, q4, q6 */
    int zero_point;                /* q4: 1 = two f16 planes (scale, zero) */
    uint32_t stages, dim, entries; /* rvq */
    int hadamard;                  /* rvq: rotation "hadamard" */
    uint32_t rotation_block;       /* rvq with hadamard */
    const mp_json *json;           /* the codec object as stored */
} mp_codec_info;

typedef struct mp_codec_trait {
    const char *name;
    const char *keys[6]; /* allowed keys besides "name", NULL-terminated */
    int matrix;          /* 2-D shapes [rows, cols] only */
    /* The codec's own fields into ci (name, keys and the 2-D rule are checked before); 0, or -1
     * with the message in msg.  rn is the Python repr of the name, for messages. */
    int (*parse)(const mp_json *codec, const char *rn, const int64_t *shape, mp_codec_info *ci,
                 char *msg, size_t msglen);
    /* Encoded bytes of [rows, cols] (rows = 1, cols = element count for non-matrix codecs);
     * 0 on overflow. */
    uint64_t (*nbytes)(const mp_codec_info *ci, uint64_t rows, uint64_t cols);
} mp_codec_trait;

/* indexed by mp_codec_kind */
extern const mp_codec_trait mp_codecs[MP_CODEC_COUNT];

/* Parses and checks a codec object (a JSON object with a string "name") for a tensor of shape
 * into ci, as moepack.format.codecs.validate_codec: MP_OK, or MP_EFORMAT with the message
 * (without the caller's location prefix) in msg, or MP_ENOMEM. */
int mp_codec_parse(const mp_json *codec, int ndim, const int64_t *shape, mp_codec_info *ci,
                   char *msg, size_t msglen);

/* Encoded size of shape under codec (format/codecs.py:encoded_nbytes); 0 on overflow or a shape
 * the codec cannot hold. */
uint64_t mp_codec_nbytes(const mp_codec_info *codec, int ndim, const int64_t *shape);

#endif
