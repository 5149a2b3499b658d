"""Subcommands of `moepack` provided by moepack.runtime: `plan`, `run`, `chat`, `eval`.

Every numeric option has a range checked at parse time (exit 2); failures after that are one
`error:` line (with --json, the error object on stdout) and exit 1 (docs/RUNTIME.md, "Exit
codes")."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console

from moepack.cliargs import (
    INT32_MAX,
    MAX_THREADS,
    UINT64_MAX,
    choice,
    fail,
    file_problem,
    finite,
    json_error,
    nucleus,
    one_line,
    size_option,
    terminal_text,
    token_ids,
    usage,
    utf8_problem,
    utf8_text,
)
from moepack.sizes import SIZE_HELP, format_size

if TYPE_CHECKING:  # imported lazily at run time: `moepack --help` stays fast
    import numpy as np
    from moepack.runtime.engine import EngineError
    from moepack.runtime.tokenizer import Tokenizer

_err = Console(stderr=True, soft_wrap=True, highlight=False)

FileArg = Annotated[Path, typer.Argument(help="A .moepack container.")]
BudgetOpt = Annotated[str | None, typer.Option(
    "--budget", callback=size_option,
    help=f"Total memory budget (e.g. 8G, 512MiB). Default: from usable RAM. {SIZE_HELP}")]
ThreadsOpt = Annotated[int | None, typer.Option(
    "--threads", min=1, max=MAX_THREADS,
    help="Compute threads (default: the usable cores: CPU affinity, cgroup CPU quota).")]
CtxOpt = Annotated[int | None, typer.Option(
    "--ctx", min=1, max=INT32_MAX, help="Context length (KV cache size).")]
_kv_type = choice("f32", "f16")
KvOpt = Annotated[str | None, typer.Option(
    "--kv", callback=lambda v: v if v is None else _kv_type(v),
    help="KV cache entries: f16 (default: half the bytes) or f32.")]
# engine.KERNELS' names (not imported here: `moepack --help` stays fast)
KERNEL_PATHS = ("auto", "scalar", "avx2", "avx512vbmi", "avx512amx")
KernelsOpt = Annotated[str, typer.Option(
    "--kernels", callback=choice(*KERNEL_PATHS),
    help="Compute path: auto (the best this CPU runs), scalar, avx2, avx512vbmi or avx512amx; "
         "every path gives the same bits. A path this CPU lacks is refused.")]
TempOpt = Annotated[float, typer.Option(
    "--temp", min=0.0, max=100.0, callback=finite, help="Temperature (0 = greedy).")]
TopPOpt = Annotated[float, typer.Option(
    "--top-p", min=0.0, max=1.0, callback=nucleus, help="Nucleus mass, above 0 (1 = off).")]
TopKOpt = Annotated[int, typer.Option(
    "--top-k", min=0, max=INT32_MAX, help="Keep the k most likely (0 = off).")]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, max=UINT64_MAX, help="Sampling seed.")]


def _count(n: int, word: str) -> str:
    """`1 token`, `2 tokens`."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fail(message: str, as_json: bool) -> NoReturn:
    """Exit 1: with --json the error object on stdout (as an EngineError's), else the line."""
    if as_json:
        json_error(message)
    fail(message)


def _require_file(file: Path, as_json: bool = False) -> None:
    """Refuse a missing path, a folder, a FIFO or a device before anything opens it (opening a
    FIFO would block forever)."""
    problem = file_problem(file)
    if problem:
        _fail(problem, as_json)


def _warn_threads(threads: int | None) -> None:
    """More compute threads than usable cores take turns on them at every barrier: decode on
    the demo model fell from about 2400 to 100 tok/s. Allowed (a benchmark may want it), said."""
    from moepack.sysinfo import usable_cores

    cores = usable_cores()
    if threads is not None and threads > cores:
        _err.print(f"[yellow]warning:[/yellow] --threads {threads} is more than the "
                   f"{_count(cores, 'usable core')}: threads wait for each other at every "
                   "step, which can make decode many times slower")


