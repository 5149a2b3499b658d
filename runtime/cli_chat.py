"""`moepack chat`: a conversation in the terminal through the chat template."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

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
    open_engine,
    open_tokenizer,
    require_file,
)

from moepack.cliargs import (
    EXIT_INTERRUPTED,
    INT32_MAX,
    fail,
    terminal_text,
    utf8_problem,
    utf8_text,
)

if TYPE_CHECKING:  # imported lazily at run time: `moepack --help` stays fast
    from moepack.runtime.tokenizer import Tokenizer


def chat_cmd(
    file: FileArg,
    max_tokens: Annotated[int, typer.Option(
        "-n", "--max-tokens", min=1, max=INT32_MAX, help="Per reply.")] = 256,
    temp: TempOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = 0,
    presence_penalty: PresenceOpt = 0.0,
    frequency_penalty: FrequencyOpt = 0.0,
    logit_bias: BiasOpt = None,
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
    from moepack.runtime.engine import Cancelled, EngineError
    from moepack.runtime.prefix import PrefixReuse
    from moepack.runtime.tokenizer import StreamDecoder, generation_eos_ids, stop_ids

    require_file(file)
    tok = open_tokenizer(file, False, "chat needs one (run and eval take token ids with --tokens)")
    if not tok.chat_template:
        fail("the container has no chat template")
    eng = open_engine(file, budget=budget, threads=threads, ctx=ctx, kv=kv, snapshots=1,
                kernels=kernels)
    bias = checked_bias(logit_bias, eng)
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
                err_console.print(f"[yellow]context full:[/yellow] this turn's "
                           f"{counted(len(fresh), 'token')} do not fit ctx {eng.ctx}{limit}: "
                           "not sent; the conversation goes on")
                continue
            start_over, n = fit
            if start_over:
                err_console.print("[yellow]context full: starting over[/yellow]")
                messages, ids = list(first), fresh
                eng.reset()
            if n < max_tokens and not capped_said:
                err_console.print(f"[yellow]note:[/yellow] replies stop where the context (ctx "
                           f"{eng.ctx}) is full, this one after {counted(n, 'token')} "
                           f"(-n {max_tokens})")
                capped_said = True
            messages.append(user)
            new = ids[reuse.rewind(ids):]
            dec, reply = StreamDecoder(tok), []
            try:
                with Interrupt() as stop_now:
                    stop_now.also(eng.cancel)
                    for t in eng.generate(new, n, temperature=temp, top_k=top_k, top_p=top_p,
                                          seed=seed, reset=False, stop=stop,
                                          presence_penalty=presence_penalty,
                                          frequency_penalty=frequency_penalty,
                                          logit_bias=bias):
                        if not reply:  # the prompt is in, the reply not yet: a turn boundary
                            reuse.mark()
                        reply.append(t)
                        if t not in stop:
                            sys.stdout.write(terminal_text(dec.push(t)))
                            sys.stdout.flush()
                        if stop_now.hit:
                            break
            except Cancelled:  # Ctrl-C stopped the prompt or a step: what came before stands
                stop_now.hit = True
            except EngineError as e:
                engine_fail(e, False)
            print()
            if stop_now.ends:  # SIGTERM or SIGHUP end the chat; Ctrl-C stops only the reply
                err_console.print("[yellow]interrupted[/yellow]")
                raise typer.Exit(EXIT_INTERRUPTED)
            if stop_now.hit and not reply:  # stopped in its prompt: the message was not sent
                messages.pop()
                err_console.print("[yellow]interrupted: the message was not sent[/yellow]")
                continue
            if stop_now.hit:  # the reply so far stays in the conversation, as shown
                err_console.print("[yellow]interrupted[/yellow]")
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
        line = input(_prompt())
    except EOFError:
        return None
    except KeyboardInterrupt:
        print()  # the shell's prompt starts on a line of its own
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except UnicodeDecodeError as e:
        fail(f"input is not valid UTF-8 (byte 0x{e.object[e.start]:02x}); "
              "moepack reads text as UTF-8 only")
    problem = utf8_problem(line)
    if problem:
        fail(f"input {problem}; moepack reads text as UTF-8 only")
    return line


def _prompt() -> str:
    """`> ` for a person at a terminal; nothing when stdin is a file or a pipe, so that stdout
    holds the replies only. With stdout redirected the prompt goes to stderr (input() would
    write it into the output)."""
    if not sys.stdin.isatty():
        return ""
    if sys.stdout.isatty():
        return "> "
    sys.stderr.write("> ")
    sys.stderr.flush()
    return ""


def _encode_chat(tok: Tokenizer, messages: list[dict]) -> list[int]:
    from moepack.runtime.tokenizer import TokenizerError

    try:
        return tok.encode_chat(messages)
    except TokenizerError as e:
        fail(str(e))
