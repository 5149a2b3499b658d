/* Usable RAM from /proc/meminfo and cgroup limits, and the default budget rule (memplan.h). */
#define _GNU_SOURCE
#include "memplan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static void consider(mp_ram_info *o, const char *file) {
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

/* Reads `names` in dir and each parent up to base (inclusive); missing files are skipped, so a
 * cgroup path that the mount namespace hides still reaches the limits that are visible. */
static void walk(mp_ram_info *o, const char *base, const char *rel, const char *const *names, int nnames) {
    char dir[PATH_CAP], file[PATH_CAP + 64];
    if (snprintf(dir, sizeof dir, "%s%s", base, rel) >= (int)sizeof dir) return;
    size_t blen = strlen(base);
    for (;;) {
        size_t len = strlen(dir);
        while (len > blen && dir[len - 1] == '/') dir[--len] = 0; /* no trailing slash */
        for (int i = 0; i < nnames; i++) {
            if (snprintf(file, sizeof file, "%s/%s", dir, names[i]) < (int)sizeof file) consider(o, file);
        }
        if (len <= blen) break;
        char *slash = strrchr(dir + blen, '/');
        if (!slash) break;
        *slash = 0;
    }
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

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
    snprintf(path, sizeof path, "%s/self/cgroup", proc_root);
    f = fopen(path, "r");
    if (f) {
        static const char *const V2[] = {"memory.max", "memory.high"};
        static const char *const V1[] = {"memory.limit_in_bytes"};
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            char *c1 = strchr(line, ':');
            char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (!c2) continue;
            *c1 = 0; *c2 = 0;
            const char *hier = line, *ctrl = c1 + 1, *rel = c2 + 1;
            char base[PATH_CAP];
            if (strcmp(hier, "0") == 0 && !*ctrl) { /* v2 (unified, or hybrid under /unified) */
                snprintf(base, sizeof base, "%s", cg_root);
                snprintf(path, sizeof path, "%s/cgroup.controllers", cg_root);
                if (!exists(path)) snprintf(base, sizeof base, "%s/unified", cg_root);
                walk(&o, base, rel, V2, 2);
            } else { /* v1: the hierarchy whose controllers include memory */
                int mem = 0;
                for (char *t = strtok((char *)ctrl, ","); t; t = strtok(NULL, ",")) mem |= strcmp(t, "memory") == 0;
                if (!mem) continue;
                snprintf(base, sizeof base, "%s/memory", cg_root);
                walk(&o, base, rel, V1, 1);
            }
        }
        fclose(f);
    }
    if (o.cgroup_limit == UINT64_MAX) o.limit_file[0] = 0;
    o.usable = o.physical;
    if (o.cgroup_limit < o.usable || o.usable == 0) o.usable = o.cgroup_limit == UINT64_MAX ? o.physical : o.cgroup_limit;
    if (o.available && (o.available < o.usable || o.usable == 0)) o.usable = o.available;
    if (out) *out = o;
    return o.usable;
}

uint64_t mp_usable_ram(mp_ram_info *out) { return mp_usable_ram_at("/proc", "/sys/fs/cgroup", out); }

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
