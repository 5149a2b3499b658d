/* The engine's row decode of trunk codecs (kernels.c mpk_row: embedding lookup and the f32 copies
 * made at load), exported so that tests compare it bit for bit with the Python reference decode
 * (moepack.format.codecs.decode).  It goes through the same codec parse and size rule as a
 * container's tensors: the scalar kernels are the C reference, there is no second decoder. */
#include <string.h>

#include "codecs.h"
#include "kernels.h"
#include "moepack.h"
#include "seterr.h"

MP_API int mp_decode_rows(const char *codec_json, int64_t rows, int64_t cols, const void *data,
                          uint64_t len, float *out, char *err, size_t errlen);

int mp_decode_rows(const char *codec_json, int64_t rows, int64_t cols, const void *data,
                   uint64_t len, float *out, char *err, size_t errlen) {
    mp_json_doc *doc = mp_json_parse(codec_json, strlen(codec_json), 1u << 16, err, errlen);
    if (!doc) return MP_EINVAL;
    const mp_json *codec = mp_json_root(doc);
    char msg[1400];
    mp_codec_info ci;
    mpk_mat m;
    int rc = MP_EINVAL;
    if (mp_json_type_of(codec) != MP_JSON_OBJECT || !mp_json_as_str(mp_json_get(codec, "name"), NULL))
        mp_seterr(err, errlen, rc, "codec must be an object with a name");
    else if ((rc = mp_codec_parse(codec, 2, (const int64_t[2]){rows, cols}, &ci, msg, sizeof msg)))
        mp_seterr(err, errlen, rc, "%s", msg);
    else if ((rc = mpk_mat_init(&m, ci.kind, rows, cols, ci.group_size, ci.zero_point, data) ? MP_EUNSUPPORTED : MP_OK))
        mp_seterr(err, errlen, rc, "codec %s has no row decode", mp_codecs[ci.kind].name);
    else if (mpk_mat_nbytes(&m) != len)
        rc = mp_seterr(err, errlen, MP_EINVAL, "%llu bytes, the codec needs %llu",
                       (unsigned long long)len, (unsigned long long)mpk_mat_nbytes(&m));
    else
        for (int64_t r = 0; r < rows; r++) mpk_row(&m, r, out + r * cols);
    mp_json_free(doc);
    return rc;
}
