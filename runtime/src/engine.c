/* Public API (moepack.h): ties the container reader, the expert cache and the model together,
 * plans memory, and keeps timing statistics. */
#define _POSIX_C_SOURCE 200809L
#include "moepack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "container.h"
#include "memplan.h"
#include "model.h"
#include "seterr.h"

struct mp_engine {
    mp_container *c;
    mp_experts *ex;
    mpm_config cfg;
    mpm_model *model;
    mpk_pool *pool;
    const mpk_impl *kern; /* this engine's kernels (mp_config.kernels) */
    uint8_t *arena; /* all trunk tensors, read once at open */
    uint64_t arena_len;
    uint64_t *arena_off; /* [tensor index]: where each tensor starts in the arena */
    int verify_reads;
    int pos;
    mp_plan_info plan;
    uint64_t budget, cache_bytes;
    int cache_experts;
    int chunk;       /* prompt tokens per forward pass between calls */
    int fixed_chunk; /* the caller asked for `chunk`: no pass is longer */
    uint64_t room;   /* the cache's bytes plus what cache_experts left unused: what a longer
                      * prompt's passes may borrow (mp_eval) */
    int longest_pass;
    atomic_int cancel; /* mp_set_cancel */
    mpm_expert_io io;
    double prompt_s, decode_s, io_wait0;
    uint64_t prompt_tok, decode_tok;
    char err[512];
};

static uint64_t align64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

void mp_config_default(mp_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->prefetch = 1;
    cfg->warm = 1;
    cfg->o_direct = -1;
    cfg->cache_policy = MP_CACHE_LFU;
    cfg->cache_experts = -1;
}

/* ---- planning ---- */

static uint64_t trunk_bytes(const mp_container *c) {
    uint64_t t = 0;
    for (size_t i = 0; i < mpc_tensor_count(c); i++) t += align64(mpc_tensor_at(c, i)->length);
    return t;
}

/* The largest buffer one compute task allocates for a trunk matrix (mpk_task_bytes) */
static uint64_t task_bytes(const mp_container *c) {
    uint64_t most = 0;
    for (size_t i = 0; i < mpc_tensor_count(c); i++) {
        const mp_tensor_info *t = mpc_tensor_at(c, i);
        if (t->ndim != 2 || t->codec.kind >= MP_CODEC_RVQ) continue;
        uint64_t b = mpk_task_bytes(t->shape[1], (int64_t)t->codec.group_size); /* 0: ungrouped */
        if (b > most) most = b;
    }
    return most;
}

/* the compute threads mp_open starts for `want` (mpk_pool_create's bound) */
static int plan_threads(const mp_config *want) {
    int n = want->threads > 0 ? want->threads : mp_usable_cores();
    return n < 1 ? 1 : n > MPK_POOL_MAX_THREADS ? MPK_POOL_MAX_THREADS : n;
}

static uint64_t chunk_bytes(const mpm_config *cfg, int chunk, int stages) {
    return mpm_scratch_bytes(cfg, chunk) + mpm_moe_chunk_bytes(cfg, chunk, stages) +
           mpm_linear_chunk_bytes(cfg, chunk);
}

/* The longest context whose floor fits `limit` bytes: the floor grows by the KV bytes and one
 * score per head for each token of context, the rest is fixed. */
static int fitting_ctx(const mpm_config *cfg, const mp_plan_info *p, uint64_t limit) {
    uint64_t per = p->kv_token_bytes + (uint64_t)cfg->n_heads * 4u;
    uint64_t fixed = p->floor_bytes - (p->kv_bytes - p->state_bytes) - (uint64_t)cfg->n_heads * (uint64_t)p->ctx * 4u;
    uint64_t n = limit > fixed ? (limit - fixed) / per : 0;
    return n < (uint64_t)p->max_pos ? (int)n : p->max_pos;
}

static uint64_t chunk_extra(const mp_plan_info *p, int chunk) {
    return chunk > MPM_CHUNK ? (uint64_t)(chunk - MPM_CHUNK) * p->chunk_token_bytes : 0;
}

/* the longest chunk the plan holds between calls */
static int held_chunk(const mp_plan_info *p) { return p->ctx < MPM_HELD_CHUNK ? p->ctx : MPM_HELD_CHUNK; }

/* The prompt chunk a total budget pays for when none is asked: 16 plus what the room above the
 * floor buys, taking what all experts leave of it, at least half (the rest is cache), and up to
 * three quarters when that buys the longest chunk: a prompt that takes two passes reads each
 * layer's experts twice, while the cache it would keep saves a part of one token's reads. For a
 * model with linear attention a multiple of its sub-chunk, so that every sub-chunk of a long
 * prompt lies inside one forward pass (the chunk form). */
