/* Scalar kernels, run-time dispatch, and the threaded drivers.
 *
 * Summation order is defined once here and mirrored exactly by kernels_avx2.c: every dot
 * product keeps 8 lane accumulators (element i goes to lane i mod 8 of its row or group), adds
 * with separate multiply and add (no FMA: fused rounding would differ from the scalar path) and
 * reduces lanes with red8().  So the scalar and AVX2 paths give bit-identical results. */
#include "kernels.h"
#include "kernels_impl.h"

#include <math.h>
#include <string.h>

const mpk_impl *mpk_select(int force_scalar) {
#if defined(__x86_64__) || defined(__i386__)
    if (!force_scalar) {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            __builtin_cpu_supports("f16c"))
            return &mpk_avx2_impl;
    }
#else
    (void)force_scalar;
#endif
    return &mpk_scalar_impl;
}

const char *mpk_impl_name(const mpk_impl *k) { return k ? k->name : mpk_scalar_impl.name; }

static const mpk_impl *impl_or_scalar(const mpk_impl *k) { return k ? k : &mpk_scalar_impl; }

float mpk_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float mpk_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* q6 code of column c: 4 codes per 3 bytes, u = b0 | b1<<8 | b2<<16 = k0 | k1<<6 | ... */
static int q6_code(const uint8_t *q, int64_t c) {
    const uint8_t *b = q + (c >> 2) * 3;
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16;
    return (int)((u >> ((c & 3) * 6)) & 63);
}

/* ---- scalar implementations ---- */

static float red8(const float l[8]) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
float mpk_red8(const float l[8]) { return red8(l); }

static float s_row_dot(const mpk_mat *w, int64_t r, const float *x) {
    float l[8] = {0};
    int64_t n = w->cols;
    if (w->codec == MPK_F32) {
        const float *row = (const float *)w->data + r * n;
        for (int64_t c = 0; c < n; c++) l[c & 7] += row[c] * x[c];
        return red8(l);
    }
    if (w->codec == MPK_F16 || w->codec == MPK_BF16) {
        const uint8_t *row = w->data + (size_t)(r * n) * 2;
        for (int64_t c = 0; c < n; c++) {
            uint16_t h = ld16(row + 2 * c);
            float v = w->codec == MPK_F16 ? mpk_f16_to_f32(h) : mpk_bf16_to_f32(h);
            l[c & 7] += v * x[c];
        }
        return red8(l);
    }
    /* grouped codecs: per-group lanes, scaled, summed over groups in order */
    const int64_t G = w->group, ng = w->ngroups;
    const uint8_t *sc = w->data + (size_t)(r * ng) * 2;
    float acc = 0.0f;
    if (w->codec == MPK_Q8) {
        const int8_t *q = (const int8_t *)(w->data + (size_t)(w->rows * ng) * 2) + r * w->cols_p;
        for (int64_t g = 0; g < ng; g++) {
            int64_t c0 = g * G, c1 = c0 + G < n ? c0 + G : n;
            float gl[8] = {0};
            for (int64_t c = c0; c < c1; c++) gl[(c - c0) & 7] += (float)q[c] * x[c];
            acc += mpk_f16_to_f32(ld16(sc + 2 * g)) * red8(gl);
        }
        return acc;
    }
    if (w->codec == MPK_Q6) {
        const uint8_t *q = w->data + (size_t)(w->rows * ng) * 2 + (size_t)(r * w->cols_p) / 4 * 3;
        for (int64_t g = 0; g < ng; g++) {
            int64_t c0 = g * G, c1 = c0 + G < n ? c0 + G : n;
            float gl[8] = {0};
            for (int64_t c = c0; c < c1; c++) gl[(c - c0) & 7] += (float)(q6_code(q, c) - 32) * x[c];
            acc += mpk_f16_to_f32(ld16(sc + 2 * g)) * red8(gl);
        }
        return acc;
    }
    /* MPK_Q4 */
    const size_t planes = w->zero_point ? 2 : 1;
    const uint8_t *mins = w->data + (size_t)(w->rows * ng) * 2 + (size_t)(r * ng) * 2;
    const uint8_t *q = w->data + planes * (size_t)(w->rows * ng) * 2 + (size_t)(r * w->cols_p) / 2;
    for (int64_t g = 0; g < ng; g++) {
        int64_t c0 = g * G, c1 = c0 + G < n ? c0 + G : n;
        float gl[8] = {0}, xl[8] = {0};
        for (int64_t c = c0; c < c1; c++) {
            int nib = (q[c >> 1] >> ((c & 1) * 4)) & 15;
            gl[(c - c0) & 7] += (float)(w->zero_point ? nib : nib - 8) * x[c];
            if (w->zero_point) xl[(c - c0) & 7] += x[c];
        }
        float part = mpk_f16_to_f32(ld16(sc + 2 * g)) * red8(gl);
        if (w->zero_point) part += mpk_f16_to_f32(ld16(mins + 2 * g)) * red8(xl);
        acc += part;
    }
    return acc;
}

