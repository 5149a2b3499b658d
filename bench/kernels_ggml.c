// llama.cpp's side of `make bench-kernels`: single-thread G weights/s of ggml's CPU dot products.
//
//   kernels_ggml [--types q3_K,q4_K,iq3_xxs] [--shapes 4096x1536,...] [--ram-mib 256]
//                [--sweeps 5] [--seed 1] [--cache-dir DIR]
//
// For each type and shape (rows x cols, a row = cols weights): seeded heavy-tailed weights
// (Student-t, 4 dof) quantised with ggml_quantize_chunk (no importance matrix), one gaussian
// activation quantised to the type's vec_dot_type with the CPU traits' from_float, then
// vec_dot over every row, one row per call (what ggml's mul_mat does for one token on x86).
//   mode "ram":   the matrix copied until the copies fill --ram-mib (> L3), cycled, so the
//                 codes stream from memory;
//   mode "cache": one copy, repeated (codes in L2/L3).
// A sweep = all copies once (ram) or as many passes over the one copy (cache); G weights/s per
// sweep, best and median of --sweeps. The activation quantisation is timed on its own (best
// and median per call); gws_with_act adds one call per matrix. One JSON object per line.
// Built by bench/kernels.py against libggml-base.a + libggml-cpu.a.
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml.h"
#include "ggml-cpu.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_state;
static double uniform(void) {  // splitmix64 -> (0, 1)
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((z >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double gauss(void) {
    return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
}
static double student_t4(void) {  // z / sqrt(chi2_4 / 4), chi2_4 = -2 ln(u1 u2)
    return gauss() / sqrt(-0.5 * log(uniform() * uniform()));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
static double best(const double *v, int n) {
    double b = v[0];
    for (int i = 1; i < n; i++) b = v[i] > b ? v[i] : b;
    return b;
}

static enum ggml_type type_by_name(const char *name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char *n = ggml_type_name((enum ggml_type)t);
        if (n && strcmp(n, name) == 0) return (enum ggml_type)t;
    }
    fprintf(stderr, "unknown ggml type %s\n", name);
    exit(2);
}

static void *alloc64(size_t n) {
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) { fprintf(stderr, "out of memory (%zu bytes)\n", n); exit(3); }
    return p;
}

static volatile float sink;

// One sweep: `passes` passes over `copies` matrices of `rows` rows; returns seconds.
static double sweep(ggml_vec_dot_t dot, const uint8_t *w, size_t mat_bytes, size_t row_bytes,
                    int copies, int passes, int rows, int cols, const void *y, float *out) {
    double t0 = now();
    for (int p = 0; p < passes; p++)
        for (int c = 0; c < copies; c++) {
            const uint8_t *m = w + (size_t)c * mat_bytes;
            for (int r = 0; r < rows; r++)
                dot(cols, &out[r], 0, m + (size_t)r * row_bytes, 0, y, 0, 1);
        }
    double t = now() - t0;
    sink += out[rows - 1];
    return t;
}

static void bench_one(enum ggml_type type, int rows, int cols, size_t ram_bytes, int sweeps,
                      uint64_t seed, const char *cache_dir) {
    const struct ggml_type_traits_cpu *tr = ggml_get_type_traits_cpu(type);
    const struct ggml_type_traits_cpu *vtr = ggml_get_type_traits_cpu(tr->vec_dot_type);
    const struct ggml_type_traits *base = ggml_get_type_traits(type);
    if (!tr->vec_dot || !vtr->from_float || !base->to_float) {
        fprintf(stderr, "%s: no CPU vec_dot/from_float\n", ggml_type_name(type));
        exit(2);
    }
    size_t n = (size_t)rows * cols;
    float *wf = alloc64(n * sizeof(float)), *x = alloc64(cols * sizeof(float));
    float *out = alloc64(rows * sizeof(float));
    rng_state = seed * 0x100000001B3ull + (uint64_t)rows * 7919 + cols;
    for (size_t i = 0; i < n; i++) wf[i] = (float)(0.02 * student_t4());
    for (int i = 0; i < cols; i++) x[i] = (float)gauss();

    size_t row_bytes = ggml_row_size(type, cols), mat_bytes = row_bytes * rows;
    uint8_t *q = alloc64(mat_bytes);
    double tq = -1;  // quantisation seconds; -1 = read from the cache
    char path[1024] = "";
    if (cache_dir)  // IQ3_XXS quantises at ~1 M weights/s: keep the codes between runs
        snprintf(path, sizeof path, "%s/%s-%dx%d-s%llu.bin", cache_dir, ggml_type_name(type),
                 rows, cols, (unsigned long long)seed);
    FILE *f = path[0] ? fopen(path, "rb") : NULL;
    if (!f || fread(q, 1, mat_bytes, f) != mat_bytes || fgetc(f) != EOF) {
        tq = now();
        ggml_quantize_chunk(type, wf, q, 0, rows, cols, NULL);
        tq = now() - tq;
        FILE *o = path[0] ? fopen(path, "wb") : NULL;
        if (o && fwrite(q, 1, mat_bytes, o) != mat_bytes) remove(path);
        if (o) fclose(o);
    }
    if (f) fclose(f);

    // Activation: quantise to the vec_dot type, timed on its own.
    size_t y_bytes = ggml_row_size(tr->vec_dot_type, cols);
    void *y = alloc64(y_bytes);
    enum { ACT_REPS = 201 };
    double act[ACT_REPS];
    for (int i = 0; i < ACT_REPS; i++) {
        double t0 = now();
        vtr->from_float(x, y, cols);
        act[i] = now() - t0;
    }
    double act_best = act[0];
    for (int i = 1; i < ACT_REPS; i++) act_best = act[i] < act_best ? act[i] : act_best;
    double act_med = median(act, ACT_REPS);

    // Output error vs the float matvec (weights and activation quantised): a sanity check.
    float *deq = alloc64(cols * sizeof(float));
    double err2 = 0, ref2 = 0, derr2 = 0;
    for (int r = 0; r < rows; r++) {
        tr->vec_dot(cols, &out[r], 0, q + (size_t)r * row_bytes, 0, y, 0, 1);
        base->to_float(q + (size_t)r * row_bytes, deq, cols);
        double ref = 0, dq = 0;
        for (int i = 0; i < cols; i++) {
            ref += (double)wf[(size_t)r * cols + i] * x[i];
            dq += (double)deq[i] * x[i];
        }
        err2 += (out[r] - ref) * (out[r] - ref);
        derr2 += (out[r] - dq) * (out[r] - dq);
        ref2 += ref * ref;
    }
    free(deq);
    free(wf);

    for (int mode = 0; mode < 2; mode++) {  // 0 = ram, 1 = cache
        int copies = 1, passes = 1;
        if (mode == 0) {
            copies = (int)((ram_bytes + mat_bytes - 1) / mat_bytes);
            if (copies < 2) copies = 2;
        } else {
            passes = (int)((ram_bytes / 4 + mat_bytes - 1) / mat_bytes);
            if (passes < 2) passes = 2;
        }
        uint8_t *w = copies == 1 ? q : alloc64(mat_bytes * copies);
        if (copies > 1)
            for (int c = 0; c < copies; c++) memcpy(w + (size_t)c * mat_bytes, q, mat_bytes);
        sweep(tr->vec_dot, w, mat_bytes, row_bytes, copies, 1, rows, cols, y, out);  // warm-up
        double *g = alloc64(sweeps * sizeof(double));
        for (int s = 0; s < sweeps; s++) {
            double t = sweep(tr->vec_dot, w, mat_bytes, row_bytes, copies, passes, rows, cols, y,
                             out);
            g[s] = (double)n * copies * passes / t / 1e9;
        }
        double gb = best(g, sweeps), gm = median(g, sweeps);  // median sorts: g[0] = min
        double t_mat = n / (gb * 1e9);  // seconds per matrix at the best rate
        printf("{\"engine\": \"llama.cpp\", \"codec\": \"%s\", \"rows\": %d, \"cols\": %d, "
               "\"mode\": \"%s\", \"gws_best\": %.4f, \"gws_median\": %.4f, \"gws_min\": %.4f, "
               "\"sweeps\": %d, \"copies\": %d, \"passes\": %d, \"bytes_per_weight\": %.5f, "
               "\"matrix_mib\": %.3f, \"act_type\": \"%s\", \"act_us_best\": %.3f, "
               "\"act_us_median\": %.3f, \"gws_with_act\": %.4f, \"quantize_s\": %.3f, "
               "\"rel_err_vs_float\": %.3e, \"rel_err_vs_dequant\": %.3e}\n",
               ggml_type_name(type), rows, cols, mode ? "cache" : "ram", gb, gm,
               g[0], sweeps, copies, passes, (double)mat_bytes / n, mat_bytes / 1048576.0,
               ggml_type_name(tr->vec_dot_type), act_best * 1e6, act_med * 1e6,
               n / (t_mat + act_best) / 1e9, tq, sqrt(err2 / ref2), sqrt(derr2 / ref2));
        fflush(stdout);
        free(g);
        if (w != q) free(w);
    }
    free(q);
    free(y);
    free(x);
    free(out);
}

// Single-thread streaming read of `bytes` (64-bit loads, four chains): the RAM ceiling the
// "ram" figures are measured against. Best and median GB/s of `sweeps` passes.
static void read_bandwidth(size_t bytes, int sweeps) {
    size_t n = bytes / 8;
    uint64_t *b = alloc64(n * 8);
    for (size_t i = 0; i < n; i++) b[i] = i * 0x9E3779B97F4A7C15ull;
    double *g = alloc64((sweeps + 1) * sizeof(double));
    for (int s = 0; s <= sweeps; s++) {  // pass 0 warms up
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        double t0 = now();
        for (size_t i = 0; i + 4 <= n; i += 4) {
            a0 ^= b[i]; a1 ^= b[i + 1]; a2 ^= b[i + 2]; a3 ^= b[i + 3];
        }
        g[s] = n * 8 / (now() - t0) / 1e9;
        sink += (float)(a0 ^ a1 ^ a2 ^ a3);
    }
    double gb = best(g + 1, sweeps), gm = median(g + 1, sweeps);
    printf("{\"engine\": \"memory\", \"mode\": \"ram\", \"read_mib\": %zu, "
           "\"read_gbs_best\": %.3f, \"read_gbs_median\": %.3f}\n", bytes >> 20, gb, gm);
    fflush(stdout);
    free(g);
    free(b);
}

int main(int argc, char **argv) {
    const char *types = "q3_K,q4_K,iq3_xxs";
    const char *shapes = "4096x1536,1536x4096,7168x2048,2048x7168";
    size_t ram_mib = 256;
    int sweeps = 5;
    uint64_t seed = 1;
    const char *cache_dir = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--types")) types = argv[i + 1];
        else if (!strcmp(argv[i], "--shapes")) shapes = argv[i + 1];
        else if (!strcmp(argv[i], "--ram-mib")) ram_mib = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--sweeps")) sweeps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--cache-dir")) cache_dir = argv[i + 1];
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    if (sweeps < 1) sweeps = 1;
    ggml_cpu_init();
    // What ggml-cpu was compiled for (these report compile-time macros).
    // (ggml_commit() is left out: built inside another git tree it names that tree's commit.)
    printf("{\"engine\": \"llama.cpp\", \"ggml_version\": \"%s\", "
           "\"compiled_for\": {\"avx\": %d, \"avx2\": %d, \"fma\": %d, \"f16c\": %d, "
           "\"bmi2\": %d, \"avx_vnni\": %d, \"avx512\": %d, \"avx512_vbmi\": %d, "
           "\"avx512_vnni\": %d, \"avx512_bf16\": %d, \"amx_int8\": %d}}\n",
           ggml_version(), ggml_cpu_has_avx(), ggml_cpu_has_avx2(),
           ggml_cpu_has_fma(), ggml_cpu_has_f16c(), ggml_cpu_has_bmi2(), ggml_cpu_has_avx_vnni(),
           ggml_cpu_has_avx512(), ggml_cpu_has_avx512_vbmi(), ggml_cpu_has_avx512_vnni(),
           ggml_cpu_has_avx512_bf16(), ggml_cpu_has_amx_int8());
    fflush(stdout);
    read_bandwidth(ram_mib << 20, sweeps);
    char tbuf[256], sbuf[256];
    snprintf(sbuf, sizeof sbuf, "%s", shapes);
    for (char *sp = NULL, *s = strtok_r(sbuf, ",", &sp); s; s = strtok_r(NULL, ",", &sp)) {
        int rows, cols;
        if (sscanf(s, "%dx%d", &rows, &cols) != 2 || rows < 1 || cols < 1) {
            fprintf(stderr, "bad shape %s\n", s);
            return 2;
        }
        snprintf(tbuf, sizeof tbuf, "%s", types);
        for (char *tp = NULL, *t = strtok_r(tbuf, ",", &tp); t; t = strtok_r(NULL, ",", &tp)) {
            enum ggml_type ty = type_by_name(t);
            if (cols % ggml_blck_size(ty)) {
                fprintf(stderr, "%s: cols %d not a multiple of %lld\n", t, cols,
                        (long long)ggml_blck_size(ty));
                return 2;
            }
            bench_one(ty, rows, cols, ram_mib << 20, sweeps, seed, cache_dir);
        }
    }
    return 0;
}