static int planned_chunk(const mpm_config *cfg, const mp_plan_info *p, uint64_t total) {
    uint64_t room = total > p->floor_bytes ? total - p->floor_bytes : 0;
    uint64_t left = room > p->experts_bytes ? room - p->experts_bytes : 0;
    uint64_t part = left > room / 2 ? left : room / 2;
    const uint64_t longest = chunk_extra(p, held_chunk(p));
    if (part < longest && longest <= room / 4 * 3) part = longest;
    uint64_t more = p->chunk_token_bytes ? part / p->chunk_token_bytes : 0;
    const int held = held_chunk(p);
    int chunk = MPM_CHUNK + (more < (uint64_t)held ? (int)more : held);
    if (chunk > held) chunk = held > MPM_CHUNK ? held : MPM_CHUNK;
    if (cfg->n_linear && cfg->la_chunk > 1 && chunk >= cfg->la_chunk) chunk -= chunk % cfg->la_chunk;
    return chunk;
}

static int linear_chunk(const mp_config *want) {
    return want->linear_chunk ? want->linear_chunk : MPM_LA_CHUNK;
}

/* From `want`: ctx; kv (MP_KV_* or 0, the default); budget_bytes (the user's total, or 0: plan
 * against usable RAM); ram_bytes (usable RAM to plan for, or 0: this machine's); snapshots; linear_chunk. */