static void s_rvq_lut_block(const float *cbt, int stages, const float *x, int64_t cols,
                            int64_t v, float *lut) {
    float xv[8];
    for (int d = 0; d < 8; d++) xv[d] = 8 * v + d < cols ? x[8 * v + d] : 0.0f;
    for (int s = 0; s < stages; s++) {
        const float *cs = cbt + (size_t)s * 8 * 256;
        float *out = lut + ((size_t)v * (size_t)stages + (size_t)s) * 256;
        for (int e = 0; e < 256; e++) {
            float a = xv[0] * cs[e];
            for (int d = 1; d < 8; d++) a = a + xv[d] * cs[d * 256 + e];
            out[e] = a;
        }
    }
}

static void s_rvq_rows(const uint8_t *codes, int64_t n, int64_t rows, const float *lut,
                       float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *c = codes + r * n;
        float l[8] = {0};
        for (int64_t j = 0; j < n; j++) l[j & 7] += lut[(size_t)j * 256 + c[j]];
        out[r] = red8(l);
    }
}

const mpk_impl mpk_scalar_impl = {"scalar", s_row_dot, s_rvq_lut_block, s_rvq_rows};

/* ---- shared helpers ---- */

int mpk_mat_init(mpk_mat *m, int codec, int64_t rows, int64_t cols, int64_t group,
                 int zero_point, const void *data) {
    memset(m, 0, sizeof *m);
    if (rows < 1 || cols < 1 || !data) return -1;
    m->codec = codec;
    m->rows = rows;
    m->cols = cols;
    m->data = data;
    m->cols_p = cols;
    if (codec == MPK_Q8 || codec == MPK_Q4 || codec == MPK_Q6) {
        if (group < 8 || group % 8 || group > 4096) return -1;
        m->group = group;
        m->ngroups = (cols + group - 1) / group;
        m->cols_p = m->ngroups * group;
        m->zero_point = codec == MPK_Q4 ? zero_point : 0;
    } else if (codec != MPK_F32 && codec != MPK_F16 && codec != MPK_BF16) {
        return -1;
    }
    return 0;
}

uint64_t mpk_mat_nbytes(const mpk_mat *m) {
    uint64_t r = (uint64_t)m->rows, c = (uint64_t)m->cols;
    switch (m->codec) {
    case MPK_F32: return r * c * 4;
    case MPK_F16:
    case MPK_BF16: return r * c * 2;
    case MPK_Q8: return 2 * r * (uint64_t)m->ngroups + r * (uint64_t)m->cols_p;
    case MPK_Q4:
        return 2 * (m->zero_point ? 2u : 1u) * r * (uint64_t)m->ngroups +
               r * (uint64_t)m->cols_p / 2;
    case MPK_Q6: return 2 * r * (uint64_t)m->ngroups + r * ((uint64_t)m->cols_p / 4 * 3);
    }
    return 0;
}

