/* memplan.c: usable RAM from fake /proc + cgroup trees (v2 with limits up the hierarchy,
 * memory.high below memory.max, v1, hybrid, none) and the default budget rule.
 * Usage: test_memplan VECTORS_DIR SCRATCH_DIR */
#define _GNU_SOURCE
#include <string.h>
#include <sys/stat.h>

#include "memplan.h"
#include "t.h"

#define GiB (1ull << 30)

static const char *S;

static void put(const char *rel, const char *text) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", S, rel);
    for (char *q = p + strlen(S) + 1; *q; q++) /* mkdir -p of the parents */
        if (*q == '/') { *q = 0; mkdir(p, 0755); *q = '/'; }
    FILE *f = fopen(p, "w");
    if (f) { fputs(text, f); fclose(f); }
}

static uint64_t usable(const char *tree, mp_ram_info *info) {
    char proc[4096], cg[4096];
    snprintf(proc, sizeof proc, "%s/%s/proc", S, tree);
    snprintf(cg, sizeof cg, "%s/%s/cg", S, tree);
    return mp_usable_ram_at(proc, cg, info);
}

int main(int argc, char **argv) {
    S = argc > 2 ? argv[2] : "/tmp";
    mp_ram_info r;
    const char *meminfo = "MemTotal:       16777216 kB\nMemFree:        1 kB\n"; /* 16 GiB */

    /* v2: 8 GiB max at the parent, "max" and a 6 GiB high at the leaf -> 6 GiB from memory.high */
    put("v2/proc/meminfo", meminfo);
    put("v2/proc/self/cgroup", "0::/a/b\n");
    put("v2/cg/cgroup.controllers", "memory\n");
    put("v2/cg/a/memory.max", "8589934592\n");
    put("v2/cg/a/b/memory.max", "max\n");
    put("v2/cg/a/b/memory.high", "6442450944\n");
    CHECK(usable("v2", &r) == 6 * GiB, "v2 usable %llu", (unsigned long long)r.usable);
    CHECK(r.physical == 16 * GiB && strstr(r.limit_file, "a/b/memory.high"), "v2 info: %s", r.limit_file);

    /* v2 path the mount namespace hides: the walk still finds the root's limit */
    put("v2h/proc/meminfo", meminfo);
    put("v2h/proc/self/cgroup", "0::/not/mounted/here\n");
    put("v2h/cg/cgroup.controllers", "memory\n");
    put("v2h/cg/memory.max", "4294967296\n");
    CHECK(usable("v2h", &r) == 4 * GiB, "hidden v2 %llu", (unsigned long long)r.usable);

    /* v1: unlimited sentinel at the root, 2 GiB in the middle, leaf directory missing */
    put("v1/proc/meminfo", meminfo);
    put("v1/proc/self/cgroup", "9:pids:/\n4:cpuacct,memory:/x/y\n0::/\n");
    put("v1/cg/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put("v1/cg/memory/x/memory.limit_in_bytes", "2147483648\n");
    CHECK(usable("v1", &r) == 2 * GiB, "v1 %llu", (unsigned long long)r.usable);

    /* hybrid: v2 under cg/unified */
    put("hy/proc/meminfo", meminfo);
    put("hy/proc/self/cgroup", "0::/\n");
    put("hy/cg/unified/memory.max", "3221225472\n");
    CHECK(usable("hy", &r) == 3 * GiB, "hybrid %llu", (unsigned long long)r.usable);

    /* no limits at all, and a limit above physical RAM */
    put("none/proc/meminfo", meminfo);
    put("none/proc/self/cgroup", "0::/\n");
    put("none/cg/cgroup.controllers", "\n");
    put("none/cg/memory.max", "max\n");
    CHECK(usable("none", &r) == 16 * GiB && r.cgroup_limit == UINT64_MAX && !r.limit_file[0], "none");
    put("big/proc/meminfo", meminfo);
    put("big/proc/self/cgroup", "0::/\n");
    put("big/cg/cgroup.controllers", "\n");
    put("big/cg/memory.max", "68719476736\n");
    CHECK(usable("big", &r) == 16 * GiB, "limit above physical");
    CHECK(usable("missing", &r) == 0, "nothing readable -> 0");

    /* this machine */
    uint64_t u = mp_usable_ram(&r);
    printf("  this machine: physical %llu, cgroup limit %s%s, usable %llu\n", (unsigned long long)r.physical,
           r.cgroup_limit == UINT64_MAX ? "none" : "", r.limit_file, (unsigned long long)u);
    CHECK(u > 0 && u <= r.physical, "real usable");

    /* MemAvailable below the limits caps usable */
    put("avail/proc/meminfo", "MemTotal:       16777216 kB\nMemAvailable:    4194304 kB\n");
    put("avail/proc/self/cgroup", "0::/\n");
    put("avail/cg/cgroup.controllers", "\n");
    put("avail/cg/memory.max", "max\n");
    CHECK(usable("avail", &r) == 4 * GiB && r.available == 4 * GiB && r.physical == 16 * GiB, "available");

    /* budget rule: the cache takes usable - headroom - floor, up to every expert */
    mp_budget_out o;
    mp_budget_in in = {64 * GiB, 10 * GiB, 100 * GiB, 4 * GiB}; /* cap 60: cache 50 of 100 */
    CHECK(mp_default_budget(&in, &o) == 0 && !o.tight && o.total == 60 * GiB && o.cache == 50 * GiB && o.cap == 60 * GiB, "cap");
    in = (mp_budget_in){64 * GiB, 10 * GiB, 20 * GiB, 4 * GiB}; /* all experts fit: no more */
    CHECK(mp_default_budget(&in, &o) == 0 && o.total == 30 * GiB && o.cache == 20 * GiB, "all experts");
    in = (mp_budget_in){12 * GiB, 10 * GiB, 20 * GiB, 3 * GiB}; /* cap 9 < floor <= usable */
    CHECK(mp_default_budget(&in, &o) == 0 && o.tight && o.total == 10 * GiB && o.cache == 0, "floor above cap");
    in = (mp_budget_in){8 * GiB, 10 * GiB, 4 * GiB, 1 * GiB};
    CHECK(mp_default_budget(&in, &o) == -1 && o.below_floor, "below floor refuses");
    in = (mp_budget_in){UINT64_MAX, 1, UINT64_MAX, 0};
    CHECK(mp_default_budget(&in, &o) == 0 && o.total == UINT64_MAX, "overflow-safe");
    CHECK(mp_default_headroom(64 * GiB) == 4 * GiB && mp_default_headroom(8 * GiB) == 8 * GiB / 10 &&
          mp_default_headroom(1 * GiB) == 256ull << 20 && mp_default_headroom(100) == 100, "headroom");
    CHECK(mp_check_budget(5, 10, 100) == -1 && mp_check_budget(200, 10, 100) == 1 && mp_check_budget(50, 10, 100) == 0, "check");
    T_DONE("test_memplan");
}