static int plan_for(const mp_container *c, const mpm_config *model, const mp_config *want,
                    mp_plan_info *p, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    int ctx = want->ctx, kv = want->kv;
    uint64_t budget = want->budget_bytes, ram = want->ram_bytes;
    if (want->threads < 0 || want->io_threads < 0 || want->cache_experts < -1)
        return mp_seterr(err, errlen, MP_EINVAL, "threads %d, io_threads %d, cache_experts %d: threads must be >= 0 (0 = default), cache_experts >= -1 (-1 = from the budget)",
                         want->threads, want->io_threads, want->cache_experts);
    if (want->snapshots < 0 || want->snapshots > MP_MAX_SNAPSHOTS)
        return mp_seterr(err, errlen, MP_EINVAL, "snapshots %d: must be 0..%d", want->snapshots, MP_MAX_SNAPSHOTS);
    if (!kv) kv = MP_KV_DEFAULT;
    if (kv != MP_KV_F32 && kv != MP_KV_F16)
        return mp_seterr(err, errlen, MP_EINVAL, "kv %d: must be %d (f32) or %d (f16)", kv, MP_KV_F32, MP_KV_F16);
    if (want->linear_chunk < 0 || want->linear_chunk > MP_MAX_LINEAR_CHUNK)
        return mp_seterr(err, errlen, MP_EINVAL, "linear_chunk %d: must be 0..%d (0 = %d, 1 = token by token)",
                         want->linear_chunk, MP_MAX_LINEAR_CHUNK, MPM_LA_CHUNK);
    mpm_config planned = *model; /* shares the arrays: read-only here */
    planned.kv_f16 = kv == MP_KV_F16;
    planned.la_chunk = linear_chunk(want);
    const mpm_config *cfg = &planned;
    p->max_pos = cfg->max_pos < INT32_MAX ? (int)cfg->max_pos : INT32_MAX;
    if (ctx < 0) return mp_seterr(err, errlen, MP_EINVAL, "ctx %d: must be 0 (the default) or more", ctx);
    if (!ctx) ctx = cfg->max_pos < 4096 ? (int)cfg->max_pos : 4096;
    if (ctx > p->max_pos)
        return mp_seterr(err, errlen, MP_EINVAL, "ctx %d is longer than this model's longest context, %d tokens (max_position_embeddings)", ctx, p->max_pos);
    p->ctx = ctx;
    p->kv = kv;
    p->top_k = (int)cfg->top_k;
    p->trunk_bytes = trunk_bytes(c);
    /* linear-attention layers' conv + recurrent state: fixed size, counted with the KV cache */
    p->state_bytes = mpm_state_bytes(cfg);
    p->kv_token_bytes = mpm_kv_bytes(cfg, 1);
    /* KV bytes are linear in ctx; past 2^62 no machine holds them and the sums below would wrap */
    if (p->kv_token_bytes > (UINT64_C(1) << 62) / (uint64_t)ctx)
        return mp_seterr(err, errlen, MP_EBUDGET, "ctx %d needs %llu bytes of KV cache a token: more than 2^62 bytes in all; ask for a shorter --ctx",
                         ctx, (unsigned long long)p->kv_token_bytes);
    p->kv_bytes = mpm_kv_bytes(cfg, ctx) + p->state_bytes;
    /* the caller's mp_state_save buffers (chat and serve keep one to rewind to a turn) */
    p->snapshot_bytes = (uint64_t)want->snapshots * p->state_bytes;
    int stages = 1;
    uint64_t min_stride = UINT64_MAX;
    for (int64_t l = 0; l < cfg->n_layers; l++) {
        if (!cfg->layer_is_moe[l]) continue;
        const mp_bank_info *b = mpc_bank(c, (int)l);
        if (!b) return mp_seterr(err, errlen, MP_EFORMAT, "layer %lld is a MoE layer but has no expert bank", (long long)l);
        for (int k = 0; k < 3; k++)
            if ((int)b->parts[k].codec.stages > stages) stages = (int)b->parts[k].codec.stages;
        p->moe_layers++;
        p->step_expert_bytes += (uint64_t)cfg->top_k * b->stride;
        p->experts_bytes += (uint64_t)b->count * b->stride;
        p->expert_count += b->count;
        if (b->stride > p->expert_record_bytes) p->expert_record_bytes = b->stride;
        if (b->stride < min_stride) min_stride = b->stride;
    }
    /* Expert records held beyond the cache (cache.h): model_moe.c pins at most one group of
     * top_k records at a time (released before the next acquire, for decode and prompt chunks
     * alike); those that find no room are held outside the cache, and as many bytes of their
     * buffers may stay recycled for reuse. Prefetches only ever fill the cache. When every
     * acquired record has one size, one group is enough: cache.c reuses any recycled buffer
     * before allocating, so it allocates only with none recycled, and then holds at most the
     * cache plus the group's records (docs/RUNTIME.md, "Memory plan"). */
    int one_size = p->moe_layers && min_stride == p->expert_record_bytes;
    p->pinned_expert_bytes = (one_size ? 1u : 2u) * (uint64_t)cfg->top_k * p->expert_record_bytes;
    /* the floor holds 16-token prompt chunks; a bigger chunk costs chunk_token_bytes a token */
    p->scratch_bytes = chunk_bytes(cfg, MPM_CHUNK, stages) + (uint64_t)cfg->n_heads * (uint64_t)ctx * 4u;
    p->chunk_token_bytes = chunk_bytes(cfg, MPM_CHUNK + 1, stages) - chunk_bytes(cfg, MPM_CHUNK, stages);
    p->max_chunk = ctx; /* a prompt's pass, borrowing from the expert cache (mp_eval) */
    p->scratch_bytes += mpm_linear_scratch_bytes(cfg); /* per token, whatever the chunk */
    p->scratch_bytes += (uint64_t)plan_threads(want) * task_bytes(c); /* each thread's task buffer */
    p->scratch_bytes += mpc_held_bytes(c); /* the container's index, read and parsed */
    p->scratch_bytes += mpe_bookkeeping_bytes(p->expert_count); /* the expert cache's tables */
    p->floor_bytes = p->trunk_bytes + p->kv_bytes + p->scratch_bytes + p->pinned_expert_bytes +
                     p->snapshot_bytes;
    p->recommended_bytes = p->floor_bytes + 4 * p->step_expert_bytes; /* cache: 4 tokens' experts */
    mp_ram_info ri;
    p->usable_ram_bytes = ram ? ram : mp_usable_ram(&ri);
    /* the default budget also pays for the longest pass when RAM allows (the cache still gets
     * every expert it can): between calls the held chunk's buffers and a cache with room to
     * spare, which a longer prompt's passes borrow (fewer, longer passes compute faster even
     * with every expert cached: the prefill product decodes an expert's codes once a pass) */
    uint64_t max_extra = chunk_extra(p, p->max_chunk);
    mp_budget_in in = {p->usable_ram_bytes, p->floor_bytes + max_extra, p->experts_bytes,
                       mp_default_headroom(p->usable_ram_bytes)};
    mp_budget_out out;
    if (mp_default_budget(&in, &out) == 0 && !out.tight) {
        p->default_bytes = out.total;
    } else {
        in.floor = p->floor_bytes;
        if (mp_default_budget(&in, &out) == 0) p->default_bytes = out.total;
    }
    if (p->default_bytes) {
        p->default_chunk = planned_chunk(cfg, p, p->default_bytes);
        uint64_t used = p->floor_bytes + chunk_extra(p, p->default_chunk);
        p->default_cache_bytes = p->default_bytes > used ? p->default_bytes - used : 0;
    }
    p->held_chunk = held_chunk(p);
    if (budget >= p->floor_bytes) { /* what mp_open gives that budget */
        p->budget_chunk = planned_chunk(cfg, p, budget);
        uint64_t used = p->floor_bytes + chunk_extra(p, p->budget_chunk);
        p->budget_cache_bytes = budget > used ? budget - used : 0;
    }
    p->max_ctx = fitting_ctx(cfg, p, budget ? budget : p->usable_ram_bytes);
    return 0;
}

static int parse_model(const mp_container *c, mpm_config *cfg, char *err, size_t errlen) {
    return mpm_config_parse(mpc_model(c), cfg, err, errlen);
}

int mp_plan(const char *path, int ctx, mp_plan_info *out, char *err, size_t errlen) {
    mp_config cfg;
    mp_config_default(&cfg);
    cfg.ctx = ctx;
    return mp_plan_config(path, &cfg, out, err, errlen);
}