float mpk_row_dot(const mpk_impl *k, const mpk_mat *w, int64_t r, const float *x) {
    return impl_or_scalar(k)->row_dot(w, r, x);
}

void mpk_row(const mpk_mat *w, int64_t r, float *out) {
    /* Decode by dotting with unit vectors would be slow; decode directly. */
    const int64_t n = w->cols;
    switch (w->codec) {
    case MPK_F32: memcpy(out, (const float *)w->data + r * n, (size_t)n * 4); return;
    case MPK_F16:
    case MPK_BF16:
        for (int64_t c = 0; c < n; c++) {
            uint16_t h = ld16(w->data + (size_t)(r * n + c) * 2);
            out[c] = w->codec == MPK_F16 ? mpk_f16_to_f32(h) : mpk_bf16_to_f32(h);
        }
        return;
    }
    const int64_t G = w->group, ng = w->ngroups;
    const uint8_t *sc = w->data + (size_t)(r * ng) * 2;
    if (w->codec == MPK_Q8) {
        const int8_t *q = (const int8_t *)(w->data + (size_t)(w->rows * ng) * 2) + r * w->cols_p;
        for (int64_t c = 0; c < n; c++) out[c] = mpk_f16_to_f32(ld16(sc + 2 * (c / G))) * (float)q[c];
        return;
    }
    if (w->codec == MPK_Q6) {
        const uint8_t *q = w->data + (size_t)(w->rows * ng) * 2 + (size_t)(r * w->cols_p) / 4 * 3;
        for (int64_t c = 0; c < n; c++)
            out[c] = mpk_f16_to_f32(ld16(sc + 2 * (c / G))) * (float)(q6_code(q, c) - 32);
        return;
    }
    const size_t planes = w->zero_point ? 2 : 1;
    const uint8_t *mins = w->data + (size_t)(w->rows * ng) * 2 + (size_t)(r * ng) * 2;
    const uint8_t *q = w->data + planes * (size_t)(w->rows * ng) * 2 + (size_t)(r * w->cols_p) / 2;
    for (int64_t c = 0; c < n; c++) {
        int nib = (q[c >> 1] >> ((c & 1) * 4)) & 15;
        float s = mpk_f16_to_f32(ld16(sc + 2 * (c / G)));
        out[c] = w->zero_point ? (float)nib * s + mpk_f16_to_f32(ld16(mins + 2 * (c / G)))
                               : (float)(nib - 8) * s;
    }
}

/* ---- threaded drivers: fixed row blocks ---- */

#define ROWS_PER_TASK 16

typedef struct {
    const mpk_impl *k;
    const mpk_mat *w;
    const float *x;
    int64_t n;
    float *y;
} mv_job;

static void mv_task(void *ctx, size_t t) {
    mv_job *j = ctx;
    const mpk_mat *w = j->w;
    int64_t r0 = (int64_t)t * ROWS_PER_TASK, r1 = r0 + ROWS_PER_TASK;
    if (r1 > w->rows) r1 = w->rows;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t i = 0; i < j->n; i++) j->y[i * w->rows + r] = j->k->row_dot(w, r, j->x + i * w->cols);
}

