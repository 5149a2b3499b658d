"""`moepack run`: generate text from a prompt, streamed, then a stats line."""

from __future__ import annotations

import json
import sys
from typing import Annotated, NoReturn

import typer
from moepack.runtime.cli import (
    BiasOpt,
    BudgetOpt,
    CtxOpt,
    FileArg,
    FrequencyOpt,
    Interrupt,
    KernelsOpt,
    KvOpt,
    PresenceOpt,
    SeedOpt,
    TempOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    checked_bias,
    counted,
    engine_fail,
    err_console,
    fail_as,
    open_engine,
    prompt_ids,
    require_file,
    stats_line,
)

from moepack.cliargs import (
    EXIT_INTERRUPTED,
    INT32_MAX,
    choice,
    terminal_text,
    token_ids,
    usage,
    utf8_text,
)


def _interrupted(as_json: bool, result: dict) -> NoReturn:
    """Ctrl-C: the line finished, one `interrupted` line on stderr, with --json the result so far
    (`interrupted: true`); exit 130 (docs/RUNTIME.md, "Exit codes")."""
    if as_json:
        print(json.dumps({**result, "interrupted": True}, indent=2))
    else:
        print()
    err_console.print(f"interrupted after {counted(len(result['tokens']), 'token')}")
    raise typer.Exit(EXIT_INTERRUPTED)


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
    presence_penalty: PresenceOpt = 0.0,
    frequency_penalty: FrequencyOpt = 0.0,
    logit_bias: BiasOpt = None,
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
    from moepack.runtime.engine import MP_ECTX, Cancelled, EngineError
    from moepack.runtime.tokenizer import StreamDecoder, generation_eos_ids, stop_ids

    if prompt and tokens is not None:
        usage("the prompt text and --tokens are two prompts: give one of them", cli)
    require_file(file, as_json)
    # Ctrl-C from here on: opening stops at its next trunk tensor, the prompt within a layer's
    # work (Engine.cancel), generation before the next token
    with Interrupt() as stop_now:
        ids, tok = prompt_ids(file, prompt, tokens, as_json)
        if not ids:
            fail_as("empty prompt", as_json)
        try:
            if stop_now.hit:  # while the prompt was read: no trunk read at all
                raise KeyboardInterrupt
            eng = open_engine(file, budget=budget, threads=threads, ctx=ctx, kv=kv,
                              prefetch=prefetch, o_direct=o_direct, cache_policy=cache_policy,
                              verify_reads=verify_reads, as_json=as_json, warm=warm,
                              kernels=kernels)
        except KeyboardInterrupt:  # before the engine was open: no tokens, no stats
            _interrupted(as_json, {"prompt_tokens": ids, "tokens": [],
                                   "text": "" if tok else None, "stats": None})
        # the last sampled token is never fed: prompt + n - 1 positions (refused before any
        # work, so that --json never loses tokens to a context that fills midway)
        need = len(ids) + max(n - 1, 0)
        if need > eng.ctx:
            # a longer --ctx helps only below the model's longest context
            limit = (", this model's longest context (max_position_embeddings)"
                     if eng.ctx >= eng.plan()["max_pos"] else " (--ctx)")
            eng.close()
            engine_fail(EngineError(
                f"context full: the prompt's {counted(len(ids), 'token')} and -n {n} need "
                f"{need} positions, ctx is {eng.ctx}{limit}", MP_ECTX), as_json)
        bias = checked_bias(logit_bias, eng, as_json)
        stop = sorted(stop_ids(tok, eng.vocab_size, generation_eos_ids(str(file)))) if tok else []
        out: list[int] = []
        dec = StreamDecoder(tok) if tok else None
        stop_now.also(eng.cancel)
        try:
            with eng:
                tokens_made = () if stop_now.hit else eng.generate(
                    ids, n, temperature=temp, top_k=top_k, top_p=top_p, seed=seed, stop=stop,
                    presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                    logit_bias=bias)
                try:
                    for t in tokens_made:
                        out.append(t)
                        if not as_json:
                            sys.stdout.write(terminal_text(dec.push(t)) if dec else f"{t} ")
                            sys.stdout.flush()
                        if stop_now.hit:
                            break
                except Cancelled:  # Ctrl-C stopped the prompt or a step: the tokens before stand
                    stop_now.hit = True
                s = eng.stats()
        except EngineError as e:
            if not as_json:
                print()
            engine_fail(e, as_json)
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