int mp_plan_config(const char *path, const mp_config *pc, mp_plan_info *out, char *err, size_t errlen) {
    if (!path || !pc || !out) return mp_seterr(err, errlen, MP_EINVAL, "mp_plan_config: NULL argument");
    int rc = MP_OK;
    mp_container *c = mpc_open_rc(path, &rc, err, errlen);
    if (!c) return rc ? rc : MP_EFORMAT;
    mpm_config cfg;
    rc = parse_model(c, &cfg, err, errlen);
    if (!rc) rc = plan_for(c, &cfg, pc, out, err, errlen);
    mpm_config_free(&cfg);
    mpc_close(c);
    return rc;
}

/* ---- container -> model adapters ---- */

static int tensor_cb(void *user, const char *name, mpm_src *out) {
    mp_engine *e = user;
    const mp_tensor_info *t = mpc_tensor(e->c, name);
    if (!t) return 1;
    out->codec = &t->codec;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->data = e->arena + e->arena_off[t - mpc_tensor_at(e->c, 0)];
    out->length = t->length;
    return 0;
}

static int bank_cb(void *user, int layer, mpm_bank_info *out) {
    mp_engine *e = user;
    const mp_bank_info *b = mpc_bank(e->c, layer);
    if (!b) return 1;
    out->layer = layer;
    out->count = b->count;
    out->stride = (int64_t)b->stride;
    for (int p = 0; p < 3; p++) {
        const mp_part_info *pi = &b->parts[p];
        if (pi->codec.kind != MP_CODEC_RVQ || pi->ndim != 2 || pi->codec.dim != 8 ||
            pi->codec.entries != 256)
            return MP_EUNSUPPORTED;
        out->part_offset[p] = pi->offset;
        out->rows[p] = pi->shape[0];
        out->cols[p] = pi->shape[1];
        out->stages[p] = (int)pi->codec.stages;
        out->rotation_block[p] = pi->codec.hadamard ? (int)pi->codec.rotation_block : 0;
    }
    return 0;
}

static int io_acquire(void *user, int layer, const int *experts, int n, const uint8_t **records,
                      char *msg, size_t msglen) {
    mp_engine *e = user;
    return mpe_acquire(e->ex, layer, experts, n, records, msg, msglen);
}
static void io_release(void *user, int layer, const int *experts, int n) {
    mpe_release(((mp_engine *)user)->ex, layer, experts, n);
}
static void io_prefetch(void *user, int layer, const int *experts, int n) {
    mpe_prefetch(((mp_engine *)user)->ex, layer, experts, n);
}

static int load_trunk(mp_engine *e, const int *cancel, char *err, size_t errlen) {
    e->arena_len = trunk_bytes(e->c);
    e->arena = malloc(e->arena_len ? (size_t)e->arena_len : 1);
    e->arena_off = calloc(mpc_tensor_count(e->c) + 1, sizeof *e->arena_off);
    if (!e->arena || !e->arena_off) return mp_seterr(err, errlen, MP_ENOMEM, "out of memory for the trunk (%llu bytes)", (unsigned long long)e->arena_len);
    uint64_t off = 0;
    for (size_t i = 0; i < mpc_tensor_count(e->c); i++) {
        const mp_tensor_info *t = mpc_tensor_at(e->c, i);
        if (cancel && __atomic_load_n(cancel, __ATOMIC_RELAXED))
            return mp_seterr(err, errlen, MP_ECANCELED, "cancelled while reading the trunk");
        int rc = mpc_read_tensor(e->c, t, e->arena + off, t->length, e->verify_reads, err, errlen);
        if (rc) return rc;
        e->arena_off[i] = off; /* file order, each at a 64-aligned offset */
        off += align64(t->length);
    }
    return 0;
}


/* A size in the unit moepack.sizes.format_size picks (decimal, 3 decimals: 6.469 MB), with up
 * to 6 decimals where 3 would hide a remainder: a floor of 6000483 bytes must not read as the
 * 6.000 MB budget it exceeds. */
static const char *fmt_size(uint64_t b, char *buf, size_t n) {
    static const char *const units[] = {"kB", "MB", "GB", "TB"};
    if (b < 1000) {
        snprintf(buf, n, "%llu B", (unsigned long long)b);
        return buf;
    }
    double scale = 1;
    int u = 0;
    for (; u < 4; u++) {
        scale *= 1000;
        snprintf(buf, n, "%.3f", (double)b / scale);
        if (u == 3 || strchr(buf, '.') - buf < 4) break; /* 999.9996 kB prints as 1.000 MB */
    }
    int dec = 3;
    for (uint64_t step = (uint64_t)scale / 1000; dec < 6 && b % step; step /= 10) dec++;
    snprintf(buf, n, "%.*f %s", dec, (double)b / scale, units[u]);
    return buf;
}

/* The records a cache of `bytes` holds: at most every expert there is (a budget beyond them is
 * room that longer passes borrow, not more records) */
static int cache_records(const mp_plan_info *p, uint64_t bytes) {
    uint64_t records = p->expert_record_bytes ? bytes / p->expert_record_bytes : 0;
    if (records > p->expert_count) records = p->expert_count;
    return records < INT32_MAX ? (int)records : INT32_MAX;
}

