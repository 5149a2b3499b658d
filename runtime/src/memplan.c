/* Usable RAM from /proc/meminfo and cgroup limits, usable cores from the affinity mask and the
 * cgroup CPU quota, and the default budget rule (memplan.h). */
#define _GNU_SOURCE
#include "memplan.h"

#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_CAP 4096

static int read_line(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *r = fgets(buf, (int)n, f);
    fclose(f);
    if (!r) return -1;
    buf[strcspn(buf, "\n")] = 0;
    return 0;
}

/* "max" (no limit) -> UINT64_MAX; a number -> it; anything else -> UINT64_MAX (ignored). */
static uint64_t parse_limit(const char *s) {
    if (strcmp(s, "max") == 0 || !*s) return UINT64_MAX;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || end == s) return UINT64_MAX;
    return (uint64_t)v;
}

static void consider(void *ctx, const char *file) {
    mp_ram_info *o = ctx;
    char buf[128];
    if (read_line(file, buf, sizeof buf)) return;
    uint64_t v = parse_limit(buf);
    if (v >= (1ull << 62)) return; /* v1 writes ~2^63 (PAGE_COUNTER_MAX pages) for "no limit" */
    if (v < o->cgroup_limit) {
        o->cgroup_limit = v;
        size_t n = strlen(file), cap = sizeof o->limit_file - 1;
        const char *tail = n > cap ? file + (n - cap) : file; /* keep the informative end */
        memcpy(o->limit_file, tail, n > cap ? cap : n);
        o->limit_file[n > cap ? cap : n] = 0;
    }
}

typedef void (*limit_fn)(void *ctx, const char *file);

/* Calls fn on `names` in dir and each parent up to base (inclusive); missing files are skipped
 * by fn, so a cgroup path that the mount namespace hides still reaches the limits that are
 * visible. */
static void walk(limit_fn fn, void *ctx, const char *base, const char *rel, const char *const *names, int nnames) {
    char dir[PATH_CAP], file[PATH_CAP + 64];
    if (snprintf(dir, sizeof dir, "%s%s", base, rel) >= (int)sizeof dir) return;
    size_t blen = strlen(base);
    for (;;) {
        size_t len = strlen(dir);
        while (len > blen && dir[len - 1] == '/') dir[--len] = 0; /* no trailing slash */
        for (int i = 0; i < nnames; i++) {
            if (snprintf(file, sizeof file, "%s/%s", dir, names[i]) < (int)sizeof file) fn(ctx, file);
        }
        if (len <= blen) break;
        char *slash = strrchr(dir + blen, '/');
        if (!slash) break;
        *slash = 0;
    }
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* fn on every limit file of `controller` for this process's cgroup and each ancestor (from
 * proc_root/self/cgroup): v2 `v2names` under cg_root (hybrid: cg_root/unified), v1 `v1names`
 * under cg_root/CONTROLLERS (or cg_root/controller when that directory is absent), as
 * moepack/sysinfo.py walks them. */
static void each_cgroup_limit(const char *proc_root, const char *cg_root, const char *controller,
                              const char *const *v2names, int n2, const char *const *v1names,
                              int n1, limit_fn fn, void *ctx) {
    char path[PATH_CAP], line[PATH_CAP], base[PATH_CAP + 64], ctrls[PATH_CAP];
    snprintf(path, sizeof path, "%s/self/cgroup", proc_root);
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = 0; *c2 = 0;
        const char *hier = line, *ctrl = c1 + 1, *rel = c2 + 1;
        if (strcmp(hier, "0") == 0 && !*ctrl) { /* v2 (unified, or hybrid under /unified) */
            snprintf(base, sizeof base, "%s", cg_root);
            snprintf(path, sizeof path, "%s/cgroup.controllers", cg_root);
            if (!exists(path)) snprintf(base, sizeof base, "%s/unified", cg_root);
            walk(fn, ctx, base, rel, v2names, n2);
            continue;
        }
        snprintf(ctrls, sizeof ctrls, "%s", ctrl); /* v1: the hierarchy with this controller */
        int has = 0;
        char *save = NULL;
        for (char *t = strtok_r(ctrls, ",", &save); t; t = strtok_r(NULL, ",", &save)) has |= strcmp(t, controller) == 0;
        if (!has) continue;
        snprintf(base, sizeof base, "%s/%s", cg_root, ctrl);
        if (!is_dir(base)) snprintf(base, sizeof base, "%s/%s", cg_root, controller);
        walk(fn, ctx, base, rel, v1names, n1);
    }
    fclose(f);
}

