/* Public C API of the moepack engine.
 *
 * Open a container with a config, plan memory, feed tokens and get logits (or sample tokens),
 * read stats, close.  One engine = one sequence (one KV cache); not thread-safe per engine
 * (the engine runs its own worker threads internally).
 */
#ifndef MOEPACK_H
#define MOEPACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MP_API __attribute__((visibility("default")))
#else
#define MP_API
#endif

/* Error codes shared by every part of the engine (negative = failure). */
enum {
    MP_OK = 0,
    MP_EINVAL = -1,       /* bad argument */
    MP_EFORMAT = -2,      /* container violates spec/FORMAT.md */
    MP_EIO = -3,          /* read/open failed */
    MP_ENOMEM = -4,       /* allocation failed */
    MP_EBUDGET = -5,      /* memory budget below the floor */
    MP_EUNSUPPORTED = -6, /* architecture/codec this engine does not run */
    MP_ECORRUPT = -7,     /* data does not match its hash (verify_reads) */
    MP_ECTX = -8,         /* context (KV cache) full */
    MP_ENONFINITE = -9,   /* the model produced NaN or Inf logits (a NaN/Inf weight, overflow) */
    MP_ECANCELED = -10    /* mp_set_cancel stopped the call */
};

/* Expert cache replacement policy. */
enum { MP_CACHE_LRU = 0, MP_CACHE_LFU = 1 };

typedef struct mp_engine mp_engine;

typedef struct mp_config {
    uint64_t budget_bytes; /* total memory budget; 0 = default from usable RAM */
    int threads;           /* compute threads; 0 = the usable cores: the CPU affinity mask,
                              lowered to the cgroup CPU quota (at most 256) */
    int ctx;               /* max tokens in the KV cache; 0 = min(max_position_embeddings, 4096) */
    int prefetch;          /* 1 = router look-ahead prefetch of the next layer's experts */
    int o_direct;          /* -1 = probe and use if possible, 0 = off, 1 = require */
    int cache_policy;      /* MP_CACHE_LRU or MP_CACHE_LFU */
    int verify_reads;      /* 1 = check each expert record's BLAKE3 on read */
    int io_threads;        /* reader threads; 0 = default */
    int cache_experts;     /* -1 = size the cache from the budget; >= 0 = at most this many */
    int kernels;           /* MP_KERNELS_*: compute path for this engine only (results are
                              bit-identical on every path); 0 = the best the CPU runs */
    int chunk;             /* prompt tokens per forward pass (1..ctx); 0 = from the memory plan:
                              16 plus what the budget above the floor pays for after all experts,
                              or at least half of it (up to min(512, ctx)) held between calls,
                              and a longer prompt's passes borrow the expert cache (mp_eval) */
    int kv;                /* MP_KV_*: KV cache entry type; 0 = the default (MP_KV_DEFAULT) */
    uint64_t ram_bytes;    /* plan against this much usable RAM (another machine's); 0 = this
                              machine's (physical, cgroup limits, available) */
    int snapshots;         /* recurrent-state snapshots the caller keeps (mp_state_save buffers,
                              plan state_bytes each; chat and serve keep 1): counted in the floor
                              and taken from the cache; 0..MP_MAX_SNAPSHOTS */
    int linear_chunk;      /* linear-attention layers: positions per sub-chunk of the chunkwise
                              delta rule, 1..MP_MAX_LINEAR_CHUNK (1 = token by token); 0 = 16
                              (docs/RUNTIME.md, "Linear attention": what the results depend on) */
    int warm;              /* 1 = when the expert cache holds every record, read them all in the
                              background from open (file order, never evicting, half the
                              reader threads at most); 0 = read records when used */
    const int *cancel;     /* NULL, or a flag another thread (or a signal handler) may set while
                              mp_open runs: loading stops before its next trunk tensor with
                              MP_ECANCELED (read only during mp_open; calls: mp_set_cancel) */
} mp_config;
#define MP_MAX_LINEAR_CHUNK 64
#define MP_MAX_SNAPSHOTS 64

/* mp_config.kv: how the KV cache (GQA keys/values, MLA latent + rope part) stores entries.  f16
 * halves the KV bytes per token; logits stay identical for any thread count and chunking with
 * either (docs/RUNTIME.md, "KV cache"). */
enum { MP_KV_F32 = 1, MP_KV_F16 = 2 };
#define MP_KV_DEFAULT MP_KV_F16

/* mp_config.kernels; mp_kernels() names the path an engine uses. */
enum {
    MP_KERNELS_AUTO = 0,        /* the last of these the CPU (and OS) can run */
    MP_KERNELS_SCALAR = 1,      /* portable C (defines the numerics) */
    MP_KERNELS_AVX2 = 2,        /* AVX2 + FMA + F16C + BMI2 */
    MP_KERNELS_AVX512VBMI = 3,  /* AVX-512 F/BW/VL/VBMI/VNNI (+ the AVX2 trunk kernels) */
    MP_KERNELS_AVX512AMX = 4    /* avx512vbmi + AMX-TILE/INT8 for prompts' expert products */
};

