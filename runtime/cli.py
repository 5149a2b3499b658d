"""The options and helpers the engine's subcommands share (`plan`, `run`, `eval`, `chat`: one
module each, runtime/cli_*.py), and their registration.

Every numeric option has a range checked at parse time (exit 2); failures after that are one
`error:` line (with --json, the error object on stdout) and exit 1 (docs/RUNTIME.md, "Exit
codes")."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

from moepack.cliargs import (
    INT32_MAX,
    MAX_THREADS,
    STOP_SIGNALS,
    UINT64_MAX,
    bias_map,
    choice,
    fail,
    file_problem,
    finite_range,
    json_error,
    logit_bias,
    note_stop,
    nucleus,
    size_option,
)
from moepack.sizes import SIZE_HELP, format_size

if TYPE_CHECKING:  # imported lazily at run time: `moepack --help` stays fast
    from moepack.runtime.engine import EngineError
    from moepack.runtime.tokenizer import Tokenizer

err_console = Console(stderr=True, soft_wrap=True, highlight=False)

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
    "--temp", callback=finite_range(0.0, 100.0), help="Temperature (0 = greedy).")]
TopPOpt = Annotated[float, typer.Option(
    "--top-p", callback=nucleus, help="Nucleus mass, above 0 (1 = off).")]
TopKOpt = Annotated[int, typer.Option(
    "--top-k", min=0, max=INT32_MAX, help="Keep the k most likely (0 = off).")]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, max=UINT64_MAX, help="Sampling seed.")]
# OpenAI's penalties (engine.LogitAdjust), over the tokens generated so far, not the prompt
PresenceOpt = Annotated[float, typer.Option(
    "--presence-penalty", callback=finite_range(-2.0, 2.0),
    help="Subtracted from the logit of each token the reply already holds.")]
BiasOpt = Annotated[list[str] | None, typer.Option(
    "--logit-bias", callback=logit_bias, metavar="ID=BIAS",
    help="Added to token ID's logit before sampling (-100..100; repeat for more tokens).")]
FrequencyOpt = Annotated[float, typer.Option(
    "--frequency-penalty", callback=finite_range(-2.0, 2.0),
    help="Times each token's count in the reply so far, subtracted from its logit.")]


def checked_bias(values: list[str] | None, eng, as_json: bool = False) -> dict[int, float]:
    """`--logit-bias` (checked by its callback) as {id: bias}; an id beyond this model's
    vocabulary closes the engine and exits 1 in one line."""
    bias = bias_map(values)
    bad = sorted(t for t in bias if t >= eng.vocab_size)
    if bad:
        eng.close()
        fail_as(f"--logit-bias: token {bad[0]} is not in this model's vocabulary "
                f"(0..{eng.vocab_size - 1})", as_json)
    return bias


def counted(n: int, word: str) -> str:
    """`1 token`, `2 tokens`."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def fail_as(message: str, as_json: bool) -> NoReturn:
    """Exit 1: with --json the error object on stdout (as an EngineError's), else the line."""
    if as_json:
        json_error(message)
    fail(message)


def require_file(file: Path, as_json: bool = False) -> None:
    """Refuse a missing path, a folder, a FIFO or a device before anything opens it (opening a
    FIFO would block forever)."""
    problem = file_problem(file)
    if problem:
        fail_as(problem, as_json)


def _warn_threads(threads: int | None) -> None:
    """More compute threads than usable cores take turns on them at every barrier: decode on
    the demo model fell from about 2400 to 100 tok/s. Allowed (a benchmark may want it), said."""
    from moepack.sysinfo import usable_cores

    cores = usable_cores()
    if threads is not None and threads > cores:
        err_console.print(f"[yellow]warning:[/yellow] --threads {threads} is more than the "
                   f"{counted(cores, 'usable core')}: threads wait for each other at every "
                   "step, which can make decode many times slower")


