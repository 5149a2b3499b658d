"""Subcommands of `moepack` provided by moepack.runtime: `plan`, `run`, `chat`, `eval`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

_err = Console(stderr=True, soft_wrap=True, highlight=False)

FileArg = Annotated[Path, typer.Argument(help="A .moepack container.")]
BudgetOpt = Annotated[str | None, typer.Option(
    "--budget", help="Total memory budget (e.g. 8G, 512MiB). Default: from usable RAM.")]
ThreadsOpt = Annotated[int | None, typer.Option(
    "--threads", help="Compute threads (default: all CPUs).")]
CtxOpt = Annotated[int | None, typer.Option("--ctx", help="Context length (KV cache size).")]


def _fail(msg: str) -> None:
    _err.print(f"[red]error:[/red] {escape(msg)}")
    raise typer.Exit(1)


def _gb(n: float) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 1e9 else f"{n / 1e6:.3f} MB"


def _check_budget(file: Path, budget: str | None, ctx: int | None) -> None:
    """Warn when a user budget exceeds usable RAM (the engine itself refuses below the floor)."""
    if not budget:
        return
    from moepack.runtime.engine import parse_bytes, plan

    p = plan(str(file), ctx)
    b = parse_bytes(budget)
    if b > p["usable_ram_bytes"]:
        _err.print(f"[yellow]warning:[/yellow] budget {_gb(b)} is above usable RAM "
                   f"{_gb(p['usable_ram_bytes'])}: the OS will page the expert cache and "
                   "cache hits turn into disk reads (a peer measured 8x slower decode)")


def _open(file: Path, *, budget, threads, ctx, prefetch=True, o_direct=None,
          cache_policy="lfu", verify_reads=False):
    from moepack.runtime.engine import Engine, EngineError

    try:
        _check_budget(file, budget, ctx)
        return Engine(str(file), budget=budget, threads=threads, ctx=ctx, prefetch=prefetch,
                      o_direct=o_direct, cache_policy=cache_policy, verify_reads=verify_reads)
    except (EngineError, ValueError, OSError) as e:
        _fail(f"{file}: {e}")


def stats_line(s: dict) -> str:
    """The one-line summary printed after `run`."""
    return (f"prompt {s['prompt_tokens']} tok @ {s['prompt_tok_s']:.2f} tok/s | "
            f"decode {s['decode_tokens']} tok @ {s['decode_tok_s']:.2f} tok/s | "
            f"cache hits {100 * s['hit_rate']:.1f}% | read {s['bytes_read'] / 1e9:.3f} GB | "
            f"I/O wait {100 * s['io_wait_share']:.1f}% | "
            f"O_DIRECT {'on' if s['o_direct'] else 'off'}")


def plan_cmd(
    file: FileArg,
    ctx: CtxOpt = None,
    budget: BudgetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Memory plan: floor, recommended and default budget for this machine.

    floor = trunk + KV cache + scratch + one token's routed experts over all MoE layers."""
    from moepack.runtime.engine import EngineError, parse_bytes, plan

    try:
        p = plan(str(file), ctx)
        b = parse_bytes(budget) if budget else None
    except (EngineError, ValueError, OSError) as e:
        _fail(f"{file}: {e}")
    verdict = None
    if b is not None:
        verdict = ("below_floor" if b < p["floor_bytes"]
                   else "above_usable_ram" if b > p["usable_ram_bytes"] else "ok")
    if as_json:
        print(json.dumps({**p, "budget_bytes": b, "budget_verdict": verdict}, indent=2,
                         sort_keys=True))
    else:
        rows = [("context", f"{p['ctx']} tokens"),
                ("trunk (resident)", _gb(p["trunk_bytes"])),
                ("KV cache", _gb(p["kv_bytes"])),
                ("scratch", _gb(p["scratch_bytes"])),
                ("one token's experts", f"{_gb(p['step_expert_bytes'])} "
                 f"({p['moe_layers']} MoE layers x top-{p['top_k']})"),
                ("all experts (on disk)", f"{_gb(p['experts_bytes'])} "
                 f"({p['expert_count']} records of {_gb(p['expert_record_bytes'])})"),
                ("floor", _gb(p["floor_bytes"])),
                ("recommended", _gb(p["recommended_bytes"])),
                ("default budget", _gb(p["default_bytes"]) if p["default_bytes"]
                 else "none: the floor does not fit in usable RAM"),
                ("usable RAM", _gb(p["usable_ram_bytes"]))]
        for k, v in rows:
            print(f"{k:>22}  {v}")
    if verdict == "below_floor":
        _fail(f"budget {_gb(b)} is below the floor: this model needs at least "
              f"{_gb(p['floor_bytes'])} for ctx {p['ctx']}")
    if verdict == "above_usable_ram":
        _err.print(f"[yellow]warning:[/yellow] budget {_gb(b)} is above usable RAM "
                   f"{_gb(p['usable_ram_bytes'])}")


def _token_ids(tokens: str) -> list[int]:
    try:
        return [int(t) for t in tokens.split(",") if t.strip()]
    except ValueError:
        _fail("--tokens must be comma-separated integers")


def _prompt_ids(file: Path, prompt: str, tokens: str | None):
    if tokens:
        return _token_ids(tokens), None
    from moepack.runtime.tokenizer import Tokenizer, TokenizerError

    try:
        tok = Tokenizer.from_container(str(file))
    except (TokenizerError, OSError) as e:
        _fail(str(e))
    return tok.encode_prompt(prompt), tok