int mp_open(const char *path, const mp_config *cfg_in, mp_engine **out, char *err,
            size_t errlen) {
    if (!out || !path) return mp_seterr(err, errlen, MP_EINVAL, "mp_open: NULL argument");
    *out = NULL;
    mp_config cfg;
    if (cfg_in) cfg = *cfg_in;
    else mp_config_default(&cfg);
    mp_engine *e = calloc(1, sizeof *e);
    if (!e) return mp_seterr(err, errlen, MP_ENOMEM, "out of memory");
    int rc = MP_OK;
    e->verify_reads = cfg.verify_reads;
    e->kern = mpk_select(cfg.kernels);
    if (!e->kern) {
        free(e);
        return mp_seterr(err, errlen, MP_EUNSUPPORTED, "kernels %d: this CPU cannot run that path",
                         cfg.kernels);
    }
    e->c = mpc_open_rc(path, &rc, err, errlen);
    if (!e->c) {
        free(e);
        return rc ? rc : MP_EFORMAT;
    }
    if ((rc = parse_model(e->c, &e->cfg, err, errlen))) goto fail;
    if ((rc = plan_for(e->c, &e->cfg, &cfg, &e->plan, err, errlen))) goto fail;
    const mp_plan_info *p = &e->plan;
    e->cfg.kv_f16 = p->kv == MP_KV_F16;
    e->cfg.la_chunk = linear_chunk(&cfg);
    char a[32], b[32], fits[96];
    if (p->max_ctx > 0) snprintf(fits, sizeof fits, "; the longest context that fits is %d token%s (--ctx)", p->max_ctx, p->max_ctx == 1 ? "" : "s");
    else snprintf(fits, sizeof fits, "; not even one token of context fits");
    uint64_t total = cfg.budget_bytes ? cfg.budget_bytes : p->default_bytes;
    if (!total) {
        rc = mp_seterr(err, errlen, MP_EBUDGET, "this model needs at least %s of memory (floor for ctx %d) but only %s is usable%s",
                  fmt_size(p->floor_bytes, a, sizeof a), p->ctx, fmt_size(p->usable_ram_bytes, b, sizeof b), fits);
        goto fail;
    }
    if (total < p->floor_bytes) {
        rc = mp_seterr(err, errlen, MP_EBUDGET, "budget %s is below the floor: this model needs at least %s (%llu bytes) for ctx %d%s",
                  fmt_size(total, a, sizeof a), fmt_size(p->floor_bytes, b, sizeof b), (unsigned long long)p->floor_bytes, p->ctx, fits);
        goto fail;
    }
    e->budget = total;
    /* prompt chunk: asked for, or 16 plus what the budget above the floor pays for (a bigger
     * chunk reads each layer's experts once for more tokens; the rest is cache) */
    int chunk = cfg.chunk;
    if (chunk < 0) {
        rc = mp_seterr(err, errlen, MP_EINVAL, "chunk %d: must be 1 or more (0 = from the memory plan)", chunk);
        goto fail;
    }
    e->fixed_chunk = chunk > 0;
    if (!chunk) chunk = planned_chunk(&e->cfg, p, total);
    if (chunk > p->max_chunk) chunk = p->max_chunk; /* no pass is longer than the context */
    uint64_t extra = chunk_extra(p, chunk);
    if (total - p->floor_bytes < extra) {
        rc = mp_seterr(err, errlen, MP_EBUDGET, "budget %s is too small for chunks of %d tokens: that needs %s",
                       fmt_size(total, a, sizeof a), chunk, fmt_size(p->floor_bytes + extra, b, sizeof b));
        goto fail;
    }
    e->chunk = chunk;
    /* the cache gets what is left after trunk, KV, scratch (with the chunk's) and the expert
     * records held beyond the cache: at exactly the floor, no cache (every record is read when
     * used) */
    uint64_t fixed = p->trunk_bytes + p->kv_bytes + p->scratch_bytes + extra + p->pinned_expert_bytes +
                     p->snapshot_bytes;
    uint64_t cache = total > fixed ? total - fixed : 0;
    if (cfg.cache_experts >= 0 && (uint64_t)cfg.cache_experts * p->expert_record_bytes < cache)
        cache = (uint64_t)cfg.cache_experts * p->expert_record_bytes;
    e->room = total > fixed ? total - fixed : 0;
    e->cache_bytes = cache;
    e->cache_experts = cache_records(p, cache);

    if ((rc = load_trunk(e, cfg.cancel, err, errlen))) goto fail;
    mp_expert_options eo;
    mpe_options_default(&eo);
    eo.budget_bytes = cache;
    eo.policy = cfg.cache_policy;
    eo.reader_threads = cfg.io_threads;
    eo.o_direct = cfg.o_direct;
    eo.verify_reads = cfg.verify_reads;
    eo.warm = cfg.warm;
    if (p->moe_layers) {
        e->ex = mpe_create(e->c, &eo, err, errlen);
        if (!e->ex) {
            rc = MP_EIO;
            goto fail;
        }
    }
    if ((rc = mpm_load(&e->cfg, e->kern, tensor_cb, bank_cb, e, p->ctx, e->chunk, &e->model, err, errlen))) goto fail;
    e->pool = mpk_pool_create(plan_threads(&cfg));
    if (!e->pool) {
        rc = mp_seterr(err, errlen, MP_ENOMEM, "cannot start compute threads");
        goto fail;
    }
    if (mpk_pool_reserve(e->pool, task_bytes(e->c))) { /* the plan's task buffers, now */
        rc = mp_seterr(err, errlen, MP_ENOMEM, "out of memory for the compute threads' buffers");
        goto fail;
    }
    mpm_set_pool(e->model, e->pool);
    e->io = (mpm_expert_io){e, io_acquire, io_release, cfg.prefetch ? io_prefetch : NULL, e->cache_experts};
    mpm_set_io(e->model, &e->io);
    mpm_set_lookahead(e->model, cfg.prefetch);
    mpm_set_cancel(e->model, &e->cancel);
    *out = e;
    return MP_OK;
fail:
    mp_close(e);
    return rc;
}