def _check_budget(file: Path, budget: str | None, ctx: int | None, kv: str | None) -> None:
    """Warn when a user budget exceeds usable RAM (the engine itself refuses below the floor)."""
    if not budget:
        return
    from moepack.runtime.engine import parse_bytes, plan

    p = plan(str(file), ctx, kv)
    b = parse_bytes(budget)
    if b > p["usable_ram_bytes"]:
        _err.print(f"[yellow]warning:[/yellow] budget {format_size(b)} is above usable RAM "
                   f"{format_size(p['usable_ram_bytes'])}: the OS will page the expert cache and "
                   "cache hits turn into disk reads (a peer measured 8x slower decode)")


def _open(file: Path, *, budget, threads, ctx, kv=None, prefetch=True, o_direct=None,
          cache_policy="lfu", verify_reads=False, as_json=False, snapshots=0, warm=True,
          kernels="auto"):
    from moepack.runtime.engine import Engine, EngineError

    _warn_threads(threads)
    try:
        _check_budget(file, budget, ctx, kv)
        return Engine(str(file), budget=budget, threads=threads, ctx=ctx, kv=kv,
                      prefetch=prefetch, o_direct=o_direct, cache_policy=cache_policy,
                      verify_reads=verify_reads, snapshots=snapshots, warm=warm,
                      kernels=kernels)
    except EngineError as e:
        _engine_fail(e, as_json, f"{file}: ")
    except (ValueError, OSError) as e:
        _fail(f"{file}: {e}", as_json)


def _engine_fail(e: EngineError, as_json: bool, where: str = "") -> NoReturn:
    """Exit 1 for an EngineError: with --json one `{"error": {...}}` object on stdout (its
    stable format code, field and offset for a program to act on), else the error line."""
    if as_json:
        json_error(where + str(e), **{k: v for k, v in e.as_dict().items() if k != "message"})
    fail(where + e.with_code())


class _Interrupt:
    """Ctrl-C while generating: a flag the token loop reads, so that the reply stops between
    two tokens with the engine's sequence intact (a KeyboardInterrupt could land between an
    engine call and its bookkeeping). The engine's call itself runs to its end either way:
    Python handles a signal only once the C call returns."""

    def __init__(self) -> None:
        self.hit = False
        self._old = None

    def _on(self, signum: int, frame: object) -> None:
        self.hit = True

    def __enter__(self) -> _Interrupt:
        if threading.current_thread() is threading.main_thread():  # signal.signal's rule
            self._old = signal.signal(signal.SIGINT, self._on)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def stats_line(s: dict) -> str:
    """The one-line summary printed after `run`."""
    return (f"prompt {s['prompt_tokens']} tok @ {s['prompt_tok_s']:.2f} tok/s | "
            f"decode {s['decode_tokens']} tok @ {s['decode_tok_s']:.2f} tok/s | "
            f"cache hits {100 * s['hit_rate']:.1f}% | read {format_size(s['bytes_read'])} | "
            f"I/O wait {100 * s['io_wait_share']:.1f}% | "
            f"O_DIRECT {'on' if s['o_direct'] else 'off'}")


PlanFileArg = Annotated[Path | None, typer.Argument(
    help="A .moepack container (or --config for a model not converted yet).")]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", help="Plan a model not converted yet from its config.json: the container that "
    "`convert` would write with these codecs, planned by the same engine code (no weights).")]
RamOpt = Annotated[str | None, typer.Option(
    "--ram", callback=size_option,
    help=f"Plan for a machine with this much usable RAM (default: this one). {SIZE_HELP}")]
ExpertCodecOpt = Annotated[str | None, typer.Option(
    "--expert-codec", help="With --config: expert codec preset (as convert; default rvq3-l).")]
TrunkCodecOpt = Annotated[str | None, typer.Option(
    "--trunk-codec", help="With --config: codec of all quantised trunk classes (as convert).")]
CodecOpt = Annotated[list[str] | None, typer.Option(
    "--codec", help="With --config: trunk codec of one class, CLASS=CODEC (repeatable).")]
_MAX_CONFIG = 16 << 20  # a config.json is a few KB; refuse anything that could exhaust memory