def _check_budget(file: Path, budget: str | None, ctx: int | None, kv: str | None) -> None:
    """Warn when a user budget exceeds usable RAM (the engine itself refuses below the floor)."""
    if not budget:
        return
    from moepack.runtime.engine import parse_bytes, plan

    p = plan(str(file), ctx, kv)
    b = parse_bytes(budget)
    if b > p["usable_ram_bytes"]:
        err_console.print(f"[yellow]warning:[/yellow] budget {format_size(b)} is above usable RAM "
                   f"{format_size(p['usable_ram_bytes'])}: the OS will page the expert cache and "
                   "cache hits turn into disk reads (a peer measured 8x slower decode)")


def open_engine(file: Path, *, budget, threads, ctx, kv=None, prefetch=True, o_direct=None,
          cache_policy="lfu", verify_reads=False, as_json=False, snapshots=0, warm=True,
          kernels="auto"):
    from moepack.runtime.engine import Cancelled, Engine, EngineError, OpenCancel

    _warn_threads(threads)
    try:
        _check_budget(file, budget, ctx, kv)
        # Ctrl-C stops a long trunk read (KeyboardInterrupt), not only after it
        with Interrupt() as stop:
            cancel = OpenCancel()
            stop.also(cancel.set)
            try:
                eng = Engine(str(file), budget=budget, threads=threads, ctx=ctx, kv=kv,
                             prefetch=prefetch, o_direct=o_direct, cache_policy=cache_policy,
                             verify_reads=verify_reads, snapshots=snapshots, warm=warm,
                             kernels=kernels, cancel=cancel)
            except Cancelled:
                raise KeyboardInterrupt from None
        if stop.hit:  # it came as the last tensor was read
            eng.close()
            raise KeyboardInterrupt
        return eng
    except EngineError as e:
        engine_fail(e, as_json, f"{file}: ")
    except (ValueError, OSError) as e:
        fail_as(f"{file}: {e}", as_json)


def engine_fail(e: EngineError, as_json: bool, where: str = "") -> NoReturn:
    """Exit 1 for an EngineError: with --json one `{"error": {...}}` object on stdout (its
    stable format code, field and offset for a program to act on), else the error line."""
    if as_json:
        json_error(where + str(e), **{k: v for k, v in e.as_dict().items() if k != "message"})
    fail(where + e.with_code())


class Interrupt:
    """Ctrl-C (SIGTERM and SIGHUP alike) while generating: a flag the token loop reads, so that
    the reply stops between two tokens with the engine's sequence intact (a KeyboardInterrupt
    could land between an engine call and its bookkeeping), and the calls given to `also`
    (Engine.cancel), so that a long prompt stops within a layer's work. Python runs its signal
    handlers only once a C call returns: the signal's wakeup byte wakes a thread that makes
    those calls meanwhile."""

    def __init__(self) -> None:
        self.hit = False
        self.signal: int | None = None  # the first stop signal handled here
        self._handled = 0  # stop signals Python has handled here (the watcher's are not counted)
        self._old: dict[int, Any] = {}  # signal -> the handler it had
        self._calls: list[Callable[[], object]] = []
        self._wake: tuple[int, int] | None = None
        self._old_fd: int | None = None  # the wakeup fd before ours (None: not replaced)
        self._watch: threading.Thread | None = None

    def also(self, call: Callable[[], object]) -> None:
        """Make `call` (from another thread) when Ctrl-C comes."""
        self._calls.append(call)

    def _on(self, signum: int, frame: object) -> None:
        self._handled += 1
        if self._handled > 1 and signum != signal.SIGINT:  # a second SIGTERM/SIGHUP: now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        note_stop(signum)
        if self.signal is None:
            self.signal = signum
        self.hit = True

    @property
    def ends(self) -> bool:
        """A SIGTERM or SIGHUP came (the command should end, not just stop its reply)."""
        return self.signal is not None and self.signal != signal.SIGINT

    def _watching(self, fd: int) -> None:
        while True:
            got = os.read(fd, 64)
            if not got:  # __exit__ closed the writing end
                return
            if any(sig in got for sig in self._old):
                self.hit = True
                for call in list(self._calls):
                    call()

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is not threading.main_thread():  # signal.signal's rule
            return self
        r, w = os.pipe()  # first: out of descriptors, nothing has changed yet
        os.set_blocking(w, False)
        self._wake = (r, w)
        try:
            self._watch = threading.Thread(target=self._watching, args=(r,), daemon=True,
                                           name="moepack-interrupt")
            self._watch.start()
            self._old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            # SIGTERM and SIGHUP stop it as Ctrl-C does; a signal ignored (nohup) stays so
            for sig in STOP_SIGNALS:
                if signal.getsignal(sig) != signal.SIG_IGN:
                    self._old[sig] = signal.signal(sig, self._on)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._wake is not None:
            for sig, handler in self._old.items():
                signal.signal(sig, handler)
            self._old = {}
            if self._old_fd is not None:
                signal.set_wakeup_fd(self._old_fd)
                self._old_fd = None
            r, w = self._wake
            os.close(w)
            if self._watch is not None and self._watch.ident is not None:  # started
                self._watch.join()
            self._watch = None
            os.close(r)
            self._wake = None