void mp_close(mp_engine *e) {
    if (!e) return;
    mpm_free(e->model);
    mpk_pool_destroy(e->pool);
    mpe_destroy(e->ex);
    free(e->arena);
    free(e->arena_off);
    mpm_config_free(&e->cfg);
    mpc_close(e->c);
    free(e);
}

const char *mp_error(const mp_engine *e) { return e ? e->err : "no engine"; }
int mp_vocab_size(const mp_engine *e) { return (int)e->cfg.vocab; }
int mp_context_size(const mp_engine *e) { return e->plan.ctx; }
int mp_position(const mp_engine *e) { return e->pos; }
const char *mp_kernels(const mp_engine *e) { return mpk_impl_name(e->kern); }
int mp_kernels_available(int kernels) { return mpk_select(kernels) != NULL; }
int mp_threads(const mp_engine *e) { return mpk_pool_threads(e->pool); }
const char *mp_kv_type(const mp_engine *e) { return e->plan.kv == MP_KV_F16 ? "f16" : "f32"; }
void mp_reset(mp_engine *e) { e->pos = 0; }
/* attention reads positions < pos only, so dropping the tail is just moving pos back; a
 * recurrent state (linear attention) holds every token folded in and cannot go back */
int mp_truncate(mp_engine *e, int n) {
    if (n < 0 || n >= e->pos) return 0;
    if (n > 0 && e->plan.state_bytes) {
        snprintf(e->err, sizeof e->err, "cannot truncate to %d of %d tokens: linear-attention state cannot be rolled back (reset and feed the prefix again)", n, e->pos);
        return MP_EUNSUPPORTED;
    }
    e->pos = n;
    return 0;
}

uint64_t mp_state_bytes(const mp_engine *e) { return mpm_state_size(e->model); }

int mp_state_save(mp_engine *e, void *buf, uint64_t len) {
    if (len != mpm_state_size(e->model) || (len && !buf)) {
        snprintf(e->err, sizeof e->err, "state snapshot buffer of %llu bytes (need %llu)", (unsigned long long)len, (unsigned long long)mpm_state_size(e->model));
        return MP_EINVAL;
    }
    mpm_state_save(e->model, buf);
    return 0;
}

/* the KV cache keeps positions < pos of the same prefix (the caller's promise); the recurrent
 * state comes back from the snapshot */
int mp_state_restore(mp_engine *e, int pos, const void *buf, uint64_t len) {
    if (len != mpm_state_size(e->model) || (len && !buf) || pos < 0 || pos > e->pos) {
        snprintf(e->err, sizeof e->err, "state snapshot of %llu bytes at position %d cannot be restored at position %d (need %llu bytes, a position <= %d)", (unsigned long long)len, pos, e->pos, (unsigned long long)mpm_state_size(e->model), e->pos);
        return MP_EINVAL;
    }
    mpm_state_load(e->model, buf);
    e->pos = pos;
    return 0;
}

/* Index of the first NaN or Inf in l[0..n), or n.  One pass over vocab floats per token: noise
 * next to the forward pass, and it turns a NaN/Inf weight into an error instead of garbage. */
static size_t first_nonfinite(const float *l, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(l[i])) return i;
    return n;
}

/* Bytes a pass over a long prompt reads with `cache` bytes of cache, an estimate: such a pass
 * touches every expert, and the cache keeps the same ones across passes */
static uint64_t pass_reads(const mp_engine *e, uint64_t cache) {
    return e->plan.experts_bytes > cache ? e->plan.experts_bytes - cache : 0;
}

/* Tokens a pass of an n-token prompt takes, and in *cache_for the cache's budget meanwhile: the
 * held chunk, or a longer one whose buffers take the room of the expert cache (all but two
 * acquire groups, so that the next group's prefetch finds room while one is pinned, or with
 * every expert cached only what they leave) when that reads fewer expert bytes in all: p passes
 * each read what the cache lacks, plus what it gave up, read again later.  Equal passes, a
 * multiple of the linear attention's sub-chunk. */