def _config_plan(config: Path, codecs: tuple[str | None, str | None, list[str]],
                 ctx: int | None, kv: str | None, b: int | None, ram: str | None,
                 threads: int | None, as_json: bool) -> dict:
    """plan_for_config on a config.json file; one error line for anything wrong with it."""
    from moepack.convert.cli import _settings
    from moepack.convert.errors import ConvertError
    from moepack.format.errors import FormatError
    from moepack.runtime.engine import EngineError, plan_for_config

    problem = file_problem(config, "config")
    if problem:
        _fail(problem, as_json)
    try:
        if config.stat().st_size > _MAX_CONFIG:
            _fail(f"{config}: {config.stat().st_size} bytes is not a config.json", as_json)
        doc = json.loads(config.read_bytes())
        if not isinstance(doc, dict):
            _fail(f"{config}: a config.json holds a JSON object, not {type(doc).__name__}",
                  as_json)
        expert, trunk, per_class = codecs
        settings = _settings(expert, trunk, per_class, 0, 4096, None, None)
        return plan_for_config(doc, settings, ctx, kv, b, ram, threads)
    except EngineError as e:  # a --ctx beyond the model's longest: its code and max_ctx
        _engine_fail(e, as_json, f"{config}: ")
    except (ConvertError, FormatError, ValueError, OSError) as e:
        _fail(f"{config}: {one_line(str(e))}", as_json)