def stats_line(s: dict) -> str:
    """The one-line summary printed after `run`."""
    return (f"prompt {s['prompt_tokens']} tok @ {s['prompt_tok_s']:.2f} tok/s | "
            f"decode {s['decode_tokens']} tok @ {s['decode_tok_s']:.2f} tok/s | "
            f"cache hits {100 * s['hit_rate']:.1f}% | read {format_size(s['bytes_read'])} | "
            f"I/O wait {100 * s['io_wait_share']:.1f}% | "
            f"O_DIRECT {'on' if s['o_direct'] else 'off'}")


def ids_from(tokens: str) -> list[int]:
    """Ids from a --tokens value its callback (cliargs.token_ids) has checked."""
    return [int(t) for t in tokens.split(",") if t.strip()]


def prompt_ids(file: Path, prompt: str, tokens: str | None, as_json: bool):
    if tokens is not None:  # --tokens "" is an empty prompt, not "use the text"
        return ids_from(tokens), None
    from moepack.runtime.tokenizer import TokenizerError

    tok = open_tokenizer(file, as_json, "give the prompt as token ids with --tokens")
    try:
        return tok.encode_prompt(prompt), tok
    except TokenizerError as e:
        fail_as(str(e), as_json)


def open_tokenizer(file: Path, as_json: bool, without: str) -> Tokenizer:
    """The container's tokenizer; a malformed container exits with its format code, as the
    engine's refusal would; one without a tokenizer says what this command can do instead
    (`without`)."""
    from moepack.format.errors import FormatError
    from moepack.runtime.engine import EngineError
    from moepack.runtime.tokenizer import Tokenizer, TokenizerError

    try:
        return Tokenizer.from_container(str(file))
    except FormatError as e:
        engine_fail(EngineError.from_format(e), as_json, f"{file}: ")
    except TokenizerError as e:
        fail_as(f"{file} has no tokenizer (no tokenizer.json blob): {without}"
              if not _has_blob(file, "tokenizer.json") else str(e), as_json)
    except OSError as e:
        fail_as(str(e), as_json)


def _has_blob(file: Path, name: str) -> bool:
    """Whether the container (read once already) has a blob section `name`."""
    from moepack.format.reader import Container

    with Container.open(file) as c:
        return any(s["type"] == "blob" and s["name"] == name for s in c.sections)


def register(app: typer.Typer) -> None:
    """Add this package's subcommands to the `moepack` app."""
    from moepack.runtime.cli_chat import chat_cmd
    from moepack.runtime.cli_eval import eval_cmd
    from moepack.runtime.cli_plan import plan_cmd
    from moepack.runtime.cli_run import run_cmd

    app.command("plan")(plan_cmd)
    app.command("run")(run_cmd)
    app.command("eval")(eval_cmd)
    app.command("chat")(chat_cmd)