uint64_t mp_usable_ram_at(const char *proc_root, const char *cg_root, mp_ram_info *out) {
    mp_ram_info o;
    memset(&o, 0, sizeof o);
    o.cgroup_limit = UINT64_MAX;
    char path[PATH_CAP], line[PATH_CAP];
    snprintf(path, sizeof path, "%s/meminfo", proc_root);
    FILE *f = fopen(path, "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            unsigned long long kb;
            uint64_t *dst = NULL;
            if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) dst = &o.physical;
            else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) dst = &o.available;
            if (dst && __builtin_mul_overflow((uint64_t)kb, 1024, dst)) *dst = 0;
        }
        fclose(f);
    }
    static const char *const V2[] = {"memory.max", "memory.high"};
    static const char *const V1[] = {"memory.limit_in_bytes"};
    each_cgroup_limit(proc_root, cg_root, "memory", V2, 2, V1, 1, consider, &o);
    if (o.cgroup_limit == UINT64_MAX) o.limit_file[0] = 0;
    o.usable = o.physical;
    if (o.cgroup_limit < o.usable || o.usable == 0) o.usable = o.cgroup_limit == UINT64_MAX ? o.physical : o.cgroup_limit;
    if (o.available && (o.available < o.usable || o.usable == 0)) o.usable = o.available;
    if (out) *out = o;
    return o.usable;
}

uint64_t mp_usable_ram(mp_ram_info *out) { return mp_usable_ram_at("/proc", "/sys/fs/cgroup", out); }

/* The whole whitespace-separated integer at *p (advanced past it), as Python's int(token). */
static int int_token(const char **p, long long *out) {
    while (**p == ' ' || **p == '\t') (*p)++;
    char *end;
    errno = 0;
    *out = strtoll(*p, &end, 10);
    if (end == *p || errno || (*end && *end != ' ' && *end != '\t')) return -1;
    *p = end;
    return 0;
}

/* A CPU quota in CPUs from v2 cpu.max ("max PERIOD" or "QUOTA [PERIOD]") or v1
 * cpu.cfs_quota_us (-1: none) beside cpu.cfs_period_us; the smallest is kept in *ctx. */
static void consider_quota(void *ctx, const char *file) {
    double *best = ctx;
    char buf[128];
    if (read_line(file, buf, sizeof buf)) return;
    const char *name = strrchr(file, '/'), *p = buf;
    name = name ? name + 1 : file;
    long long quota, period = 100000;
    if (strcmp(name, "cpu.max") == 0) {
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "max", 3) == 0 && (!p[3] || p[3] == ' ' || p[3] == '\t')) return;
        if (int_token(&p, &quota)) return;
        while (*p == ' ' || *p == '\t') p++;
        if (*p && int_token(&p, &period)) return;
    } else {
        if (int_token(&p, &quota)) return;
        char pfile[PATH_CAP + 64], pbuf[128];
        snprintf(pfile, sizeof pfile, "%.*scpu.cfs_period_us", (int)(name - file), file);
        const char *q = pbuf;
        long long v;
        if (!read_line(pfile, pbuf, sizeof pbuf) && !int_token(&q, &v) && v) period = v;
    }
    if (quota <= 0 || period <= 0) return;
    double q = (double)quota / (double)period;
    if (*best < 0 || q < *best) *best = q;
}

int mp_affinity_cores(void) {
    for (int n = 1024; n <= (1 << 20); n *= 2) { /* masks larger than 1024 CPUs: grow */
        cpu_set_t *set = CPU_ALLOC(n);
        if (!set) break;
        size_t size = CPU_ALLOC_SIZE(n);
        CPU_ZERO_S(size, set);
        int rc = sched_getaffinity(0, size, set), count = rc == 0 ? CPU_COUNT_S(size, set) : 0;
        CPU_FREE(set);
        if (rc == 0) return count > 0 ? count : 1;
        if (errno != EINVAL) break;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > INT32_MAX ? INT32_MAX : (int)n;
}

int mp_usable_cores_at(const char *proc_root, const char *cg_root, int affinity) {
    static const char *const V2[] = {"cpu.max"};
    static const char *const V1[] = {"cpu.cfs_quota_us"};
    double quota = -1;
    each_cgroup_limit(proc_root, cg_root, "cpu", V2, 1, V1, 1, consider_quota, &quota);
    int usable = affinity > 0 ? affinity : mp_affinity_cores();
    if (quota > 0) { /* rounded up: a quota of 1.5 CPUs keeps 2 busy */
        double q = ceil(quota - 1e-9);
        if (q < usable) usable = q < 1 ? 1 : (int)q;
    }
    return usable;
}

int mp_usable_cores(void) { return mp_usable_cores_at("/proc", "/sys/fs/cgroup", 0); }

uint64_t mp_default_headroom(uint64_t usable) {
    uint64_t h = usable / 10, lo = 256ull << 20, hi = 4ull << 30;
    h = h < lo ? lo : h > hi ? hi : h;
    return h < usable ? h : usable;
}

int mp_default_budget(const mp_budget_in *in, mp_budget_out *out) {
    mp_budget_out o;
    memset(&o, 0, sizeof o);
    o.cap = in->usable > in->headroom ? in->usable - in->headroom : 0;
    if (in->floor > in->usable) {
        o.below_floor = 1;
        o.total = in->floor;
        if (out) *out = o;
        return -1;
    }
    if (in->floor >= o.cap) {
        o.tight = 1;
        o.total = in->floor;
    } else {
        uint64_t room = o.cap - in->floor;
        o.total = in->floor + (in->all_experts < room ? in->all_experts : room);
    }
    o.cache = o.total - in->floor;
    if (out) *out = o;
    return 0;
}

int mp_check_budget(uint64_t total, uint64_t floor, uint64_t usable) {
    if (total < floor) return -1;
    if (usable && total > usable) return 1;
    return 0;
}
