"""ctypes binding of the C engine (runtime/include/moepack.h).

    with Engine("model.moepack", threads=2) as e:
        logits = e.logits([1, 2, 3])              # np.float32 [3, vocab], teacher-forced
        for tok in e.generate([1, 2, 3], n=32):   # streams token ids
            ...
        e.stats()
"""

from __future__ import annotations

import ctypes as C
import functools
import math
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
from moepack.format.errors import FormatError
from moepack.runtime import _lib

from moepack.cliargs import INT32_MAX, UINT64_MAX
from moepack.sizes import parse_size

if TYPE_CHECKING:  # the converter is imported only when a config is planned
    from moepack.convert.settings import Settings

MP_OK, MP_EINVAL, MP_EFORMAT, MP_EIO, MP_ENOMEM, MP_EBUDGET = 0, -1, -2, -3, -4, -5
MP_EUNSUPPORTED, MP_ECORRUPT, MP_ECTX, MP_ENONFINITE, MP_ECANCELED = -6, -7, -8, -9, -10
POLICIES = {"lru": 0, "lfu": 1}
# mp_config.kernels (moepack.h MP_KERNELS_*); a path this CPU lacks fails at open
KERNELS = {"auto": 0, "scalar": 1, "avx2": 2, "avx512vbmi": 3, "avx512amx": 4}
# stable codes of refusals that are not the container's fault, for programs (`run --json`)
REFUSALS = {MP_EBUDGET: "budget_too_small", MP_ECTX: "context_too_long"}
# mp_config.kv (moepack.h MP_KV_*): KV cache entry type; None = the engine's default
KV_TYPES = {"f32": 1, "f16": 2}
MAX_SNAPSHOTS = 64  # moepack.h MP_MAX_SNAPSHOTS


def with_rates(d: dict) -> dict:
    """`d` (engine stats or a difference of two) with hit rate, tok/s and I/O-wait share added."""
    acc = d["cache_hits"] + d["cache_misses"]
    d["hit_rate"] = d["cache_hits"] / acc if acc else 0.0
    d["prompt_tok_s"] = d["prompt_tokens"] / d["prompt_seconds"] if d["prompt_seconds"] else 0.0
    d["decode_tok_s"] = d["decode_tokens"] / d["decode_seconds"] if d["decode_seconds"] else 0.0
    busy = d["prompt_seconds"] + d["decode_seconds"]
    d["io_wait_share"] = d["io_wait_seconds"] / busy if busy else 0.0
    return d