static int pass_tokens(const mp_engine *e, size_t n, uint64_t *cache_for) {
    const int held = e->chunk;
    const uint64_t ctb = e->plan.chunk_token_bytes, cache = e->cache_bytes;
    *cache_for = cache;
    if (e->fixed_chunk || !e->ex || n <= (size_t)held || !ctb) return held;
    const int la = e->cfg.n_linear && e->cfg.la_chunk > 1 ? e->cfg.la_chunk : 1;
    const uint64_t keep = 2u * (uint64_t)e->plan.top_k * e->plan.expert_record_bytes;
    const uint64_t unused = e->room > cache ? e->room - cache : 0;
    const uint64_t takeable = (cache > keep ? cache - keep : 0) + unused;
    const uint64_t kept = cache < e->plan.experts_bytes ? cache : e->plan.experts_bytes;
    const size_t p0 = (n + (size_t)held - 1) / (size_t)held;
    const uint64_t best = (uint64_t)p0 * pass_reads(e, cache);
    for (size_t p = 1; p < p0; p++) {
        size_t c = (n + p - 1) / p;
        c = (c + (size_t)la - 1) / (size_t)la * (size_t)la;
        if (c > (size_t)e->plan.ctx || c <= (size_t)held) continue;
        const uint64_t extra = (uint64_t)(c - (size_t)held) * ctb;
        if (extra > takeable) continue;
        const uint64_t left = cache - (extra > unused ? extra - unused : 0);
        const uint64_t reads = (uint64_t)p * pass_reads(e, left) + (kept - (left < kept ? left : kept));
        if (reads <= best) { /* the fewest passes that read no more */
            *cache_for = left;
            return (int)c;
        }
    }
    return held;
}

/* The cache's budget and what the forward pass plans its acquire groups with */
static void set_cache(mp_engine *e, uint64_t bytes) {
    mpe_set_budget(e->ex, bytes);
    e->io.cached = cache_records(&e->plan, bytes);
    mpm_set_io(e->model, &e->io);
}

/* n tokens in passes of up to C; on failure the sequence is as it was before */
static int eval_passes(mp_engine *e, const int32_t *tokens, size_t n, size_t C, float *logits, int all_positions) {
    const int pos0 = e->pos;
    const size_t V = (size_t)e->cfg.vocab;
    mpm_state_begin(e->model); /* linear-attention state: committed only if every chunk runs */
    for (size_t i = 0; i < n; i += C) {
        int k = n - i < C ? (int)(n - i) : (int)C;
        float *lo = NULL;
        if (logits && all_positions) lo = logits + i * V;
        else if (logits && i + (size_t)k == n) lo = logits;
        /* every pass of a call of several tokens is prefill, a partial last chunk included */
        int rc = mpm_forward(e->model, tokens + i, k, e->pos, lo, all_positions, n > 1);
        const size_t rows = all_positions ? (size_t)k : 1;
        const size_t bad = !rc && lo ? first_nonfinite(lo, rows * V) : rows * V;
        if (bad < rows * V) {
            rc = MP_ENONFINITE;
            snprintf(e->err, sizeof e->err,
                     "the model produced a non-finite logit (NaN or Inf) at position %zu "
                     "(vocabulary entry %zu): a weight in the container is NaN/Inf or the "
                     "activations overflow",
                     (size_t)e->pos + (all_positions ? bad / V : (size_t)k - 1), bad % V);
        }
        if (rc) {
            /* roll back the chunks already run: their KV entries lie past pos0 and are simply
             * overwritten by the next call (attention reads positions < pos only); the
             * linear-attention state was never committed */
            e->pos = pos0;
            if (rc != MP_ENONFINITE) snprintf(e->err, sizeof e->err, "%s", mpm_error(e->model));
            return rc;
        }
        e->pos += k;
        if (k > e->longest_pass) e->longest_pass = k;
    }
    mpm_state_commit(e->model);
    return MP_OK;
}

void mp_set_cancel(mp_engine *e, int cancel) {
    if (e) atomic_store(&e->cancel, cancel != 0);
}

