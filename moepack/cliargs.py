"""Checked command-line values shared by the `moepack` commands.

Click's ranges leave two holes this closes: a FloatRange accepts `nan` (every comparison with
NaN is false), and a size string such as `--budget 8G` has no click type. Bad values are usage
errors (typer.BadParameter: exit 2). The file and text checks return a message instead, so that
each command reports them with its own exit code (docs/RUNTIME.md, "Exit codes").
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import stat
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import typer

from moepack.safefs import UnsafePathError, file_kind, one_line, printable, regular_file
from moepack.sizes import parse_size

INT32_MAX = 2**31 - 1        # the C engine's int (ctx, top_k, token ids, n)
UINT64_MAX = 2**64 - 1       # the C engine's uint64_t (seed, budget bytes)
MAX_THREADS = 256            # the engine's compute pool caps threads here (kernels_pool.c)

# The signals that stop a command the way Ctrl-C does (docs/RUNTIME.md, "Exit codes"): the same
# clean stop, then exit 128 + the signal's number (130 SIGINT, 143 SIGTERM, 129 SIGHUP)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_INTERRUPTED = 130  # a command's stop; moepack.cli makes it 128 + the signal that came
_stopped_by: dict[str, int] = {}

_TOKEN_ID = re.compile(r"\s*[0-9]{1,10}\s*")   # more digits cannot be an int32 token id
# click's UsageError (typer vendors click or uses it), found from a public subclass
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def size_option(value: str | None) -> str | None:
    """Typer callback for a size option: a positive size that fits the engine's uint64."""
    if value is None:
        return None
    try:
        n = parse_size(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if not 1 <= n <= UINT64_MAX:
        raise typer.BadParameter(f"{printable(value, 40)} is {n} bytes; a size must be 1 byte to "
                                 f"{UINT64_MAX} bytes")
    return value


def finite(value: float | None) -> float | None:
    """Typer callback for a float option: refuse NaN and infinities (FloatRange lets NaN in)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def finite_range(low: float | None = None,
                 high: float | None = None) -> Callable[[float | None], float | None]:
    """Typer callback for a float option in [low, high], in place of the option's min/max:
    click checks those first and names a bound for NaN, which breaks none."""
    def check(value: float | None) -> float | None:
        finite(value)
        if value is not None and low is not None and value < low:
            raise typer.BadParameter(f"{value} is below {low}")
        if value is not None and high is not None and value > high:
            raise typer.BadParameter(f"{value} is above {high}")
        return value
    return check


def nucleus(value: float) -> float:
    """Typer callback for top-p: 0 < p <= 1 (the sampler would read 0 as "off")."""
    finite_range(high=1.0)(value)
    if value <= 0:
        raise typer.BadParameter(f"{value} is not above 0 (1 turns nucleus sampling off)")
    return value


def token_ids(value: str | None) -> str | None:
    """Typer callback for `--tokens 1,2,3`: int32 ids, checked without building big integers
    (the command then splits the checked string). An empty value is an empty list; an empty
    item (`0,,1`, `1,`) is refused, not skipped: it is a typo, not an id."""
    if value is None or not value.strip():
        return value
    for part in value.split(","):
        if not part.strip():
            raise typer.BadParameter(f"{printable(value, 40)} has an empty item: give "
                                     f"comma-separated integers from 0 to {INT32_MAX}")
        if not _TOKEN_ID.fullmatch(part) or int(part) > INT32_MAX:
            raise typer.BadParameter(f"{printable(part.strip(), 40)} is not a token id: give "
                                     f"comma-separated integers from 0 to {INT32_MAX}")
    return value


def logit_bias(values: list[str] | None) -> list[str] | None:
    """Typer callback for a repeatable `--logit-bias ID=BIAS` (OpenAI's logit_bias: an int32
    token id, a finite bias from -100 to 100, each id once); `bias_map` reads the checked list."""
    seen: set[int] = set()
    for item in values or []:
        tid, eq, bias = item.partition("=")
        if not eq or not _TOKEN_ID.fullmatch(tid) or int(tid) > INT32_MAX:
            raise typer.BadParameter(f"{printable(item, 40)} is not ID=BIAS (a token id from 0 "
                                     f"to {INT32_MAX}, =, a number from -100 to 100)")
        try:
            b = float(bias)
        except ValueError:
            b = math.nan
        if not (math.isfinite(b) and -100 <= b <= 100):
            raise typer.BadParameter(f"{printable(item, 40)}: the bias must be a finite number "
                                     "from -100 to 100")
        if int(tid) in seen:
            raise typer.BadParameter(f"token {int(tid)} is given twice")
        seen.add(int(tid))
    return values


def bias_map(values: list[str] | None) -> dict[int, float]:
    """{id: bias} of a list `logit_bias` checked."""
    return {int(t): float(b) for t, _, b in (v.partition("=") for v in values or [])}


def choice(*allowed: str) -> Callable[[str], str]:
    """Typer callback accepting only `allowed` (a str option without an Enum)."""
    def check(value: str) -> str:
        if value not in allowed:
            raise typer.BadParameter(f"{printable(value, 40)} is not one of {', '.join(allowed)}")
        return value
    return check


def utf8_problem(text: str) -> str | None:
    """Why `text` was not valid UTF-8 where it came from, or None. Undecodable bytes reach Python
    as lone surrogates (argv and stdin use surrogateescape), which no tokenizer can encode;
    prompts are UTF-8 only, never guessed."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        what = (f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF
                else f"lone surrogate U+{code:04X}")
        return f"is not valid UTF-8 ({what} at character {e.start})"
    return None


