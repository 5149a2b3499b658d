/* Microbenchmark of the routed-expert kernel (CODECS.md §3.5): single-thread G weights/s of
 * table build + tiled rvq matvec, per kernel path this CPU runs.  Not a test.
 *
 *   build/rel/bench_kernels [--paths scalar,avx2,avx512vbmi] [--shapes 4096x1536,...]
 *                           [--stages 3,4] [--modes ram,cache] [--seconds 0.15] [--ram-mib 128]
 *                           [--trunk q8,q6,q4] [--group 32]
 *   (make -C runtime bench-kernels builds and runs it with the defaults)
 *
 * Output: one JSON object per line, fields:
 *   codec "rvq<S>", stages S, rows, cols, shape "ROWSxCOLS", path, mode, threads (1),
 *   gws          G weights/s (rows x cols / s) of one projection including its table build
 *                (what a per-expert down projection costs), best of 5 timing blocks;
 *   gws_matvec   the same without the table build (gate/up: one table serves all experts);
 *   table_us     microseconds per table build (mpk_rvq_tables), best block;
 *   matvec_us    microseconds per matvec (mpk_rvq_matvec), best block;
 *   bytes_per_weight  code + scale bytes per weight;
 *   read_gws     G weights/s of merely reading the same bytes (64-bit loads, one pass over the
 *                projections cycled through): the memory-speed bound for this mode;
 *   experts      distinct projections cycled through.
 * Trunk codecs (--trunk, "" for none): the same fields where they apply (codec "q8"/"q6"/"q4",
 * group size "group", gws of mpk_matvec: CODECS.md §2.4, the activation's rounding included;
 * no table), per path and mode.
 * mode "ram": the projections cycled through span --ram-mib (default 128 MiB, beyond a 32 MiB L3),
 * so codes stream from memory; mode "cache": one projection, codes in cache after the first call.
 * The activation is random and fixed; each timed call builds the table and runs the matvec. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "bench.h"

static int in_list(const char *list, const char *item) {
    size_t n = strlen(item);
    for (const char *p = list; (p = strstr(p, item)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}

static void f16_ones(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) memcpy(p + 2 * i, "\x00\x3c", 2);
}

/* mpk_matvec of one trunk codec: copies spread over `ram` bytes (mode ram) or one (cache). */
static void trunk(const mpk_impl *k, const char *name, int codec, long rows, long cols, long group,
                  uint8_t *buf, size_t ram, const char *modes, double secs, const float *x, float *y) {
    mpk_mat m;
    if (mpk_mat_init(&m, codec, rows, cols, group, 0, buf)) return;
    size_t nb = (size_t)mpk_mat_nbytes(&m), stride = (nb + 63) & ~(size_t)63, nexp_ram = ram / stride;
    if (nexp_ram < 1) return;
    for (size_t e = 0; e < nexp_ram; e++) f16_ones(buf + e * stride, (size_t)(rows * m.ngroups)); /* scales 1.0 */
    for (int mi = 0; mi < 2; mi++) {
        const char *mode = mi ? "cache" : "ram";
        if (!in_list(modes, mode)) continue;
        size_t nexp = mi ? 1 : nexp_ram, e = 0;
        double t0 = wall_now();
        mpk_matvec(k, NULL, &m, x, y);
        double one = wall_now() - t0;
        long calls = (long)(secs / 5 / (one > 1e-7 ? one : 1e-7));
        if (calls < 2) calls = 2;
        double best = 1e30;
        for (int blk = 0; blk < 5; blk++) {
            double a = wall_now();
            for (long c = 0; c < calls; c++) {
                m.data = buf + e * stride;
                e = (e + 1) % nexp;
                mpk_matvec(k, NULL, &m, x, y);
            }
            double t = (wall_now() - a) / (double)calls;
            best = t < best ? t : best;
        }
        double wts = (double)rows * (double)cols;
        printf("{\"codec\": \"%s\", \"group\": %ld, \"rows\": %ld, \"cols\": %ld, \"shape\": \"%ldx%ld\", "
               "\"path\": \"%s\", \"mode\": \"%s\", \"threads\": 1, \"gws\": %.3f, \"matvec_us\": %.2f, "
               "\"bytes_per_weight\": %.4f, \"experts\": %zu, \"check\": %.6g}\n",
               name, group, rows, cols, rows, cols, mpk_impl_name(k), mode, wts / best / 1e9, best * 1e6,
               (double)nb / wts, nexp, (double)y[0]);
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    const char *paths = "scalar,avx2,avx512vbmi", *shapes = "4096x1536,1536x4096,7168x2048,2048x7168";
    const char *stages = "3,4", *modes = "ram,cache", *trunks = "q8,q6,q4";
    long group = 32;
    double secs = 0.15;
    size_t ram = (size_t)128 << 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--paths")) paths = argv[i + 1];
        else if (!strcmp(argv[i], "--shapes")) shapes = argv[i + 1];
        else if (!strcmp(argv[i], "--stages")) stages = argv[i + 1];
        else if (!strcmp(argv[i], "--modes")) modes = argv[i + 1];
        else if (!strcmp(argv[i], "--seconds")) secs = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--ram-mib")) ram = (size_t)atol(argv[i + 1]) << 20;
        else if (!strcmp(argv[i], "--trunk")) trunks = argv[i + 1];
        else if (!strcmp(argv[i], "--group")) group = atol(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    uint8_t *buf = aligned_alloc(64, ram);
    float *x = malloc(8192 * 4), *y = malloc(8192 * 4), *cbt = malloc(8 * 2048 * 4);
    void *tabmem = malloc(mpk_rvq_tab_bytes(8192, 8));
    if (!buf || !x || !y || !cbt || !tabmem) return 1;
    for (size_t i = 0; i < ram; i += 8) {
        uint64_t r = rnd();
        memcpy(buf + i, &r, 8);
    }
    for (int i = 0; i < 8192; i++) x[i] = (float)((int64_t)(rnd() % 2001) - 1000) / 1000.0f;
    for (int i = 0; i < 8 * 2048; i++) cbt[i] = (float)((int64_t)(rnd() % 2001) - 1000) / 4000.0f;
    static const int ids[3] = {MPK_SCALAR, MPK_AVX2, MPK_AVX512VBMI};
    for (int pi = 0; pi < 3; pi++) {
        const mpk_impl *k = mpk_select(ids[pi]);
        if (!k || !in_list(paths, mpk_impl_name(k))) continue;
        for (const char *sp = shapes; *sp;) {
            long rows = 0, cols = 0;
            if (sscanf(sp, "%ldx%ld", &rows, &cols) != 2 || rows < 1 || cols < 1 || cols > 8192) {
                fprintf(stderr, "bad shape list %s\n", shapes);
                return 2;
            }
            for (int S = 1; S <= 8; S++) {
                char sn[4] = {(char)('0' + S), 0};
                if (!in_list(stages, sn)) continue;
                size_t nb = (size_t)mpk_rvq_nbytes(rows, cols, S), stride = (nb + 63) & ~(size_t)63;
                size_t nexp_ram = ram / stride;
                if (nexp_ram < 1) continue;
                for (size_t e = 0; e < nexp_ram; e++) { /* sane f16 scales (1.0) */
                    mpk_rvq w;
                    mpk_rvq_init(&w, rows, cols, S, buf + e * stride);
                    for (long r = 0; r < rows; r++) memcpy((uint8_t *)w.scales + 2 * r, "\x00\x3c", 2);
                }
                for (int mi = 0; mi < 2; mi++) {
                    const char *mode = mi ? "cache" : "ram";
                    if (!in_list(modes, mode)) continue;
                    size_t nexp = mi ? 1 : nexp_ram;
                    /* calls per block: about secs / 5 of work, at least one pass over the experts */
                    mpk_rvq_tab tab;
                    mpk_rvq_tab_init(&tab, tabmem, cols, S);
                    double t0 = wall_now();
                    mpk_rvq w;
                    mpk_rvq_init(&w, rows, cols, S, buf);
                    mpk_rvq_tables(k, NULL, cbt, x, &tab);
                    mpk_rvq_matvec(k, NULL, &w, &tab, y);
                    double one = wall_now() - t0;
                    long calls = (long)(secs / 5 / (one > 1e-7 ? one : 1e-7));
                    if (calls < 2) calls = 2;
                    /* ram: consecutive calls walk the projections in order, so each one was
                     * last touched ~ram bytes ago (out of every cache) whatever `calls` is */
                    double best_tot = 1e30, best_tab = 1e30, best_mv = 1e30;
                    size_t e = 0;
                    for (int blk = 0; blk < 5; blk++) {
                        double tt = 0, tm = 0;
                        for (long c = 0; c < calls; c++) {
                            mpk_rvq_init(&w, rows, cols, S, buf + e * stride);
                            e = (e + 1) % nexp;
                            double a = wall_now();
                            mpk_rvq_tables(k, NULL, cbt, x, &tab);
                            double b = wall_now();
                            mpk_rvq_matvec(k, NULL, &w, &tab, y);
                            double d = wall_now();
                            tt += b - a;
                            tm += d - b;
                        }
                        tt /= (double)calls;
                        tm /= (double)calls;
                        if (tt + tm < best_tot) best_tot = tt + tm;
                        if (tt < best_tab) best_tab = tt;
                        if (tm < best_mv) best_mv = tm;
                    }
                    double best_rd = 1e30;
                    volatile uint64_t sink = 0;
                    for (int blk = 0; blk < 3; blk++) {
                        size_t n = nexp < 64 ? nexp : 64;
                        double a = wall_now();
                        for (size_t i = 0; i < n; i++) {
                            const uint64_t *p = (const uint64_t *)(buf + ((e + i) % nexp) * stride);
                            uint64_t s0 = 0, s1 = 0;
                            for (size_t o = 0; o + 2 <= nb / 8; o += 2) {
                                s0 += p[o];
                                s1 ^= p[o + 1];
                            }
                            sink += s0 + s1;
                        }
                        double rd = (wall_now() - a) / (double)n;
                        e = (e + n) % nexp;
                        if (rd < best_rd) best_rd = rd;
                    }
                    double wts = (double)rows * (double)cols;
                    printf("{\"codec\": \"rvq%d\", \"stages\": %d, \"rows\": %ld, \"cols\": %ld, "
                           "\"shape\": \"%ldx%ld\", \"path\": \"%s\", \"mode\": \"%s\", \"threads\": 1, "
                           "\"gws\": %.3f, \"gws_matvec\": %.3f, \"table_us\": %.2f, \"matvec_us\": %.2f, "
                           "\"bytes_per_weight\": %.4f, \"read_gws\": %.3f, \"experts\": %zu, \"check\": %.6g}\n",
                           S, S, rows, cols, rows, cols, mpk_impl_name(k), mode, wts / best_tot / 1e9,
                           wts / best_mv / 1e9, best_tab * 1e6, best_mv * 1e6, (double)nb / wts, wts / best_rd / 1e9, nexp,
                           (double)y[0]);
                    fflush(stdout);
                }
            }
            static const struct { const char *name; int codec; } tc[3] = {
                {"q8", MP_CODEC_Q8}, {"q6", MP_CODEC_Q6}, {"q4", MP_CODEC_Q4}};
            for (int ti = 0; ti < 3; ti++)
                if (in_list(trunks, tc[ti].name))
                    trunk(k, tc[ti].name, tc[ti].codec, rows, cols, group, buf, ram, modes, secs, x, y);
            sp = strchr(sp, ',');
            if (!sp) break;
            sp++;
        }
    }
    free(buf);
    free(x);
    free(y);
    free(cbt);
    free(tabmem);
    return 0;
}