void mpk_matmat(const mpk_impl *k, mpk_pool *pool, const mpk_mat *w, const float *x, int64_t n,
                float *y) {
    mv_job j = {impl_or_scalar(k), w, x, n, y};
    size_t ntasks = (size_t)((w->rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
    /* tiny matrices: thread wake-up costs more than the work */
    mpk_pool_run(w->rows * w->cols * n < 32768 ? NULL : pool, ntasks, mv_task, &j);
}

void mpk_matvec(const mpk_impl *k, mpk_pool *pool, const mpk_mat *w, const float *x, float *y) {
    mpk_matmat(k, pool, w, x, 1, y);
}

size_t mpk_rvq_lut_floats(int64_t cols, int stages) {
    return (size_t)((cols + 7) / 8) * (size_t)stages * 256;
}

typedef struct {
    const mpk_impl *k;
    const float *cbt;
    int stages;
    const float *x;
    int64_t cols;
    float *lut;
} lut_job;

#define LUT_VECS_PER_TASK 16

static void lut_task(void *ctx, size_t t) {
    lut_job *j = ctx;
    int64_t nv = (j->cols + 7) / 8, v0 = (int64_t)t * LUT_VECS_PER_TASK;
    int64_t v1 = v0 + LUT_VECS_PER_TASK < nv ? v0 + LUT_VECS_PER_TASK : nv;
    for (int64_t v = v0; v < v1; v++) j->k->rvq_lut_block(j->cbt, j->stages, j->x, j->cols, v, j->lut);
}

void mpk_rvq_lut(const mpk_impl *k, mpk_pool *pool, const float *cbt, int stages, const float *x,
                 int64_t cols, float *lut) {
    lut_job j = {impl_or_scalar(k), cbt, stages, x, cols, lut};
    int64_t nv = (cols + 7) / 8;
    mpk_pool_run(nv * stages < 64 ? NULL : pool, (size_t)((nv + LUT_VECS_PER_TASK - 1) / LUT_VECS_PER_TASK),
                 lut_task, &j);
}

void mpk_rvq_transpose_cb(const float *cb, int stages, float *cbt) {
    for (int s = 0; s < stages; s++)
        for (int e = 0; e < 256; e++)
            for (int d = 0; d < 8; d++)
                cbt[((size_t)s * 8 + (size_t)d) * 256 + (size_t)e] = cb[((size_t)s * 256 + (size_t)e) * 8 + (size_t)d];
}

typedef struct {
    const mpk_impl *k;
    const mpk_rvq *w;
    const float *lut;
    float *y;
} rvq_job;

static void rvq_task(void *ctx, size_t t) {
    rvq_job *j = ctx;
    const mpk_rvq *w = j->w;
    int64_t n = w->nv * w->stages, r0 = (int64_t)t * ROWS_PER_TASK, r1 = r0 + ROWS_PER_TASK;
    if (r1 > w->rows) r1 = w->rows;
    float acc[ROWS_PER_TASK];
    j->k->rvq_rows(w->codes + (size_t)(r0 * n), n, r1 - r0, j->lut, acc);
    for (int64_t r = r0; r < r1; r++) j->y[r] = mpk_f16_to_f32(ld16(w->scales + 2 * r)) * acc[r - r0];
}

void mpk_rvq_matvec(const mpk_impl *k, mpk_pool *pool, const mpk_rvq *w, const float *lut,
                    float *y) {
    rvq_job j = {impl_or_scalar(k), w, lut, y};
    mpk_pool_run(w->rows * w->nv < 4096 ? NULL : pool,
                 (size_t)((w->rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK), rvq_task, &j);
}

void mpk_hadamard_rotate(const float *x, const float *signs, int64_t n, int64_t block, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * signs[i];
    for (int64_t b0 = 0; b0 + block <= n; b0 += block)
        for (int64_t h = 1; h < block; h *= 2)
            for (int64_t i = b0; i < b0 + block; i += 2 * h)
                for (int64_t j = i; j < i + h; j++) {
                    float a = out[j], b = out[j + h];
                    out[j] = a + b;
                    out[j + h] = a - b;
                }
    float c = (float)(1.0 / sqrt((double)block));
    for (int64_t i = 0; i < n; i++) out[i] *= c;
}

/* ---- small vector helpers ---- */

float mpk_dot(const float *a, const float *b, int64_t n) {
    float l[8] = {0};
    for (int64_t i = 0; i < n; i++) l[i & 7] += a[i] * b[i];
    return red8(l);
}

void mpk_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0.0; /* double: the sum of squares is the one long reduction here */
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

void mpk_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void mpk_softmax(float *x, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    float inv = (float)(1.0 / s);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

float mpk_silu(float x) { return x / (1.0f + expf(-x)); }