class EngineError(RuntimeError):
    """The engine refused or failed; `code` is the MP_E* value. When the container broke a
    format rule (MP_EFORMAT), `format_code` is its stable code (spec/FORMAT.md §11.1,
    moepack.format.errors.CODES) and `field` / `offset` say where (None where unknown).
    `refusal` is the stable code of a budget or context refusal (REFUSALS: "budget_too_small",
    "context_too_long"), and `max_ctx` the longest context that fits where the refusal knows it
    (None otherwise)."""

    def __init__(self, message: str, code: int = MP_EINVAL, format_code: str | None = None,
                 field: str | None = None, offset: int | None = None, *,
                 refusal: str | None = None, max_ctx: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.format_code, self.field, self.offset = format_code, field, offset
        self.refusal = refusal or REFUSALS.get(code)
        self.max_ctx = max_ctx

    @classmethod
    def from_format(cls, e: FormatError) -> EngineError:
        """The refusal the Python reader (the tokenizer reads the container with it) gave,
        as the C reader gives it: the same code, field, offset and message (FORMAT.md §11)."""
        return cls(str(e), MP_EFORMAT, e.code, e.field, e.offset)

    def with_code(self) -> str:
        """The message, then the format code in brackets when there is one (for error lines)."""
        return f"{self} [{self.format_code}]" if self.format_code else str(self)

    def as_dict(self) -> dict:
        """The error for machine-readable output (`run --json`, serve): `code` is the format
        code, else the refusal's code, else None."""
        return {"message": str(self), "engine_code": self.code,
                "code": self.format_code or self.refusal, "field": self.field,
                "offset": self.offset, "max_ctx": self.max_ctx}


class BudgetError(EngineError):
    """The memory budget is below the floor (the message says how much is needed)."""


class CorruptError(EngineError):
    """A record did not match its hash (verify_reads); the message names layer and expert."""


class NonFiniteError(EngineError):
    """The model produced a NaN or Inf logit (a NaN/Inf weight, or overflow); the message names
    the position. The sequence is as it was before the call."""


class Cancelled(EngineError):
    """Engine.cancel() stopped the call (within a layer's work); the sequence is as it was
    before the call."""


class OpenCancel:
    """Stops an `Engine(...)` still reading its trunk (tens of seconds for the biggest): give it as
    `Engine(cancel=)`, then `set()` it from another thread (the CLI's Ctrl-C); the constructor
    raises Cancelled. The flag is read only while the engine opens (calls: Engine.cancel)."""

    def __init__(self) -> None:
        self.flag = C.c_int(0)

    def set(self) -> None:
        self.flag.value = 1


class _Config(C.Structure):
    _fields_ = [("budget_bytes", C.c_uint64), ("threads", C.c_int), ("ctx", C.c_int),
                ("prefetch", C.c_int), ("o_direct", C.c_int), ("cache_policy", C.c_int),
                ("verify_reads", C.c_int), ("io_threads", C.c_int), ("cache_experts", C.c_int),
                ("kernels", C.c_int), ("chunk", C.c_int), ("kv", C.c_int),
                ("ram_bytes", C.c_uint64), ("snapshots", C.c_int),
                ("linear_chunk", C.c_int), ("warm", C.c_int), ("cancel", C.POINTER(C.c_int))]


class _Plan(C.Structure):
    _fields_ = [(n, C.c_uint64) for n in (
        "trunk_bytes", "kv_bytes", "scratch_bytes", "step_expert_bytes", "floor_bytes",
        "recommended_bytes", "default_bytes", "usable_ram_bytes", "expert_record_bytes")] + [
        ("ctx", C.c_int), ("moe_layers", C.c_int), ("top_k", C.c_int),
        ("experts_bytes", C.c_uint64), ("expert_count", C.c_uint64),
        ("chunk_token_bytes", C.c_uint64), ("max_chunk", C.c_int), ("state_bytes", C.c_uint64),
        ("kv", C.c_int), ("kv_token_bytes", C.c_uint64), ("max_pos", C.c_int), ("max_ctx", C.c_int),
        ("pinned_expert_bytes", C.c_uint64), ("default_cache_bytes", C.c_uint64),
        ("default_chunk", C.c_int), ("snapshot_bytes", C.c_uint64), ("held_chunk", C.c_int),
        ("budget_chunk", C.c_int), ("budget_cache_bytes", C.c_uint64)]


class _Stats(C.Structure):
    _fields_ = [("prompt_tokens", C.c_uint64), ("decode_tokens", C.c_uint64),
                ("prompt_seconds", C.c_double), ("decode_seconds", C.c_double),
                ("cache_hits", C.c_uint64), ("cache_misses", C.c_uint64),
                ("bytes_read", C.c_uint64), ("io_wait_seconds", C.c_double),
                ("read_seconds", C.c_double), ("compute_seconds", C.c_double),
                ("prefetches", C.c_uint64), ("o_direct", C.c_int),
                ("budget_bytes", C.c_uint64), ("floor_bytes", C.c_uint64),
                ("cache_capacity_bytes", C.c_uint64), ("cache_capacity_experts", C.c_int),
                ("chunk", C.c_int), ("cache_peak_bytes", C.c_uint64),
                ("expert_peak_bytes", C.c_uint64), ("warm_reads", C.c_uint64),
                ("warming", C.c_int), ("longest_pass", C.c_int)]


class _Sampler(C.Structure):
    _fields_ = [("temperature", C.c_float), ("top_k", C.c_int), ("top_p", C.c_float),
                ("seed", C.c_uint64)]


_P = C.c_void_p
_ERRLEN = 1024


def _library() -> C.CDLL:
    lib = _lib.load()
    if getattr(lib, "_mp_engine_typed", False):
        return lib
    lib.mp_config_default.argtypes = [C.POINTER(_Config)]
    lib.mp_plan.argtypes = [C.c_char_p, C.c_int, C.POINTER(_Plan), C.c_char_p, C.c_size_t]
    lib.mp_plan_config.argtypes = [C.c_char_p, C.POINTER(_Config), C.POINTER(_Plan), C.c_char_p,
                                   C.c_size_t]
    lib.mp_open.argtypes = [C.c_char_p, C.POINTER(_Config), C.POINTER(_P), C.c_char_p, C.c_size_t]
    lib.mp_close.argtypes = [_P]
    lib.mp_close.restype = None
    lib.mp_error.argtypes = [_P]
    lib.mp_error.restype = C.c_char_p
    for f in ("mp_vocab_size", "mp_context_size", "mp_position"):
        getattr(lib, f).argtypes = [_P]
    lib.mp_kernels.argtypes = [_P]
    lib.mp_kernels.restype = C.c_char_p
    lib.mp_kernels_available.argtypes = [C.c_int]
    lib.mp_kernels_available.restype = C.c_int
    lib.mp_threads.argtypes = [_P]
    lib.mp_threads.restype = C.c_int
    lib.mp_kv_type.argtypes = [_P]
    lib.mp_kv_type.restype = C.c_char_p
    lib.mp_reset.argtypes = [_P]
    lib.mp_reset.restype = None
    lib.mp_set_cancel.argtypes = [_P, C.c_int]
    lib.mp_set_cancel.restype = None
    lib.mp_truncate.argtypes = [_P, C.c_int]
    lib.mp_truncate.restype = C.c_int
    lib.mp_state_bytes.argtypes = [_P]
    lib.mp_state_bytes.restype = C.c_uint64
    lib.mp_state_save.argtypes = [_P, C.c_void_p, C.c_uint64]
    lib.mp_state_restore.argtypes = [_P, C.c_int, C.c_void_p, C.c_uint64]
    lib.mp_eval.argtypes = [_P, C.POINTER(C.c_int32), C.c_size_t, C.POINTER(C.c_float), C.c_int]
    lib.mp_sample.argtypes = [C.POINTER(C.c_float), C.c_int, C.POINTER(_Sampler),
                              C.POINTER(C.c_uint64)]
    lib.mp_sample.restype = C.c_int32
    lib.mp_rng_seed.argtypes = [C.c_uint64]
    lib.mp_rng_seed.restype = C.c_uint64
    lib.mp_get_stats.argtypes = [_P, C.POINTER(_Stats)]
    lib.mp_get_stats.restype = None
    lib.mp_reset_stats.argtypes = [_P]
    lib.mp_reset_stats.restype = None
    lib._mp_engine_typed = True
    return lib


@dataclass(frozen=True)
class Snapshot:
    """Engine.snapshot(): the sequence's first `tokens` and the linear-attention state after
    them (empty bytes for models without linear layers)."""

    tokens: tuple[int, ...]
    state: bytes


def _raise(code: int, msg: str, path: str | os.PathLike | None = None, *,
           refusal: str | None = None, max_ctx: int | None = None) -> None:
    """Raise the EngineError for `code`; a format refusal of the container at `path`, or a
    read that finds it damaged or shortened since open, also gets its stable code, field and
    offset; `refusal` and `max_ctx` as EngineError's."""
    cls = {MP_EBUDGET: BudgetError, MP_ECORRUPT: CorruptError,
           MP_ENONFINITE: NonFiniteError, MP_ECANCELED: Cancelled}.get(code, EngineError)
    where = None
    if path is not None and code == MP_EFORMAT:
        where = _lib.format_refusal(path, msg)
    elif path is not None and code in (MP_ECORRUPT, MP_EIO):  # a file damaged after open
        where = _lib.damage_refusal(path, code == MP_ECORRUPT, msg)
    extra = {"refusal": refusal, "max_ctx": max_ctx}
    if where is None:
        raise cls(msg or f"engine error {code}", code, **extra)
    raise cls(msg or f"engine error {code}", code, where.code, where.field, where.offset,
              **extra)


def _open_refusal(lib: C.CDLL, path: str | os.PathLike, cfg: _Config, rc: int) -> dict:
    """What mp_open's or mp_plan_config's refusal `rc` adds for programs, from the plan it
    refused by: below the floor, the longest context that fits; a ctx beyond the model's
    longest, context_too_long and the longest that fits ({} otherwise, and where no plan comes
    out)."""
    if rc not in (MP_EBUDGET, MP_EINVAL) or (rc == MP_EINVAL and cfg.ctx <= 0):
        return {}
    probe = _Config.from_buffer_copy(cfg)
    if rc == MP_EINVAL:
        probe.ctx = 0  # the default context always plans: it says the model's longest
    p, err = _Plan(), C.create_string_buffer(_ERRLEN)
    if lib.mp_plan_config(os.fsencode(path), C.byref(probe), C.byref(p), err, _ERRLEN):
        return {}
    if rc == MP_EBUDGET:  # mp_open: the budget given, else the default one, below the floor
        return {"max_ctx": p.max_ctx} if (cfg.budget_bytes or p.default_bytes) < p.floor_bytes \
            else {}
    if cfg.ctx > p.max_pos:
        return {"refusal": "context_too_long", "max_ctx": min(p.max_ctx, p.max_pos)}
    return {}


def available_kernels() -> list[str]:
    """The kernel paths this CPU (and OS) can run, "auto" first (KERNELS' names)."""
    lib = _library()
    return [k for k, v in KERNELS.items() if lib.mp_kernels_available(v)]


def parse_bytes(v: int | str | None) -> int:
    """"8G", "512MiB", "1.5gb" or an int -> bytes (0 for None: the engine's default). ValueError
    for what the engine's uint64 cannot hold (ctypes would silently wrap it), TypeError for
    another type."""
    if v is None:
        return 0
    if isinstance(v, float) and v.is_integer():
        v = int(v)  # 8e9
    if isinstance(v, bool) or not isinstance(v, (int, np.integer, str)):
        # 1.5 or True would have read as 1 byte
        raise TypeError(f"a size is a whole number of bytes or a string such as '8G', "
                        f"not {v!r}")
    n = int(v) if not isinstance(v, str) else parse_size(v)
    if not 0 <= n <= UINT64_MAX:
        raise ValueError(f"a size must be 0 to {UINT64_MAX} bytes, not {n}")
    return n


def _sampler(temperature: float, top_k: int, top_p: float, seed: int = 0) -> _Sampler:
    """Sampling settings for the C sampler; ValueError for what it would misread (a NaN
    temperature compares false and silently turns into greedy decoding)."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, not {temperature}")
    if not (math.isfinite(top_p) and 0 <= top_p <= 1):
        raise ValueError(f"top_p must be in [0, 1], not {top_p}")
    if not 0 <= top_k <= INT32_MAX:
        raise ValueError(f"top_k must be in [0, {INT32_MAX}], not {top_k}")
    return _Sampler(float(temperature), int(top_k), float(top_p), seed)


BIAS_LIMIT = 100.0   # |logit_bias| at most, OpenAI's range
PENALTY_LIMIT = 2.0  # |presence_penalty|, |frequency_penalty| at most


def _bounded(name: str, v: float, limit: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not (
            math.isfinite(v) and -limit <= v <= limit):
        raise ValueError(f"{name} must be a finite number from {-limit:g} to {limit:g}, "
                         f"not {v!r}")
    return float(v)


class LogitAdjust:
    """OpenAI's logit_bias, presence_penalty and frequency_penalty, for one completion: each
    step's logits get the bias added, and lose presence * (count > 0) + frequency * count for
    every token this completion has generated so far (`record`), the prompt's not counted.
    Plain float32 arithmetic on the logits the sampler then reads: the same request and seed
    give the same tokens."""

    def __init__(self, vocab: int, bias: dict[int, float] | None = None,
                 presence: float = 0.0, frequency: float = 0.0) -> None:
        bias = bias or {}
        for i, v in bias.items():
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab:
                raise ValueError(f"logit_bias: token id {i!r} is not in 0..{vocab - 1}")
            _bounded(f"logit_bias of token {i}", v, BIAS_LIMIT)
        self.bias_ids = np.fromiter(bias.keys(), np.int64, len(bias))
        self.bias = np.fromiter(bias.values(), np.float32, len(bias))
        self.presence = _bounded("presence_penalty", presence, PENALTY_LIMIT)
        self.frequency = _bounded("frequency_penalty", frequency, PENALTY_LIMIT)
        self.counts: dict[int, int] = {}

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """The adjusted logits: a copy, or `logits` itself when nothing applies."""
        penalize = bool(self.counts) and (self.presence != 0 or self.frequency != 0)
        if not self.bias_ids.size and not penalize:
            return logits
        out = np.array(logits, dtype=np.float32)
        out[self.bias_ids] += self.bias  # ids are unique (dict keys): no np.add.at needed
        if penalize:
            ids = np.fromiter(self.counts.keys(), np.int64, len(self.counts))
            n = np.fromiter(self.counts.values(), np.float32, len(self.counts))
            out[ids] -= np.float32(self.presence) + np.float32(self.frequency) * n
        return out

    def record(self, token: int) -> None:
        """A token this completion generated (sampled or forced): penalized from now on."""
        self.counts[token] = self.counts.get(token, 0) + 1


def _c_int(name: str, v: int | None, lo: int, hi: int = INT32_MAX, default: int = 0) -> int:
    """`v` (None: `default`) as the engine's C int: ValueError for a non-integer or what lies
    outside lo..hi (ctypes would silently wrap 2**32 + 64 to 64, or truncate 1.7)."""
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..{hi}, not {v!r}")
    return int(v)


def _kv_code(kv: str | None) -> int:
    if kv is not None and kv not in KV_TYPES:
        raise ValueError(f"kv must be one of {list(KV_TYPES)}, not {kv!r}")
    return KV_TYPES[kv] if kv else 0


def plan(path: str, ctx: int | None = None, kv: str | None = None,
         budget: int | str | None = None, ram: int | str | None = None,
         snapshots: int = 0, threads: int | None = None, linear_chunk: int = 0) -> dict:
    """Memory plan of a container (bytes): floor, recommended and default budgets; `kv` the KV
    entry type ("f32"/"f16", None = default, the plan says which as "kv"); max_ctx the longest
    context whose floor fits `budget` (None: usable RAM); `ram`: plan for a machine with this
    much usable RAM (None: this one); `snapshots`: recurrent-state snapshots kept beside the
    engine (Engine.snapshot; chat and serve keep one), counted in the floor as snapshot_bytes;
    `threads`: the compute threads (None: the usable cores), each with its task buffer in the
    scratch; `linear_chunk`: linear attention's sub-chunk (0: the default), as Engine's."""
    lib, p, err = _library(), _Plan(), C.create_string_buffer(_ERRLEN)
    cfg = _Config()
    lib.mp_config_default(C.byref(cfg))
    cfg.ctx, cfg.kv, cfg.budget_bytes = _c_int("ctx", ctx, 0), _kv_code(kv), parse_bytes(budget)
    cfg.ram_bytes = parse_bytes(ram)
    cfg.snapshots = _c_int("snapshots", snapshots, 0, MAX_SNAPSHOTS)
    cfg.threads = _c_int("threads", threads, 0)
    cfg.linear_chunk = _c_int("linear_chunk", linear_chunk, 0)
    rc = lib.mp_plan_config(os.fsencode(path), C.byref(cfg), C.byref(p), err, _ERRLEN)
    if rc:  # a ctx beyond the model's longest: context_too_long and max_ctx, as Engine's
        _raise(rc, err.value.decode(errors="replace"), path,
               **_open_refusal(lib, path, cfg, rc))
    d = {name: getattr(p, name) for name, _ in _Plan._fields_}
    d["kv"] = next(k for k, v in KV_TYPES.items() if v == d["kv"])
    return d


def plan_for_config(config: dict, settings: Settings | None = None, ctx: int | None = None,
                    kv: str | None = None, budget: int | str | None = None,
                    ram: int | str | None = None, threads: int | None = None) -> dict:
    """The memory plan of a model not converted yet, from its config.json alone: the converter
    plans the container it would write (`settings`: its codecs, None = the defaults), which is
    written without payloads (a sparse file of the planned size) and planned by the same engine
    code as any container. Adds container_bytes, the exact size `convert` would write."""
    from moepack.convert.plan import plan_for_config as layout_for_config
    from moepack.convert.plan import write_index_only
    from moepack.convert.settings import Settings

    layout = layout_for_config(config, settings or Settings())
    with tempfile.TemporaryDirectory(prefix="moepack-plan-") as d:
        path = os.path.join(d, "planned.moepack")
        write_index_only(layout, path)
        p = plan(path, ctx, kv, budget, ram, threads=threads)
    return {**p, "container_bytes": layout.file_size}


_F = TypeVar("_F", bound=Callable[..., Any])


def _locked(f: _F) -> _F:
    """`f` run holding the engine's lock: the C engine is not thread-safe (two threads' calls
    would interleave inside it), and close() must not free it under a running call."""
    @functools.wraps(f)
    def locked(self: Engine, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._sync()
            return f(self, *args, **kwargs)
    return cast(_F, locked)


class Engine:
    def __init__(self, path: str, budget: int | str | None = None, threads: int | None = None,
                 prefetch: bool = True, o_direct: bool | None = None,
                 cache_policy: str = "lfu", verify_reads: bool = False, ctx: int | None = None,
                 cache_experts: int | None = None, io_threads: int | None = None,
                 kernels: str = "auto", scalar_kernels: bool = False,
                 chunk: int | None = None, kv: str | None = None, snapshots: int = 0,
                 linear_chunk: int = 0, warm: bool = True,
                 cancel: OpenCancel | None = None) -> None:
        self._lock = threading.RLock()  # reentrant: logits() resets and feeds as one call
        self._busy = False  # an mp_eval is running (cancel() stops only that one)
        self._busy_lock = threading.Lock()  # not _lock, which the running call holds
        self._lib = _library()
        cfg = _Config()
        self._lib.mp_config_default(C.byref(cfg))
        cfg.budget_bytes = parse_bytes(budget)
        cfg.threads = _c_int("threads", threads, 0)
        cfg.ctx = _c_int("ctx", ctx, 0)
        cfg.prefetch = 1 if prefetch else 0
        cfg.o_direct = -1 if o_direct is None else int(bool(o_direct))
        if cache_policy not in POLICIES:
            raise ValueError(f"cache_policy must be one of {sorted(POLICIES)}")
        cfg.cache_policy = POLICIES[cache_policy]
        cfg.verify_reads = 1 if verify_reads else 0
        cfg.io_threads = _c_int("io_threads", io_threads, 0)
        cfg.cache_experts = _c_int("cache_experts", cache_experts, 0,
                                    default=-1)
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {list(KERNELS)}")
        cfg.kernels = KERNELS["scalar" if scalar_kernels else kernels]
        if not self._lib.mp_kernels_available(cfg.kernels):
            runs = ", ".join(k for k in available_kernels() if k != "auto")
            raise EngineError(f"kernels {kernels}: this CPU cannot run that path (it runs "
                              f"{runs})", MP_EUNSUPPORTED)
        cfg.chunk = _c_int("chunk", chunk, 1)  # moepack.h: a chunk longer than ctx runs ctx
        cfg.kv = _kv_code(kv)
        # state snapshots the caller keeps (PrefixReuse keeps this many): in the floor
        cfg.snapshots = _c_int("snapshots", snapshots, 0, MAX_SNAPSHOTS)
        # linear attention's sub-chunk (0: the engine's default; 1: token by token)
        cfg.linear_chunk = _c_int("linear_chunk", linear_chunk, 0)
        self.linear_chunk = int(linear_chunk)
        # with the cache holding every expert: read them all in the background from open
        cfg.warm = 1 if warm else 0
        if cancel is not None:
            cfg.cancel = C.pointer(cancel.flag)
        self._h = _P()
        self._seq: list[int] = []  # the tokens now in the sequence (snapshot / restore)
        self._version = 0  # bumped by every change of the sequence (a generate() checks it)
        self._pending: tuple[int, list[int]] | None = None  # a feed under way (_sync)
        err = C.create_string_buffer(_ERRLEN)
        rc = self._lib.mp_open(os.fsencode(path), C.byref(cfg), C.byref(self._h), err, _ERRLEN)
        if rc:
            self._h = None
            _raise(rc, err.value.decode(errors="replace"), path,
                   **_open_refusal(self._lib, path, cfg, rc))
        self.path = str(path)
        self.vocab_size = self._lib.mp_vocab_size(self._h)
        self.ctx = self._lib.mp_context_size(self._h)
        self.kv = self._lib.mp_kv_type(self._h).decode()  # the type in use: "f16" or "f32"
        self.snapshots = int(snapshots)

    # -- lifetime ---------------------------------------------------------------------------
    @_locked
    def close(self) -> None:
        if getattr(self, "_h", None):
            self._lib.mp_close(self._h)
            self._h = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_lock"):  # an __init__ that failed first thing has nothing to close
            self.close()

    # a copy would share the C handle, and closing both would free it twice
    def __reduce_ex__(self, protocol: object) -> object:
        raise TypeError("an Engine cannot be copied or pickled (it owns a C engine): open "
                        "another Engine(path) instead")

    def __copy__(self) -> Engine:
        return self.__reduce_ex__(0)  # type: ignore[return-value]

    def __deepcopy__(self, memo: dict) -> Engine:
        return self.__reduce_ex__(0)  # type: ignore[return-value]

    def _sync(self) -> None:
        """Book the tokens of a feed whose C call went through but whose bookkeeping an
        exception cut off: a KeyboardInterrupt lands when the call returns, before
        `sequence` is extended."""
        p, self._pending = getattr(self, "_pending", None), None  # None: __init__ failed early
        if p and self._h and len(self._seq) == p[0] and \
                self._lib.mp_position(self._h) == p[0] + len(p[1]):
            self._seq.extend(p[1])
            self._version += 1

    def _handle(self) -> _P:
        if not self._h:
            raise EngineError("engine is closed")
        return self._h

    # -- evaluation ---------------------------------------------------------------------------
    @property
    @_locked
    def position(self) -> int:
        return self._lib.mp_position(self._handle())

    @property
    @_locked
    def kernels(self) -> str:
        """Kernels this engine computes with: "avx512amx", "avx512vbmi", "avx2" or "scalar" (its
        own choice, made at open from `kernels` and the CPU; other engines in the process do not
        change it; every path gives the same bits)."""
        return self._lib.mp_kernels(self._handle()).decode()

    @property
    @_locked
    def threads(self) -> int:
        """Compute threads: `threads` as given, else the usable cores (moepack.sysinfo's rule,
        applied in C)."""
        return self._lib.mp_threads(self._handle())

    @_locked
    def reset(self) -> None:
        self._lib.mp_reset(self._handle())
        self._seq.clear()
        self._version += 1

    @_locked
    def truncate(self, n: int) -> None:
        """Keep the first n tokens in the KV cache (no-op when n >= position). Models with
        linear-attention layers can only go back to 0 (EngineError otherwise)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"truncate needs an integer n, not {n!r}")
        if n < 0:
            raise EngineError("truncate needs n >= 0", MP_EINVAL)
        # ctypes would wrap an n beyond a C int (2**40 -> 0): past the position is a no-op
        rc = self._lib.mp_truncate(self._handle(), int(min(n, INT32_MAX)))
        if rc:
            _raise(rc, self._lib.mp_error(self._h).decode(errors="replace"), self.path)
        del self._seq[n:]
        self._version += 1

    @property
    @_locked
    def sequence(self) -> tuple[int, ...]:
        """The tokens now in the sequence."""
        return tuple(self._seq)

    @property
    @_locked
    def state_bytes(self) -> int:
        """Bytes of the linear-attention state (0: the KV cache is all there is, truncate
        reaches any prefix)."""
        return int(self._lib.mp_state_bytes(self._handle()))

    @_locked
    def snapshot(self) -> Snapshot:
        """The sequence so far and its linear-attention state, for `restore` (a recurrent state
        cannot be truncated back like the KV cache: chat keeps one per turn boundary)."""
        n = self._lib.mp_state_bytes(self._handle())
        buf = C.create_string_buffer(n)
        rc = self._lib.mp_state_save(self._h, buf, n)
        if rc:
            _raise(rc, self._lib.mp_error(self._h).decode(errors="replace"), self.path)
        return Snapshot(tuple(self._seq), buf.raw[:n])

    @_locked
    def restore(self, snap: Snapshot) -> None:
        """Go back to `snap`, taken earlier in this sequence: the tokens after it are dropped and
        the next feed goes on from its state.  EngineError if the sequence no longer starts with
        snap's tokens (a reset or truncation below it since)."""
        k = len(snap.tokens)
        if tuple(self._seq[:k]) != snap.tokens:
            raise EngineError(f"snapshot of {k} tokens does not match the sequence's first "
                              f"{min(k, len(self._seq))}", MP_EINVAL)
        rc = self._lib.mp_state_restore(self._handle(), k, snap.state, len(snap.state))
        if rc:
            _raise(rc, self._lib.mp_error(self._h).decode(errors="replace"), self.path)
        del self._seq[k:]
        self._version += 1

    def plan(self, ctx: int | None = None) -> dict:
        return plan(self.path, ctx or self.ctx, self.kv, snapshots=self.snapshots,
                    threads=self.threads, linear_chunk=self.linear_chunk)

    @_locked
    def _eval(self, tokens: Sequence[int], out: np.ndarray | None, all_pos: bool,
              cancelled: Callable[[], bool] | None = None) -> None:
        bad = EngineError(f"token ids must be in 0..{self.vocab_size - 1}", MP_EINVAL)
        try:  # no dtype: a float id must be refused, not truncated to an integer
            toks = np.asarray(tokens) if len(tokens) else np.zeros(0, np.int64)
        except (OverflowError, ValueError, TypeError):
            raise bad from None
        if toks.ndim != 1 or toks.dtype.kind not in "iu":  # floats, bools, ids beyond uint64
            raise EngineError(f"token ids must be a list of integers in 0..{self.vocab_size - 1}"
                              f", not {toks.dtype} of shape {list(toks.shape)}", MP_EINVAL)
        if toks.size and (toks.min() < 0 or toks.max() >= self.vocab_size):
            raise bad
        arr = np.ascontiguousarray(toks.astype(np.int32))
        ptr = out.ctypes.data_as(C.POINTER(C.c_float)) if out is not None else None
        h = self._handle()
        self._pending = (len(self._seq), arr.tolist())
        with self._busy_lock:
            self._busy = True
            if cancelled is not None and cancelled():  # it came before the call: not lost
                self._lib.mp_set_cancel(h, 1)
        try:
            rc = self._lib.mp_eval(h, arr.ctypes.data_as(C.POINTER(C.c_int32)), arr.size, ptr,
                                   1 if all_pos else 0)
        finally:
            with self._busy_lock:  # a cancel that came too late must not stop the next call
                self._busy = False
                self._lib.mp_set_cancel(h, 0)
        if rc:
            self._pending = None
            _raise(rc, self._lib.mp_error(self._h).decode(errors="replace"), self.path)
        self._seq.extend(self._pending[1])
        self._pending = None
        self._version += 1

    def cancel(self) -> bool:
        """Stop the feed, logits or generate step another thread is running in this engine:
        it raises Cancelled at its next layer (or group of expert reads), the sequence as before
        it. True when a call was running; when none is, nothing happens (a later call runs).
        Takes no lock the running call holds, so it returns at once."""
        with self._busy_lock:
            if not (self._busy and self._h):
                return False
            self._lib.mp_set_cancel(self._h, 1)
            return True

    @_locked
    def logits(self, tokens: Sequence[int], *, reset: bool = True,
               out: np.ndarray | None = None) -> np.ndarray:
        """Teacher-forced logits for every position: float32 [len(tokens), vocab], into `out`
        when given (a writeable C-contiguous float32 array of that shape, e.g. a np.memmap of
        the output file: a long sequence's logits need not fit in memory).

        On failure (EngineError) nothing is appended: with reset=False the sequence is as before
        the call; with reset=True it is empty."""
        shape = (len(tokens), self.vocab_size)
        if out is None:
            out = np.zeros(shape, dtype=np.float32)
        elif not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == shape
                  and out.flags.c_contiguous and out.flags.writeable):
            raise ValueError(f"logits: out must be a writeable C-contiguous float32 array of "
                             f"shape {list(shape)}")
        if reset:
            self.reset()
        self._eval(tokens, out, True)
        return out

    @_locked
    def feed(self, tokens: Sequence[int], *,
             cancelled: Callable[[], bool] | None = None) -> np.ndarray:
        """Append tokens to the sequence (KV cache kept); returns the last position's logits.

        Several tokens take the prefill products, one token the decode products (moepack.h
        mp_eval, docs/RUNTIME.md "Compute"). All or nothing: on failure (EngineError) the
        sequence is as it was before the call. `cancelled` (a threading.Event's `is_set`) is asked
        as the call starts, so that a cancel made just before it (whose Engine.cancel() found no
        call running) still stops it."""
        if len(tokens) == 0:  # there would be no last position: the logits would be all zero
            raise EngineError("feed needs at least one token", MP_EINVAL)
        out = np.zeros(self.vocab_size, dtype=np.float32)
        self._eval(tokens, out, False, cancelled)
        return out

    def sample(self, logits: np.ndarray, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, rng: C.c_uint64 | None = None) -> int:
        s = _sampler(temperature, top_k, top_p)
        lg = np.ascontiguousarray(logits, dtype=np.float32)
        return int(self._lib.mp_sample(lg.ctypes.data_as(C.POINTER(C.c_float)), lg.size,
                                       C.byref(s), C.byref(rng) if rng is not None else None))

    def generate(self, prompt: Sequence[int], n: int = 32, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0, reset: bool = True,
                 stop: Sequence[int] | None = None, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0,
                 logit_bias: dict[int, float] | None = None) -> Iterator[int]:
        """Stream up to n new tokens after prompt (stops after a token in `stop`); the
        penalties and bias as OpenAI applies them (LogitAdjust)."""
        _sampler(temperature, top_k, top_p)  # refuse bad settings before the prompt's work
        adjust = LogitAdjust(self.vocab_size, logit_bias, presence_penalty, frequency_penalty)
        rng = C.c_uint64(self._lib.mp_rng_seed(int(seed) & (2**64 - 1)))
        with self._lock:  # not held across yield: other threads run between tokens
            if reset:
                self.reset()
            logits = self.feed(prompt)
            mine = self._version
        stop_set = set(stop or ())
        for i in range(n):
            tok = self.sample(adjust.apply(logits), temperature, top_k, top_p, rng)
            adjust.record(tok)
            yield tok
            if tok in stop_set or i + 1 == n:
                return
            with self._lock:
                # going on from a sequence another call changed would silently give other
                # tokens
                if self._version != mine:
                    raise EngineError("generate: the sequence changed since this generate() "
                                      "last fed it (a reset, feed, truncate, restore or another "
                                      "generate on this engine); start a new generate()",
                                      MP_EINVAL)
                logits = self.feed([tok])
                mine = self._version

    # -- statistics ---------------------------------------------------------------------------
    @_locked
    def stats(self) -> dict:
        s = _Stats()
        self._lib.mp_get_stats(self._handle(), C.byref(s))
        d = {name: getattr(s, name) for name, _ in _Stats._fields_}
        d["o_direct"] = bool(d["o_direct"])
        d["warming"] = bool(d["warming"])
        d["kernels"] = self.kernels
        d["kv"] = self.kv
        return with_rates(d)

    @_locked
    def reset_stats(self) -> None:
        self._lib.mp_reset_stats(self._handle())