def utf8_text(value: str | None) -> str | None:
    """Typer callback for prompt text: valid UTF-8 only."""
    problem = utf8_problem(value) if value is not None else None
    if problem:
        raise typer.BadParameter(f"the text {problem}; moepack reads text as UTF-8 only")
    return value


def file_problem(path: Path, what: str = "container") -> str | None:
    """Why `path` cannot be read as a file, or None. Checked before anything opens it: opening
    a FIFO or a device for reading blocks forever."""
    try:
        regular_file(path, what)
    except UnsafePathError as e:
        return _kind(path, str(e))
    except OSError as e:
        return f"{what} {path}: {e.strerror or e}"
    return None


def _kind(path: Path, message: str) -> str:
    """safefs's message, naming a FIFO, device or socket as such."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return message
    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):  # safefs's message says those already
        return message
    return f"{message} ({file_kind(mode)})"


def error_line(message: str, label: str = "error") -> None:
    """The one error line of every command (docs/RUNTIME.md, "Exit codes"): `label: message`
    on stderr, escaped to one line (`one_line`) and never read as rich markup."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True, highlight=False).print(
        f"[red]{label}:[/red] {escape(one_line(message))}")


def fail(message: str, code: int = 1) -> NoReturn:
    """`error: message` (error_line), then exit `code` (1: the command ran and failed)."""
    error_line(message)
    raise typer.Exit(code)


def usage(message: str, ctx: typer.Context | None = None) -> NoReturn:
    """A usage error found in a command's body (options that conflict, one missing): exit 2 with
    `usage: message (see 'moepack CMD --help')`, as click's own usage errors."""
    raise _USAGE_ERROR(message, ctx)


def json_error(message: str, plan: dict | None = None, **fields: object) -> NoReturn:
    """Exit 1 with `{"error": {...}}` on stdout: the object `run --json` prints for a failure
    (docs/RUNTIME.md), its keys always present, None where the failure has no such value;
    `plan --json` adds the plan it refused beside it."""
    error = {"message": message, "engine_code": None, "code": None, "field": None,
             "offset": None, "max_ctx": None, **fields}
    print(json.dumps({"error": error, **({"plan": plan} if plan is not None else {})},
                     indent=2, sort_keys=plan is not None))
    raise typer.Exit(1)


def terminal_text(text: str) -> str:
    """Generated text for the terminal: control characters other than newline and tab escaped.
    The vocabulary comes from the container, so a token could hold an escape sequence (`--json`
    keeps the exact text)."""
    return "".join(ch.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(ch) == "Cc" and ch not in "\n\t" else ch
                   for ch in text)


def note_stop(signum: int) -> None:
    """Remember the signal that stops the command, for `interrupted_code`: the latest one (a
    Ctrl-C that stopped one chat reply must not name the SIGHUP that later ends the chat)."""
    _stopped_by["signal"] = int(signum)


def interrupted_code() -> int:
    """The exit code of an interrupted command: 128 + the stopping signal's number (130 for
    Ctrl-C, 143 for SIGTERM, 129 for SIGHUP), as a shell reports a process that signal ended."""
    return 128 + _stopped_by.get("signal", int(signal.SIGINT))