int mp_eval(mp_engine *e, const int32_t *tokens, size_t n, float *logits, int all_positions) {
    if (!e) return MP_EINVAL;
    if (atomic_load(&e->cancel)) return mp_seterr(e->err, sizeof e->err, MP_ECANCELED, "cancelled");
    if (!tokens && n) return mp_seterr(e->err, sizeof e->err, MP_EINVAL, "mp_eval: %zu tokens but no token array", n);
    if (n > (size_t)(e->plan.ctx - e->pos)) {
        snprintf(e->err, sizeof e->err, "context full: %d + %zu tokens > ctx %d", e->pos, n, e->plan.ctx);
        return MP_ECTX;
    }
    int prompt = n > 1 || e->pos == 0;
    double t0 = mpm_now();
    size_t C = (size_t)e->chunk;
    uint64_t cache_for;
    const int pass = pass_tokens(e, n, &cache_for);
    if (pass <= e->chunk && mpm_chunk(e->model) != e->chunk) { /* an earlier call kept its pass's */
        if (mpm_set_chunk(e->model, e->chunk)) return mp_seterr(e->err, sizeof e->err, MP_ENOMEM, "%s", mpm_error(e->model));
        set_cache(e, e->cache_bytes);
    }
    if (pass > e->chunk) { /* a long prompt borrows the cache for its chunk's buffers */
        set_cache(e, cache_for);
        if (mpm_set_chunk(e->model, pass) == MP_OK) {
            C = (size_t)pass;
        } else { /* no memory for it: the held chunk's passes */
            set_cache(e, e->cache_bytes);
            if (mpm_chunk(e->model) != e->chunk) return mp_seterr(e->err, sizeof e->err, MP_ENOMEM, "%s", mpm_error(e->model));
        }
    }
    int rc = eval_passes(e, tokens, n, C, logits, all_positions);
    /* back to the held chunk and the whole cache; without memory for the held buffers, the
     * pass's (or none) and the lent cache stay, within the budget, until a later call gets them
     * back: this call's tokens are in either way */
    if (C > (size_t)e->chunk && mpm_set_chunk(e->model, e->chunk) == MP_OK) {
        mpk_pool_inputs_release(e->pool); /* sized for the pass: the next call maps the held chunk's */
        set_cache(e, e->cache_bytes);
    }
    if (rc) return rc;
    double dt = mpm_now() - t0;
    if (prompt) {
        e->prompt_s += dt;
        e->prompt_tok += n;
    } else {
        e->decode_s += dt;
        e->decode_tok += n;
    }
    return MP_OK;
}


static int is_eos(const mp_engine *e, int32_t t) {
    for (int i = 0; i < e->cfg.n_eos; i++)
        if (e->cfg.eos[i] == t) return 1;
    return 0;
}

int mp_generate(mp_engine *e, const int32_t *prompt, size_t n_prompt, int n_new,
                const mp_sampler *s, mp_token_cb cb, void *user) {
    if (!e) return MP_EINVAL;
    if (n_new < 0) return mp_seterr(e->err, sizeof e->err, MP_EINVAL, "mp_generate: n_new %d is negative", n_new);
    if (!n_prompt) return mp_seterr(e->err, sizeof e->err, MP_EINVAL, "mp_generate: the prompt is empty");
    float *logits = malloc((size_t)e->cfg.vocab * sizeof(float));
    if (!logits) return mp_seterr(e->err, sizeof e->err, MP_ENOMEM, "out of memory for %lld logits", (long long)e->cfg.vocab);
    uint64_t rng = mp_rng_seed(s ? s->seed : 0);
    int rc = mp_eval(e, prompt, n_prompt, logits, 0);
    int made = 0;
    while (rc == MP_OK && made < n_new) {
        int32_t t = mp_sample(logits, (int)e->cfg.vocab, s, &rng);
        made++;
        if ((cb && cb(t, user)) || is_eos(e, t) || made == n_new) break;
        rc = mp_eval(e, &t, 1, logits, 0);
    }
    free(logits);
    return rc == MP_OK ? made : rc;
}

void mp_get_stats(const mp_engine *e, mp_stats *o) {
    memset(o, 0, sizeof *o);
    o->prompt_tokens = e->prompt_tok;
    o->decode_tokens = e->decode_tok;
    o->prompt_seconds = e->prompt_s;
    o->decode_seconds = e->decode_s;
    o->budget_bytes = e->budget;
    o->floor_bytes = e->plan.floor_bytes;
    o->cache_capacity_bytes = e->cache_bytes;
    o->cache_capacity_experts = e->cache_experts;
    o->chunk = e->chunk;
    o->longest_pass = e->longest_pass;
    o->prefetches = mpm_prefetches(e->model);
    o->io_wait_seconds = mpm_io_wait_seconds(e->model) - e->io_wait0;
    if (e->ex) {
        mp_expert_stats es;
        mpe_stats(e->ex, &es);
        o->cache_hits = es.hits;
        o->cache_misses = es.misses;
        o->bytes_read = es.bytes_read;
        o->read_seconds = (double)es.read_ns * 1e-9;
        o->o_direct = es.o_direct_active;
        o->cache_peak_bytes = es.peak_used;
        o->expert_peak_bytes = es.peak_allocated;
        o->warm_reads = es.warm_reads;
        o->warming = es.warming;
    }
    double total = e->prompt_s + e->decode_s;
    o->compute_seconds = total > o->io_wait_seconds ? total - o->io_wait_seconds : 0.0;
}

void mp_reset_stats(mp_engine *e) {
    e->prompt_s = e->decode_s = 0;
    e->prompt_tok = e->decode_tok = 0;
    e->io_wait0 = mpm_io_wait_seconds(e->model);
    if (e->ex) mpe_reset_stats(e->ex);
}
