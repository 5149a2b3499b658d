"""`moepack plan`: what a model needs in memory, from a container or a config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from moepack.convert.cli import codec_option, expert_codec_option, trunk_codec_option
from moepack.runtime.cli import (
    BudgetOpt,
    CtxOpt,
    KvOpt,
    ThreadsOpt,
    counted,
    engine_fail,
    err_console,
    fail_as,
    require_file,
)

from moepack.cliargs import fail, file_problem, json_error, one_line, size_option, usage
from moepack.sizes import SIZE_HELP, format_size

PlanFileArg = Annotated[Path | None, typer.Argument(
    help="A .moepack container (or --config for a model not converted yet).")]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", help="Plan a model not converted yet from its config.json: the container that "
    "`convert` would write with these codecs, planned by the same engine code (no weights).")]
RamOpt = Annotated[str | None, typer.Option(
    "--ram", callback=size_option,
    help=f"Plan for a machine with this much usable RAM (default: this one). {SIZE_HELP}")]
ExpertCodecOpt = Annotated[str | None, typer.Option(
    "--expert-codec", callback=expert_codec_option,
    help="With --config: expert codec preset (as convert; default rvq3-l).")]
TrunkCodecOpt = Annotated[str | None, typer.Option(
    "--trunk-codec", callback=trunk_codec_option,
    help="With --config: codec of all quantised trunk classes (as convert).")]
CodecOpt = Annotated[list[str] | None, typer.Option(
    "--codec", callback=codec_option,
    help="With --config: trunk codec of one class, CLASS=CODEC (repeatable).")]


def _config_plan(config: Path, codecs: tuple[str | None, str | None, list[str]],
                 ctx: int | None, kv: str | None, b: int | None, ram: str | None,
                 threads: int | None, as_json: bool) -> dict:
    """plan_for_config on a config.json file; one error line for anything wrong with it, which
    names the file once (the converter's messages say `config.json: ...`)."""
    from moepack.convert.cli import _settings
    from moepack.convert.errors import ConvertError
    from moepack.convert.source import load_json
    from moepack.format.errors import FormatError
    from moepack.runtime.engine import EngineError, plan_for_config

    problem = file_problem(config, "config")
    if problem:
        fail_as(problem, as_json)
    try:  # the converter's own bounded loader: what convert reads, plan reads
        doc = load_json(config, str(config))
    except ConvertError as e:
        fail_as(one_line(str(e)), as_json)
    try:
        expert, trunk, per_class = codecs
        settings = _settings(expert, trunk, per_class, 0, 4096, None, None)
        return plan_for_config(doc, settings, ctx, kv, b, ram, threads)
    except EngineError as e:  # a --ctx beyond the model's longest: its code and max_ctx
        engine_fail(e, as_json, f"{config}: ")
    except (ConvertError, FormatError, ValueError, OSError) as e:
        fail_as(f"{config}: {one_line(str(e).removeprefix('config.json: '))}", as_json)


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
    from moepack.runtime.engine import MP_EBUDGET, REFUSALS, EngineError, parse_bytes, plan

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
        require_file(file, as_json)
        try:
            p = plan(str(file), ctx, kv, b, ram, threads=threads)
        except EngineError as e:  # with its format code, as run prints it
            engine_fail(e, as_json, f"{file}: ")
        except (ValueError, OSError) as e:
            fail_as(f"{file}: {e}", as_json)
    verdict = None
    if b is not None:
        verdict = ("below_floor" if b < p["floor_bytes"]
                   else "above_usable_ram" if b > p["usable_ram_bytes"] else "ok")
    refusal = None
    if verdict == "below_floor":  # the engine's refusal, word for word (engine.c mp_open)
        fits = (f"the longest context that fits is {counted(p['max_ctx'], 'token')} (--ctx)"
                if p["max_ctx"] else "not even one token of context fits")
        refusal = (f"{file}: budget {format_size(b, exact=True)} is below the floor: this "
                   f"model needs at least {format_size(p['floor_bytes'], exact=True)} "
                   f"({p['floor_bytes']} bytes) for ctx {p['ctx']}; {fits}")
    if as_json:
        out = {**p, "budget_bytes": b, "budget_verdict": verdict,
               "default_cache_experts": _cache_experts(p, p["default_cache_bytes"]),
               "budget_cache_experts": _cache_experts(p, p["budget_cache_bytes"])
               if b is not None else None}
        if refusal:  # run --json's error object (as the engine refuses), the plan beside it
            json_error(refusal, engine_code=MP_EBUDGET, code=REFUSALS[MP_EBUDGET],
                       max_ctx=p["max_ctx"], plan=out)
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        rows = [("context", counted(p["ctx"], "token")),
                ("trunk (resident)", format_size(p["trunk_bytes"])),
                ("KV cache", format_size(p["kv_bytes"]) + (
                    f" (of which {format_size(p['state_bytes'])} linear-attention state)"
                    if p["state_bytes"] else "")),
                ("KV per token", f"{p['kv_token_bytes']} bytes ({p['kv']} entries)"),
                ("longest context", f"{counted(p['max_ctx'], 'token')} fit "
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
    if refusal:
        fail(refusal)
    if verdict == "above_usable_ram":
        err_console.print(f"[yellow]warning:[/yellow] budget {format_size(b)} is above usable RAM "
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
               f"{counted(chunk, 'token')} borrows for longer passes" if spare else ""))


def _pinned_groups(p: dict) -> int:
    """Acquire groups the floor reserves for expert records beyond the cache (1 or 2)."""
    group = p["top_k"] * p["expert_record_bytes"]
    return p["pinned_expert_bytes"] // group if group else 0
