/* Usable RAM and the default memory budget.
 *
 * usable = min(MemTotal of /proc/meminfo, every cgroup limit that applies to this process):
 * v2 memory.max and memory.high, v1 memory.limit_in_bytes, read in each cgroup directory from the
 * process's own (from /proc/self/cgroup) up to the mount root.
 *
 * usable is further capped by MemAvailable (RAM other programs leave free right now), when known.
 *
 * Default budget rule (mp_default_budget): cap = usable - headroom, headroom = usable / 10 within
 * [256 MiB, 4 GiB]; total = floor + min(all experts, cap - floor): the cache takes the RAM the
 * machine has, up to every expert of the model. If floor > cap, total = floor ("tight"); if
 * floor > usable, refuse (below_floor). The cache gets total - floor. Why a headroom at all: a
 * peer measured decode 8x slower when the cache was so large the OS paged it (hits became page
 * faults); 0.9 x a 3.2 GB cgroup limit measured 80-100 % cache hits without paging here, where the
 * earlier rule (3/4 x usable, at most 3 tokens' experts) left most of that RAM idle. */
#ifndef MP_MEMPLAN_H
#define MP_MEMPLAN_H

#include <stdint.h>

#include "moepack.h" /* MP_API */

typedef struct {
    uint64_t physical;       /* MemTotal in bytes (0 if unreadable) */
    uint64_t cgroup_limit;   /* smallest cgroup limit found, UINT64_MAX if none */
    uint64_t available;      /* MemAvailable in bytes (0 if unreadable) */
    uint64_t usable;         /* min of physical, cgroup_limit and available (when known) */
    char limit_file[256];    /* file that gave cgroup_limit ("" if none) */
} mp_ram_info;

/* Returns usable bytes (0 if nothing could be read). out may be NULL. */
uint64_t mp_usable_ram(mp_ram_info *out);
/* Same with other roots (tests): proc_root replaces "/proc", cgroup_root "/sys/fs/cgroup". */
uint64_t mp_usable_ram_at(const char *proc_root, const char *cgroup_root, mp_ram_info *out);

/* CPUs this process can keep busy, by moepack/sysinfo.py's rule: the CPUs in its affinity mask
 * (sched_getaffinity), lowered to the tightest cgroup CPU quota along its cgroup path (v2
 * cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us) rounded up; at least 1. */
int mp_usable_cores(void);
int mp_affinity_cores(void);
/* Same with other roots and a given affinity count (<= 0: this process's), for tests. */
MP_API int mp_usable_cores_at(const char *proc_root, const char *cgroup_root, int affinity);

/* Default OS headroom: usable / 10 within [256 MiB, 4 GiB] (never more than usable). */
uint64_t mp_default_headroom(uint64_t usable);

typedef struct {
    uint64_t usable;         /* from mp_usable_ram */
    uint64_t floor;          /* trunk + KV/state + scratch + one step's experts (compute helper) */
    uint64_t all_experts;    /* every expert record of the model (more cache is useless) */
    uint64_t headroom;       /* left to the OS (mp_default_headroom) */
} mp_budget_in;

typedef struct {
    uint64_t cap;            /* usable - headroom (saturating) */
    uint64_t total;          /* chosen total budget */
    uint64_t cache;          /* total - floor: bytes for the expert cache */
    int tight;               /* 1: the floor alone reaches the cap (no cache beyond it) */
    int below_floor;         /* 1: floor > usable, refuse to start */
} mp_budget_out;

/* Fills out by the rule above; returns 0, or -1 when below_floor. */
int mp_default_budget(const mp_budget_in *in, mp_budget_out *out);

/* A user-chosen total budget: -1 if below floor (refuse), 1 if above usable (warn: page-cache
 * cliff), 0 if fine. */
int mp_check_budget(uint64_t total, uint64_t floor, uint64_t usable);

#endif