/* Memory plan for a container and context length (all bytes). */
typedef struct mp_plan_info {
    uint64_t trunk_bytes;      /* resident weights (trunk + codebooks) */
    uint64_t kv_bytes;         /* KV / latent cache for ctx tokens */
    uint64_t scratch_bytes;    /* activations, lookup tables, I/O buffers */
    uint64_t step_expert_bytes;/* one token's routed experts over all MoE layers (read per token
                                  when the cache is cold) */
    uint64_t floor_bytes;      /* trunk + kv + scratch + pinned experts (pinned_expert_bytes)
                                  + the caller's state snapshots (snapshot_bytes) */
    uint64_t recommended_bytes;/* floor + a cache of 4 tokens' routed experts (4 x step) */
    uint64_t default_bytes;    /* what budget_bytes = 0 picks on this machine */
    uint64_t usable_ram_bytes; /* min(physical RAM, cgroup limits) */
    uint64_t expert_record_bytes; /* largest record stride */
    int ctx;
    int moe_layers;
    int top_k;
    uint64_t experts_bytes;    /* all routed-expert records (what streams from disk) */
    uint64_t expert_count;     /* routed experts over all MoE layers */
    uint64_t chunk_token_bytes;/* scratch per prompt-chunk token beyond the floor's 16 */
    int max_chunk;             /* the longest pass of a prompt (ctx; above the held chunk its
                                  buffers are borrowed from the expert cache) */
    uint64_t state_bytes;      /* linear-attention conv + recurrent state (part of kv_bytes) */
    int kv;                    /* MP_KV_F32 or MP_KV_F16: the entry type planned */
    uint64_t kv_token_bytes;   /* KV cache bytes per token of context (all layers) */
    int max_pos;               /* the model's longest context (max_position_embeddings) */
    int max_ctx;               /* the longest context whose floor fits the budget (given, or
                                  usable RAM), at most max_pos; 0 = not even one token */
    uint64_t pinned_expert_bytes; /* expert records held beyond the cache at most: one acquire
                                  group (top_k x largest stride), + recycled buffers as large
                                  when the MoE banks' strides differ */
    uint64_t default_cache_bytes; /* the expert cache the default budget leaves (after the floor
                                  and its prompt chunk's scratch); 0 when there is no default */
    int default_chunk;         /* the prompt chunk the default budget gets */
    uint64_t snapshot_bytes;   /* mp_config.snapshots x state_bytes: state snapshots the caller
                                  keeps, part of floor_bytes (0 without linear attention) */
    int held_chunk;            /* the longest chunk a budget keeps between calls (min(512, ctx)) */
    int budget_chunk;          /* with mp_config.budget_bytes: the chunk that budget gets, and */
    uint64_t budget_cache_bytes; /* its expert cache (0 below the floor or without a budget) */
} mp_plan_info;

typedef struct mp_stats {
    uint64_t prompt_tokens, decode_tokens;
    double prompt_seconds, decode_seconds;
    uint64_t cache_hits, cache_misses, bytes_read;
    double io_wait_seconds; /* compute thread blocked waiting for expert reads */
    double read_seconds;    /* time reader threads spent in pread */
    double compute_seconds;
    uint64_t prefetches;
    int o_direct;           /* 1 if expert reads use O_DIRECT */
    uint64_t budget_bytes, floor_bytes, cache_capacity_bytes;
    int cache_capacity_experts;
    int chunk;              /* prompt tokens per forward pass (mp_config.chunk or the plan's) */
    uint64_t cache_peak_bytes;   /* most bytes of cached records at once (<= cache capacity) */
    uint64_t expert_peak_bytes;  /* most bytes of expert record buffers allocated at once:
                                    cache + pinned beyond it + recycled (<= capacity + pinned) */
    uint64_t warm_reads;         /* warm-up reads issued (mp_config.warm; included in bytes_read) */
    int warming;                 /* 1 while the warm-up has records left to read or in flight */
    int longest_pass;            /* most prompt tokens in one forward pass since open: above
                                    `chunk` when a long prompt borrowed the expert cache */
} mp_stats;

typedef struct mp_sampler {
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0: off */
    float top_p;       /* >= 1 or <= 0: off */
    uint64_t seed;
} mp_sampler;

/* Version of the engine library, "MAJOR.MINOR.PATCH". */
MP_API const char *mp_version(void);

MP_API void mp_config_default(mp_config *cfg);

/* Memory plan without opening an engine (the default config with this ctx).  err gets a message
 * on failure. */
MP_API int mp_plan(const char *path, int ctx, mp_plan_info *out, char *err, size_t errlen);
/* The same for a config: its ctx, kv and budget_bytes (max_ctx is planned against it). */
MP_API int mp_plan_config(const char *path, const mp_config *cfg, mp_plan_info *out, char *err,
                          size_t errlen);