def run_cmd(
    file: FileArg,
    prompt: Annotated[str, typer.Argument(help="Prompt text.")] = "",
    n: Annotated[int, typer.Option("-n", help="Tokens to generate.")] = 32,
    temp: Annotated[float, typer.Option("--temp", help="Temperature (0 = greedy).")] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", help="Nucleus mass (1 = off).")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", help="Keep the k most likely (0 = off).")] = 0,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed.")] = 0,
    budget: BudgetOpt = None,
    threads: ThreadsOpt = None,
    ctx: CtxOpt = None,
    tokens: Annotated[str | None, typer.Option(
        "--tokens", help="Comma-separated prompt token ids instead of text.")] = None,
    prefetch: Annotated[bool, typer.Option(help="Router look-ahead prefetch.")] = True,
    o_direct: Annotated[bool | None, typer.Option(
        "--o-direct/--no-o-direct", help="Force O_DIRECT on/off (default: probe).")] = None,
    cache_policy: Annotated[str, typer.Option(help="lfu or lru.")] = "lfu",
    verify_reads: Annotated[bool, typer.Option(
        "--verify-reads", help="Check every expert record's BLAKE3 when read.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object at the end.")] = False,
) -> None:
    """Generate text: streams tokens, then prints a stats line."""
    from moepack.runtime.engine import EngineError
    from moepack.runtime.tokenizer import StreamDecoder

    ids, tok = _prompt_ids(file, prompt, tokens)
    if not ids:
        _fail("empty prompt")
    eng = _open(file, budget=budget, threads=threads, ctx=ctx, prefetch=prefetch,
                o_direct=o_direct, cache_policy=cache_policy, verify_reads=verify_reads)
    stop = [tok.eos_id] if tok and tok.eos_id is not None else []
    out: list[int] = []
    dec = StreamDecoder(tok) if tok else None
    try:
        with eng:
            for t in eng.generate(ids, n, temperature=temp, top_k=top_k, top_p=top_p,
                                  seed=seed, stop=stop):
                out.append(t)
                if not as_json:
                    sys.stdout.write(dec.push(t) if dec else f"{t} ")
                    sys.stdout.flush()
            s = eng.stats()
    except EngineError as e:
        if not as_json:
            print()
        _fail(str(e))
    if as_json:
        print(json.dumps({"prompt_tokens": ids, "tokens": out,
                          "text": tok.decode(out) if tok else None, "stats": s}, indent=2))
    else:
        print()
        print(stats_line(s))


def eval_cmd(
    file: FileArg,
    tokens: Annotated[str, typer.Option("--tokens", help="Comma-separated token ids.")],
    logits: Annotated[Path, typer.Option("--logits", help="Output .npy: float32 [n, vocab].")],
    threads: ThreadsOpt = None,
    budget: BudgetOpt = None,
    ctx: CtxOpt = None,
) -> None:
    """Teacher-forced logits for every position, saved as a float32 .npy."""
    import numpy as np
    from moepack.runtime.engine import EngineError

    ids = _token_ids(tokens)
    if not ids:
        _fail("--tokens is empty")
    eng = _open(file, budget=budget, threads=threads, ctx=max(ctx or 0, len(ids)))
    try:
        with eng:
            out = eng.logits(ids)
    except EngineError as e:
        _fail(str(e))
    np.save(logits, out)
    print(f"wrote {logits}: float32 {list(out.shape)}")


def chat_cmd(
    file: FileArg,
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens", help="Per reply.")] = 256,
    temp: Annotated[float, typer.Option("--temp")] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k")] = 0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    system: Annotated[str | None, typer.Option("--system", help="System message.")] = None,
    budget: BudgetOpt = None,
    threads: ThreadsOpt = None,
    ctx: CtxOpt = None,
) -> None:
    """Interactive chat with the container's chat template (KV cache kept across turns).

    Each turn evaluates only the part of the conversation not already cached. An empty line or
    EOF ends the chat."""
    from moepack.runtime.engine import EngineError
    from moepack.runtime.tokenizer import StreamDecoder, Tokenizer, TokenizerError

    try:
        tok = Tokenizer.from_container(str(file))
        if not tok.chat_template:
            raise TokenizerError("the container has no chat template")
    except (TokenizerError, OSError) as e:
        _fail(str(e))
    eng = _open(file, budget=budget, threads=threads, ctx=ctx)
    messages = [{"role": "system", "content": system}] if system else []
    cached: list[int] = []  # tokens now in the KV cache
    stop = [tok.eos_id] if tok.eos_id is not None else []
    with eng:
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if not line.strip():
                break
            messages.append({"role": "user", "content": line})
            try:
                ids = tok.encode_chat(messages)
            except TokenizerError as e:
                _fail(str(e))
            if cached and ids[:len(cached)] == cached:
                new = ids[len(cached):]
            else:
                eng.reset()
                cached, new = [], ids
            if len(ids) + max_tokens > eng.ctx:
                _err.print("[yellow]context full: starting over[/yellow]")
                messages = messages[-1:]
                ids = tok.encode_chat(messages)
                eng.reset()
                cached, new = [], ids
            dec, reply = StreamDecoder(tok), []
            try:
                for t in eng.generate(new, max_tokens, temperature=temp, top_k=top_k,
                                      top_p=top_p, seed=seed, reset=False, stop=stop):
                    reply.append(t)
                    if t not in stop:
                        sys.stdout.write(dec.push(t))
                        sys.stdout.flush()
            except EngineError as e:
                _fail(str(e))
            print()
            # the last sampled token was not fed; the next turn re-renders and feeds the rest
            cached = ids + reply[:-1] if reply else ids
            messages.append({"role": "assistant",
                             "content": tok.decode([t for t in reply if t not in stop])})


def register(app: typer.Typer) -> None:
    """Add this package's subcommands to the `moepack` app."""
    app.command("plan")(plan_cmd)
    app.command("run")(run_cmd)
    app.command("eval")(eval_cmd)
    app.command("chat")(chat_cmd)