def plan_cmd(
    cli: typer.Context,
    file: PlanFileArg = None,
    config: ConfigOpt = None,
    ctx: CtxOpt = None,
    budget: BudgetOpt = None,
    kv: KvOpt = None,
    ram: RamOpt = None,
    threads: ThreadsOpt = None,
    expert_codec: ExpertCodecOpt = None,
    trunk_codec: TrunkCodecOpt = None,
    codec: CodecOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Memory plan: floor, recommended and default budget for this machine (or --ram).

    floor = trunk + KV cache + scratch + the expert records pinned at once (one group of top_k,
    twice: pinned beyond the cache and recycled buffers); the rest of the budget is cache."""
    from moepack.runtime.engine import EngineError, parse_bytes, plan

    if (file is None) == (config is None):
        usage("plan needs a container FILE or --config config.json (one of them)", cli)
    if config is None and (expert_codec or trunk_codec or codec):
        usage("--expert-codec, --trunk-codec and --codec go with --config (a container's "
              "codecs are chosen)", cli)
    b = parse_bytes(budget) if budget else None
    if config is not None:
        p = _config_plan(config, (expert_codec, trunk_codec, codec or []), ctx, kv, b, ram,
                         threads, as_json)
        file = config
    else:
        _require_file(file, as_json)
        try:
            p = plan(str(file), ctx, kv, b, ram, threads=threads)
        except EngineError as e:  # with its format code, as run prints it
            _engine_fail(e, as_json, f"{file}: ")
        except (ValueError, OSError) as e:
            _fail(f"{file}: {e}", as_json)
    verdict = None
    if b is not None:
        verdict = ("below_floor" if b < p["floor_bytes"]
                   else "above_usable_ram" if b > p["usable_ram_bytes"] else "ok")
    if as_json:
        print(json.dumps({**p, "budget_bytes": b, "budget_verdict": verdict,
                          "default_cache_experts": _cache_experts(p, p["default_cache_bytes"]),
                          "budget_cache_experts": _cache_experts(p, p["budget_cache_bytes"])
                          if b is not None else None}, indent=2, sort_keys=True))
    else:
        rows = [("context", _count(p["ctx"], "token")),
                ("trunk (resident)", format_size(p["trunk_bytes"])),
                ("KV cache", format_size(p["kv_bytes"]) + (
                    f" (of which {format_size(p['state_bytes'])} linear-attention state)"
                    if p["state_bytes"] else "")),
                ("KV per token", f"{p['kv_token_bytes']} bytes ({p['kv']} entries)"),
                ("longest context", f"{_count(p['max_ctx'], 'token')} fit "
                 f"{'the budget' if b is not None else 'usable RAM'} "
                 f"(model maximum {p['max_pos']})"),
                ("scratch", format_size(p["scratch_bytes"])),
                ("one token's experts", f"{format_size(p['step_expert_bytes'])} "
                 f"({p['moe_layers']} MoE layers x top-{p['top_k']})"),
                ("all experts (on disk)", f"{format_size(p['experts_bytes'])} "
                 f"({p['expert_count']} records of {format_size(p['expert_record_bytes'])})"),
                ("prompt chunk", f"16 tokens in the floor, up to {p['held_chunk']} held "
                 f"(+{format_size(p['chunk_token_bytes'])} per token, from the budget); a "
                 f"longer prompt's passes, up to {p['max_chunk']} tokens, borrow the expert "
                 "cache when that reads fewer experts"),
                ("pinned experts", f"{format_size(p['pinned_expert_bytes'])} "
                 f"({_pinned_groups(p)} x top-{p['top_k']} records, in the floor)"),
                ("floor", format_size(p["floor_bytes"])),
                *([("state snapshot", f"{format_size(p['state_bytes'])} more in the floor of "
                    "chat and serve (they keep one to rewind to a turn)")]
                  if p["state_bytes"] else []),
                ("recommended", format_size(p["recommended_bytes"]) + " (floor + a cache of "
                 "4 tokens' experts)"),
                ("default budget", format_size(p["default_bytes"]) if p["default_bytes"]
                 else "none: the floor does not fit in usable RAM"),
                ("usable RAM", format_size(p["usable_ram_bytes"]) + (" (--ram)" if ram else "")),
                ("expert cache", _cache_text(p, p["default_cache_bytes"], p["default_chunk"],
                                             "default budget less the floor and "
                                             f"{p['default_chunk']}-token chunks")
                 if p["default_bytes"] else "none: no default budget"),
                *([("with --budget", f"{format_size(b)}: {p['budget_chunk']}-token chunks, "
                    "expert cache " + _cache_text(p, p["budget_cache_bytes"], p["budget_chunk"]))]
                  if b is not None and b >= p["floor_bytes"] else [])]
        if "container_bytes" in p:
            rows.insert(0, ("container (planned)", f"{format_size(p['container_bytes'])} "
                            f"({p['container_bytes']} bytes, as convert would write it)"))
        for k, v in rows:
            print(f"{k:>22}  {v}")
    if verdict == "below_floor":  # the engine's refusal, word for word (engine.c mp_open)
        fits = (f"the longest context that fits is {_count(p['max_ctx'], 'token')} (--ctx)"
                if p["max_ctx"] else "not even one token of context fits")
        fail(f"budget {format_size(b, exact=True)} is below the floor: this model needs at "
             f"least {format_size(p['floor_bytes'], exact=True)} ({p['floor_bytes']} bytes) "
             f"for ctx {p['ctx']}; {fits}")
    if verdict == "above_usable_ram":
        _err.print(f"[yellow]warning:[/yellow] budget {format_size(b)} is above usable RAM "
                   f"{format_size(p['usable_ram_bytes'])}")


def _cache_experts(p: dict, cache: int) -> int:
    """Expert records a cache of `cache` bytes holds: at most every one there is."""
    held = cache // p["expert_record_bytes"] if p["expert_record_bytes"] else 0
    return min(held, p["expert_count"])


def _cache_text(p: dict, cache: int, chunk: int, why: str = "") -> str:
    """What an expert cache of `cache` bytes holds, never more than every expert: a budget
    beyond them leaves room to spare, which a prompt longer than the held chunk borrows for
    longer passes (docs/RUNTIME.md, "Memory plan")."""
    why = f" ({why})" if why else ""
    if cache < p["experts_bytes"]:
        return (f"{format_size(cache)}{why}: {_cache_experts(p, cache)} of "
                f"{p['expert_count']} records")
    spare = cache - p["experts_bytes"]
    return (f"{format_size(p['experts_bytes'])}{why}: holds every expert, all read in the "
            "background from open (--no-warm turns that off)"
            + (f", and {format_size(spare)} to spare that a prompt longer than "
               f"{_count(chunk, 'token')} borrows for longer passes" if spare else ""))


def _pinned_groups(p: dict) -> int:
    """Acquire groups the floor reserves for expert records beyond the cache (1 or 2)."""
    group = p["top_k"] * p["expert_record_bytes"]
    return p["pinned_expert_bytes"] // group if group else 0


def _token_ids(tokens: str) -> list[int]:
    """Ids from a --tokens value its callback (cliargs.token_ids) has checked."""
    return [int(t) for t in tokens.split(",") if t.strip()]


def _prompt_ids(file: Path, prompt: str, tokens: str | None, as_json: bool):
    if tokens is not None:  # --tokens "" is an empty prompt, not "use the text"
        return _token_ids(tokens), None
    from moepack.runtime.tokenizer import TokenizerError

    tok = _tokenizer(file, as_json, "give the prompt as token ids with --tokens")
    try:
        return tok.encode_prompt(prompt), tok
    except TokenizerError as e:
        _fail(str(e), as_json)


def _tokenizer(file: Path, as_json: bool, without: str) -> Tokenizer:
    """The container's tokenizer; a malformed container exits with its format code, as the
    engine's refusal would; one without a tokenizer says what this command can do instead
    (`without`)."""
    from moepack.format.errors import FormatError
    from moepack.runtime.engine import EngineError
    from moepack.runtime.tokenizer import Tokenizer, TokenizerError

    try:
        return Tokenizer.from_container(str(file))
    except FormatError as e:
        _engine_fail(EngineError.from_format(e), as_json, f"{file}: ")
    except TokenizerError as e:
        _fail(f"{file} has no tokenizer (no tokenizer.json blob): {without}"
              if not _has_blob(file, "tokenizer.json") else str(e), as_json)
    except OSError as e:
        _fail(str(e), as_json)


def _has_blob(file: Path, name: str) -> bool:
    """Whether the container (read once already) has a blob section `name`."""
    from moepack.format.reader import Container

    with Container.open(file) as c:
        return any(s["type"] == "blob" and s["name"] == name for s in c.sections)


def _interrupted(as_json: bool, result: dict) -> NoReturn:
    """Ctrl-C: the line finished, one `interrupted` line on stderr, with --json the result so far
    (`interrupted: true`); exit 130 (docs/RUNTIME.md, "Exit codes")."""
    if as_json:
        print(json.dumps({**result, "interrupted": True}, indent=2))
    else:
        print()
    _err.print(f"interrupted after {_count(len(result['tokens']), 'token')}")
    raise typer.Exit(130)


def _json_stats(eng, s: dict) -> dict:
    """Stats for `run --json`: the engine's, with cache_capacity_experts at most the experts
    there are (the engine counts the records its byte budget could hold, and a budget beyond
    every expert is room longer prompts borrow, not more experts)."""
    return {**s, "cache_capacity_experts": min(s["cache_capacity_experts"],
                                               eng.plan()["expert_count"])}


def run_cmd(
    cli: typer.Context,
    file: FileArg,
    prompt: Annotated[str, typer.Argument(
        callback=utf8_text, help="Prompt text (UTF-8).")] = "",
    n: Annotated[int, typer.Option("-n", min=0, max=INT32_MAX, help="Tokens to generate.")] = 32,
    temp: TempOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = 0,
    budget: BudgetOpt = None,
    threads: ThreadsOpt = None,
    ctx: CtxOpt = None,
    kv: KvOpt = None,
    tokens: Annotated[str | None, typer.Option(
        "--tokens", callback=token_ids,
        help="Comma-separated prompt token ids instead of text.")] = None,
    prefetch: Annotated[bool, typer.Option(help="Router look-ahead prefetch.")] = True,
    warm: Annotated[bool, typer.Option(
        help="When the expert cache holds every expert, read them all in the background from "
             "the start.")] = True,
    o_direct: Annotated[bool | None, typer.Option(
        "--o-direct/--no-o-direct", help="Force O_DIRECT on/off (default: probe).")] = None,
    cache_policy: Annotated[str, typer.Option(
        callback=choice("lfu", "lru"), help="lfu or lru.")] = "lfu",
    verify_reads: Annotated[bool, typer.Option(
        "--verify-reads", help="Check every expert record's BLAKE3 when read.")] = False,
    kernels: KernelsOpt = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object at the end.")] = False,
) -> None:
    """Generate text: streams tokens, then prints a stats line."""
    from moepack.runtime.engine import MP_ECTX, EngineError
    from moepack.runtime.tokenizer import StreamDecoder, generation_eos_ids, stop_ids

    if prompt and tokens is not None:
        usage("the prompt text and --tokens are two prompts: give one of them", cli)
    _require_file(file, as_json)
    # Ctrl-C from here on stops between two steps: opening or a prompt runs to its end (the C
    # call cannot be interrupted), generation stops before the next token
    with _Interrupt() as stop_now:
        ids, tok = _prompt_ids(file, prompt, tokens, as_json)
        if not ids:
            _fail("empty prompt", as_json)
        eng = _open(file, budget=budget, threads=threads, ctx=ctx, kv=kv, prefetch=prefetch,
                    o_direct=o_direct, cache_policy=cache_policy, verify_reads=verify_reads,
                    as_json=as_json, warm=warm, kernels=kernels)
        # the last sampled token is never fed: prompt + n - 1 positions (refused before any
        # work, so that --json never loses tokens to a context that fills midway)
        need = len(ids) + max(n - 1, 0)
        if need > eng.ctx:
            # a longer --ctx helps only below the model's longest context
            limit = (", this model's longest context (max_position_embeddings)"
                     if eng.ctx >= eng.plan()["max_pos"] else " (--ctx)")
            eng.close()
            _engine_fail(EngineError(
                f"context full: the prompt's {_count(len(ids), 'token')} and -n {n} need "
                f"{need} positions, ctx is {eng.ctx}{limit}", MP_ECTX), as_json)
        stop = sorted(stop_ids(tok, eng.vocab_size, generation_eos_ids(str(file)))) if tok else []
        out: list[int] = []
        dec = StreamDecoder(tok) if tok else None
        try:
            with eng:
                tokens_made = () if stop_now.hit else eng.generate(
                    ids, n, temperature=temp, top_k=top_k, top_p=top_p, seed=seed, stop=stop)
                for t in tokens_made:
                    out.append(t)
                    if not as_json:
                        sys.stdout.write(terminal_text(dec.push(t)) if dec else f"{t} ")
                        sys.stdout.flush()
                    if stop_now.hit:
                        break
                s = _json_stats(eng, eng.stats()) if as_json else eng.stats()
        except EngineError as e:
            if not as_json:
                print()
            _engine_fail(e, as_json)
    text = tok.decode(out, skip_special_tokens=True) if tok else None  # as streamed
    result = {"prompt_tokens": ids, "tokens": out, "text": text,
              "stats": s}
    if stop_now.hit:
        _interrupted(as_json, result)
    if as_json:
        print(json.dumps({**result, "interrupted": False}, indent=2))
    else:
        print()
        print(stats_line(s))


def _output_problem(path: Path) -> str | None:
    """Why `path` cannot be created, or None; checked before the work, not after it."""
    parent = path.parent
    if not parent.is_dir():
        return f"folder {parent} " + ("is not a folder" if parent.exists() else "does not exist")
    if path.is_dir() and not path.is_symlink():
        return f"{path} is a folder"
    return None


def _save_npy(path: Path, array: np.ndarray) -> None:
    """Write `array` as .npy at exactly `path`, through a new file: a symbolic link planted there
    is replaced, never followed (safefs.open_new). Written with os.write, not np.save: np.save
    through a file object drops the tail of a short write (disk full) without an error."""
    import numpy as np

    from moepack.safefs import UnsafePathError, open_new

    data = np.ascontiguousarray(array)  # the header below then says C order
    try:
        fd = open_new(path, os.O_WRONLY, replace=True)
    except (UnsafePathError, OSError) as e:
        fail(f"cannot write {path}: {getattr(e, 'strerror', None) or e}")
    try:
        try:
            _write_all(fd, _npy_header(data))
            _write_all(fd, memoryview(data).cast("B"))
        finally:
            os.close(fd)
    except OSError as e:  # leave no truncated .npy behind
        path.unlink(missing_ok=True)
        fail(f"cannot write {path}: {e.strerror or e}")


def _npy_header(array: np.ndarray) -> bytes:
    """The .npy (format 1.0) header np.save would write for `array`."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(array))
    return buf.getvalue()


def _write_all(fd: int, data: bytes | memoryview) -> None:
    """Every byte, or OSError: a short write is retried, so a full disk raises ENOSPC."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def eval_cmd(
    file: FileArg,
    tokens: Annotated[str, typer.Option(
        "--tokens", callback=token_ids, help="Comma-separated token ids.")],
    logits: Annotated[Path, typer.Option(
        "--logits", help="Output .npy: float32 \\[n, vocab], written at exactly this path.")],
    threads: ThreadsOpt = None,
    budget: BudgetOpt = None,
    ctx: CtxOpt = None,
    kv: KvOpt = None,
    kernels: KernelsOpt = "auto",
) -> None:
    """Teacher-forced logits for every position, saved as a float32 .npy."""
    from moepack.runtime.engine import EngineError

    ids = _token_ids(tokens)
    if not ids:
        raise typer.BadParameter("no token ids given", param_hint="'--tokens'")
    problem = _output_problem(logits)
    if problem:
        raise typer.BadParameter(problem, param_hint="'--logits'")
    _require_file(file)
    if ctx is not None and ctx < len(ids):  # never raised behind the user's back
        fail(f"context full: the {_count(len(ids), 'token')} need {len(ids)} positions, ctx is "
             f"{ctx} (--ctx)")
    if ctx is None:  # the context is the tokens': refused in their words, not as a --ctx
        longest = _model_max_pos(file, kv)
        if len(ids) > longest:
            fail(f"context full: the {_count(len(ids), 'token')} are more than this model's "
                 f"longest context, {_count(longest, 'token')} (max_position_embeddings)")
    eng = _open(file, budget=budget, threads=threads, ctx=ctx or len(ids), kv=kv,
                kernels=kernels)
    try:
        with eng:
            out = eng.logits(ids)
    except EngineError as e:
        _engine_fail(e, False)
    _save_npy(logits, out)
    print(f"wrote {one_line(str(logits))}: float32 {list(out.shape)}")


def _model_max_pos(file: Path, kv: str | None) -> int:
    """The model's longest context (max_position_embeddings), from its plan."""
    from moepack.runtime.engine import EngineError, plan

    try:
        return plan(str(file), kv=kv)["max_pos"]
    except EngineError as e:
        _engine_fail(e, False, f"{file}: ")
    except (ValueError, OSError) as e:
        fail(f"{file}: {e}")


def chat_cmd(
    file: FileArg,
    max_tokens: Annotated[int, typer.Option(
        "-n", "--max-tokens", min=1, max=INT32_MAX, help="Per reply.")] = 256,
    temp: TempOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = 0,
    system: Annotated[str | None, typer.Option(
        "--system", callback=utf8_text, help="System message (UTF-8).")] = None,
    budget: BudgetOpt = None,
    threads: ThreadsOpt = None,
    ctx: CtxOpt = None,
    kv: KvOpt = None,
    kernels: KernelsOpt = "auto",
) -> None:
    """Interactive chat with the container's chat template (KV cache kept across turns).

    Each turn evaluates only the part of the conversation not already cached. A reply gets -n
    tokens or the room the context has left; the conversation starts over (the system message
    stays) when that lets a reply have -n; a line too long for the context is refused and the
    chat goes on. Ctrl-C stops a reply; an empty line, EOF or Ctrl-C at the prompt ends the
    chat; a line that is not UTF-8 ends it with an error."""
    from moepack.runtime.engine import EngineError
    from moepack.runtime.prefix import PrefixReuse
    from moepack.runtime.tokenizer import StreamDecoder, generation_eos_ids, stop_ids

    _require_file(file)
    tok = _tokenizer(file, False, "chat needs one (run and eval take token ids with --tokens)")
    if not tok.chat_template:
        fail("the container has no chat template")
    eng = _open(file, budget=budget, threads=threads, ctx=ctx, kv=kv, snapshots=1,
                kernels=kernels)
    first = [{"role": "system", "content": system}] if system else []  # kept on starting over
    messages = list(first)
    reuse = PrefixReuse(eng)  # KV truncation, or the linear-attention state of the last turn
    stop = sorted(stop_ids(tok, eng.vocab_size, generation_eos_ids(str(file))))
    capped_said = False
    with eng:
        while True:
            line = _read_line()
            if line is None or not line.strip():
                break
            user = {"role": "user", "content": line}
            ids = _encode_chat(tok, [*messages, user])
            fresh = _encode_chat(tok, [*first, user]) if len(messages) > len(first) else ids
            fit = turn_fit(len(ids), len(fresh), eng.ctx, max_tokens)
            if fit is None:
                limit = (", this model's longest context" if eng.ctx >= eng.plan()["max_pos"]
                         else " (--ctx)")
                _err.print(f"[yellow]context full:[/yellow] this turn's "
                           f"{_count(len(fresh), 'token')} do not fit ctx {eng.ctx}{limit}: "
                           "not sent; the conversation goes on")
                continue
            start_over, n = fit
            if start_over:
                _err.print("[yellow]context full: starting over[/yellow]")
                messages, ids = list(first), fresh
                eng.reset()
            if n < max_tokens and not capped_said:
                _err.print(f"[yellow]note:[/yellow] replies stop where the context (ctx "
                           f"{eng.ctx}) is full, this one after {_count(n, 'token')} "
                           f"(-n {max_tokens})")
                capped_said = True
            messages.append(user)
            new = ids[reuse.rewind(ids):]
            dec, reply = StreamDecoder(tok), []
            try:
                with _Interrupt() as stop_now:
                    for t in eng.generate(new, n, temperature=temp, top_k=top_k, top_p=top_p,
                                          seed=seed, reset=False, stop=stop):
                        if not reply:  # the prompt is in, the reply not yet: a turn boundary
                            reuse.mark()
                        reply.append(t)
                        if t not in stop:
                            sys.stdout.write(terminal_text(dec.push(t)))
                            sys.stdout.flush()
                        if stop_now.hit:
                            break
            except EngineError as e:
                _engine_fail(e, False)
            print()
            if stop_now.hit:  # the reply so far stays in the conversation, as shown
                _err.print("[yellow]interrupted[/yellow]")
            # the last sampled token was not fed; the next turn re-renders and feeds the rest
            messages.append({"role": "assistant", "content": tok.decode(
                [t for t in reply if t not in stop], skip_special_tokens=True)})


def turn_fit(history: int, fresh: int, ctx: int, max_tokens: int) -> tuple[bool, int] | None:
    """(start over, reply tokens) for a chat turn whose prompt is `history` tokens with the
    conversation so far and `fresh` without it; None when even a fresh start cannot hold it.
    The reply's last token is never fed, so a prompt of p tokens leaves room for ctx - p + 1.
    The conversation is kept while the reply gets -n there, dropped when only a fresh start
    gives it -n; where -n fits neither, the reply gets the room left, keeping the conversation
    while its prompt fits."""
    def room(prompt: int) -> int:
        return ctx - prompt + 1

    if room(history) >= max_tokens:
        return False, max_tokens
    if fresh < history and room(fresh) >= max_tokens:
        return True, max_tokens
    if room(history) >= 1:
        return False, room(history)
    if room(fresh) >= 1:
        return True, room(fresh)
    return None


def _read_line() -> str | None:
    """One line of chat input; None at EOF. Ctrl-C here ends the chat: exit 130 (docs/RUNTIME.md,
    "Exit codes"). Bytes that are not UTF-8 end the chat with one error line: under a UTF-8
    locale stdin raises, under the C locale they arrive as surrogates."""
    try:
        line = input("> ")
    except EOFError:
        return None
    except KeyboardInterrupt:
        print()  # the shell's prompt starts on a line of its own
        raise typer.Exit(130) from None
    except UnicodeDecodeError as e:
        fail(f"input is not valid UTF-8 (byte 0x{e.object[e.start]:02x}); "
              "moepack reads text as UTF-8 only")
    problem = utf8_problem(line)
    if problem:
        fail(f"input {problem}; moepack reads text as UTF-8 only")
    return line


def _encode_chat(tok: Tokenizer, messages: list[dict]) -> list[int]:
    from moepack.runtime.tokenizer import TokenizerError

    try:
        return tok.encode_chat(messages)
    except TokenizerError as e:
        fail(str(e))


def register(app: typer.Typer) -> None:
    """Add this package's subcommands to the `moepack` app."""
    app.command("plan")(plan_cmd)
    app.command("run")(run_cmd)
    app.command("eval")(eval_cmd)
    app.command("chat")(chat_cmd)