/* Open a container.  Refuses with MP_EBUDGET (and a message giving the floor) when the budget
 * is below the floor. */
MP_API int mp_open(const char *path, const mp_config *cfg, mp_engine **out, char *err,
                   size_t errlen);
MP_API void mp_close(mp_engine *e);

/* Last error message of this engine ("" if none). */
MP_API const char *mp_error(const mp_engine *e);

MP_API int mp_vocab_size(const mp_engine *e);
MP_API int mp_context_size(const mp_engine *e);
MP_API int mp_position(const mp_engine *e); /* tokens currently in the KV cache */
/* Kernels this engine computes with: "avx2" or "scalar" (chosen per engine at mp_open). */
MP_API const char *mp_kernels(const mp_engine *e);
/* 1 when this CPU (and OS) can run mp_config.kernels = kernels (MP_KERNELS_AUTO: always), else
 * 0: mp_open would refuse it with MP_EUNSUPPORTED. */
MP_API int mp_kernels_available(int kernels);
/* Compute threads this engine runs (mp_config.threads, or the usable cores when 0). */
MP_API int mp_threads(const mp_engine *e);
/* KV cache entry type this engine stores: "f16" or "f32" (mp_config.kv or the default). */
MP_API const char *mp_kv_type(const mp_engine *e);

/* Drop the KV cache (new sequence). */
MP_API void mp_reset(mp_engine *e);
/* Keep the first n tokens of the sequence (no-op when n >= position): a later mp_eval goes on
 * from there, so a conversation that shares a prefix with the cached one reuses its KV.
 * Models with linear-attention layers (plan state_bytes > 0) can only go back to 0: other n
 * return MP_EUNSUPPORTED and leave the sequence as it was. */
MP_API int mp_truncate(mp_engine *e, int n);
/* Snapshots of the linear-attention state (conv + recurrent; 0 bytes for models without linear
 * layers), which truncation cannot bring back: mp_state_save copies the state after the tokens
 * now in the sequence (len = mp_state_bytes); mp_state_restore puts one back and sets the position
 * to pos, the position it was saved at (0 <= pos <= the current position).  The caller promises
 * that the first pos tokens of the sequence are still the ones the snapshot followed (the KV
 * cache of full-attention layers keeps those positions).  A failed mp_eval never changes the
 * state (nor the position). */
MP_API uint64_t mp_state_bytes(const mp_engine *e);
MP_API int mp_state_save(mp_engine *e, void *buf, uint64_t len);
MP_API int mp_state_restore(mp_engine *e, int pos, const void *buf, uint64_t len);

/* Append n tokens to the sequence.  logits: NULL, or room for vocab floats (all_positions = 0:
 * logits of the last token) or n*vocab floats (all_positions = 1).  All or nothing: on failure
 * (e.g. MP_ECORRUPT in a later chunk of a long prompt) the position is what it was before the call
 * and the sequence can go on as if the call had not been made; logits are then undefined.
 * Logits with a NaN or Inf fail with MP_ENONFINITE: sampling them would print garbage.
 * A call of n >= 2 tokens computes them with the prefill products (spec/CODECS.md §3.6), so they
 * are the same bits however a prompt is split into calls of >= 2 tokens; a call of one token
 * (a decode step) with the decode products, within the bound docs/RUNTIME.md states. */
MP_API int mp_eval(mp_engine *e, const int32_t *tokens, size_t n, float *logits,
                   int all_positions);

/* Stop mp_eval (and mp_generate) from another thread or a signal handler: while the flag is set,
 * a running call stops at its next layer (or expert read group) and one that starts stops at
 * once, both with MP_ECANCELED and, as every failed mp_eval, the sequence as before the call.
 * The flag stays until the caller clears it (cancel 0); a call that ended before seeing it is
 * not undone. Async-signal-safe: one atomic store. */
MP_API void mp_set_cancel(mp_engine *e, int cancel);

/* Pick a token from logits (vocab floats; not modified).  *rng holds the RNG state; seed it with
 * mp_rng_seed. */
MP_API int32_t mp_sample(const float *logits, int vocab, const mp_sampler *s, uint64_t *rng);
MP_API uint64_t mp_rng_seed(uint64_t seed);

/* Generate up to n_new tokens after the prompt; calls cb for each (return non-zero to stop).
 * Stops after an EOS token (which is passed to cb).  Returns the number generated or < 0; on
 * failure the sequence holds the tokens evaluated before the failing mp_eval (see mp_eval). */
typedef int (*mp_token_cb)(int32_t token, void *user);
MP_API int mp_generate(mp_engine *e, const int32_t *prompt, size_t n_prompt, int n_new,
                       const mp_sampler *s, mp_token_cb cb, void *user);

MP_API void mp_get_stats(const mp_engine *e, mp_stats *out);
MP_API void mp_reset_stats(mp_engine *e);

#ifdef __cplusplus
}
#endif
#endif
