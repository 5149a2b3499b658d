/* Codec hot loops and reference decoders; see codec.h and spec/CODECS.md. */
#include "codec.h"

#include <math.h>
#include <string.h>

#define D MP_VQ_DIM

float mp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Codebooks are kept transposed to [D][KP] (KP = k rounded up to 4, padding entries far away) so
 * distances are computed 4 entries at a time with GCC/Clang vector extensions. Each lane runs the
 * same f32 operations in the same order as the scalar definition, so results do not change. */
typedef float v4f __attribute__((vector_size(16)));
#define KP(k) (((k) + 3) & ~3)
#define FAR 1e30f

static void transpose(const float *cb, int k, float *cbt) {
    int kp = KP(k);
    for (int d = 0; d < D; d++)
        for (int j = 0; j < kp; j++) cbt[d * kp + j] = j < k ? cb[(size_t)j * D + d] : FAR;
}

/* dist[j] = |r - cb[j]|^2: from 0.0f, add (r[d] - c[d])^2 for d = 0..7 in order. */
static void all_dists(const float *r, const float *cbt, int k, float *dist) {
    int kp = KP(k);
    for (int j = 0; j < kp; j += 4) {
        v4f acc = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int d = 0; d < D; d++) {
            v4f c, t;
            memcpy(&c, cbt + d * kp + j, sizeof c);
            t = r[d] - c;
            acc = acc + t * t;
        }
        memcpy(dist + j, &acc, sizeof acc);
    }
}

static int argmin(const float *dist, int k) {
    int best = 0;
    for (int j = 1; j < k; j++)
        if (dist[j] < dist[best]) best = j; /* strict: ties keep the lowest index */
    return best;
}

int mp_vq_assign(const float *x, size_t n, const float *cb, int k, int32_t *idx, float *dist) {
    float dd[256], cbt[256 * D];
    if (k < 1 || k > 256) return -1;
    transpose(cb, k, cbt);
    for (size_t i = 0; i < n; i++) {
        all_dists(x + i * D, cbt, k, dd);
        int b = argmin(dd, k);
        idx[i] = b;
        if (dist) dist[i] = dd[b];
    }
    return 0;
}

void mp_vq_mindist_update(const float *x, size_t n, const float *c, float *d) {
    for (size_t i = 0; i < n; i++) {
        float acc = 0.0f;
        for (int j = 0; j < D; j++) {
            float t = x[i * D + j] - c[j];
            acc = acc + t * t;
        }
        if (acc < d[i]) d[i] = acc;
    }
}

int mp_vq_update(const float *x, size_t n, const int32_t *idx, int k, float *cb) {
    double sum[256 * D];
    size_t cnt[256];
    if (k < 1 || k > 256) return -1;
    memset(sum, 0, sizeof(double) * (size_t)k * D);
    memset(cnt, 0, sizeof(size_t) * (size_t)k);
    for (size_t i = 0; i < n; i++) {
        int j = idx[i];
        cnt[j]++;
        for (int d = 0; d < D; d++) sum[(size_t)j * D + d] += (double)x[i * D + d];
    }
    int empty = 0;
    for (int j = 0; j < k; j++) {
        if (!cnt[j]) {
            empty++;
            continue;
        }
        for (int d = 0; d < D; d++) cb[(size_t)j * D + d] = (float)(sum[(size_t)j * D + d] / (double)cnt[j]);
    }
    return empty;
}

/* One path of the beam: total squared error so far, current residual, codes chosen so far. */
typedef struct {
    float err;
    float res[D];
    uint8_t code[8];
} path_t;

/* Insert candidate (err, parent, code) into the sorted list `top` of at most `beam` entries.
 * Candidates arrive in (parent, code) order and equal errors go after existing ones, so ties
 * keep the earlier path / lower code. */
typedef struct {
    float err;
    int parent, code;
} cand_t;

static void push(cand_t *top, int *nt, int beam, float err, int parent, int code) {
    if (*nt == beam && !(err < top[beam - 1].err)) return;
    int i = *nt < beam ? (*nt)++ : beam - 1;
    while (i > 0 && err < top[i - 1].err) {
        top[i] = top[i - 1];
        i--;
    }
    top[i].err = err;
    top[i].parent = parent;
    top[i].code = code;
}

/* cbt: the stages' codebooks, each transposed to [D][k]. */
static void encode_one(const float *x, const float *cb, const float *cbt, int stages, int k,
                       int beam, uint8_t *out) {
    path_t cur[MP_VQ_MAX_BEAM], nxt[MP_VQ_MAX_BEAM];
    cand_t top[MP_VQ_MAX_BEAM];
    float dist[256];
    int np = 1;
    memcpy(cur[0].res, x, sizeof(float) * D);
    cur[0].err = 0.0f;
    for (int s = 0; s < stages; s++) {
        const float *cbs = cb + (size_t)s * k * D;
        int nt = 0;
        for (int p = 0; p < np; p++) {
            all_dists(cur[p].res, cbt + (size_t)s * KP(k) * D, k, dist);
            if (beam == 1) {
                int b = argmin(dist, k);
                push(top, &nt, 1, dist[b], p, b);
            } else {
                for (int j = 0; j < k; j++) push(top, &nt, beam, dist[j], p, j);
            }
        }
        for (int t = 0; t < nt; t++) {
            const path_t *par = &cur[top[t].parent];
            const float *c = cbs + (size_t)top[t].code * D;
            nxt[t] = *par;
            nxt[t].err = top[t].err;
            nxt[t].code[s] = (uint8_t)top[t].code;
            for (int d = 0; d < D; d++) nxt[t].res[d] = par->res[d] - c[d];
        }
        memcpy(cur, nxt, sizeof(path_t) * (size_t)nt);
        np = nt;
    }
    memcpy(out, cur[0].code, (size_t)stages); /* cur is sorted: path 0 has the least error */
}

int mp_rvq_encode(const float *x, size_t n, const float *cb, int stages, int k, int beam,
                  uint8_t *codes) {
    if (stages < 1 || stages > 8 || k < 1 || k > 256 || beam < 1 || beam > MP_VQ_MAX_BEAM) return -1;
    float cbt[8 * 256 * D];
    for (int s = 0; s < stages; s++) transpose(cb + (size_t)s * k * D, k, cbt + (size_t)s * KP(k) * D);
    for (size_t i = 0; i < n; i++)
        encode_one(x + i * D, cb, cbt, stages, k, beam, codes + i * stages);
    return 0;
}

void mp_fwht(float *x, size_t n, size_t block) {
    for (size_t b0 = 0; b0 + block <= n; b0 += block) {
        float *v = x + b0;
        for (size_t h = 1; h < block; h <<= 1)
            for (size_t i = 0; i < block; i += 2 * h)
                for (size_t j = i; j < i + h; j++) {
                    float a = v[j], b = v[j + h];
                    v[j] = a + b;
                    v[j + h] = a - b;
                }
    }
}

int mp_rvq_decode(const uint8_t *codes, const uint16_t *scales, size_t rows, size_t cols,
                  const float *cb, int stages, int k, const float *signs, size_t block,
                  float *out) {
    size_t nv = (cols + D - 1) / D;
    if (stages < 1 || k < 1 || k > 256) return -1;
    if (signs && (block == 0 || (block & (block - 1)) || cols % block)) return -1;
    /* f32(1/sqrt(block)), rounded once from double, as spec/CODECS.md defines it */
    float inv = signs ? (float)(1.0 / sqrt((double)block)) : 1.0f;
    for (size_t r = 0; r < rows; r++) {
        float s = mp_f16_to_f32(scales[r]);
        float *o = out + r * cols;
        for (size_t v = 0; v < nv; v++) {
            const uint8_t *c = codes + (r * nv + v) * (size_t)stages;
            float acc[D];
            memcpy(acc, cb + (size_t)c[0] * D, sizeof acc);
            for (int st = 1; st < stages; st++) {
                const float *e = cb + ((size_t)st * k + c[st]) * D;
                for (int d = 0; d < D; d++) acc[d] = acc[d] + e[d];
            }
            for (int d = 0; d < D && v * D + d < cols; d++) o[v * D + d] = acc[d] * s;
        }
        if (signs) {
            mp_fwht(o, cols, block);
            for (size_t c = 0; c < cols; c++) o[c] = o[c] * inv * signs[c];
        }
    }
    return 0;
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

int mp_q8_decode(const uint8_t *data, size_t rows, size_t cols, size_t group, float *out) {
    if (!group) return -1;
    size_t cp = align_up(cols, group), ng = cp / group;
    const uint8_t *q = data + 2 * rows * ng;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            uint16_t h;
            memcpy(&h, data + 2 * (r * ng + c / group), 2);
            out[r * cols + c] = mp_f16_to_f32(h) * (float)(int8_t)q[r * cp + c];
        }
    return 0;
}

int mp_q4_decode(const uint8_t *data, size_t rows, size_t cols, size_t group, int zero_point,
                 float *out) {
    if (!group || group % 2) return -1;
    size_t cp = align_up(cols, group), ng = cp / group, planes = zero_point ? 2 : 1;
    const uint8_t *zs = data + 2 * rows * ng, *q = data + 2 * planes * rows * ng;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            uint16_t h, z;
            size_t g = r * ng + c / group;
            memcpy(&h, data + 2 * g, 2);
            uint8_t byte = q[(r * cp + c) / 2];
            int nib = (c & 1) ? byte >> 4 : byte & 15;
            if (zero_point) {
                memcpy(&z, zs + 2 * g, 2);
                out[r * cols + c] = mp_f16_to_f32(h) * (float)nib + mp_f16_to_f32(z);
            } else {
                out[r * cols + c] = mp_f16_to_f32(h) * (float)(nib - 8);
            }
        }
    return 0;
}
