"""The `moepack` command: one typer app; each subpackage registers its own subcommands.

Errors are one line on stderr with a documented exit code (docs/RUNTIME.md, "Exit codes"):
usage errors are `usage: ...` with exit 2 (`_Group.main`); an exception no command handles is
`error: ...` with exit 1 for an OSError (disk full, permissions: the environment) or exit 3 and
"this is a bug" for anything else (`_App.__call__`). `moepack --debug COMMAND ...` re-raises
the exception so Python prints the full traceback.
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from moepack.cliargs import (
    EXIT_INTERRUPTED,
    STOP_SIGNALS,
    error_line,
    interrupted_code,
    note_stop,
)

EXIT_BUG = 3
# typer vendors click (0.29+) or uses click itself: find its exception classes from a public one
_CLICK_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
_debug = {"on": False}  # set by the --debug option before any command runs


def _show_click_error(e: Any) -> None:
    """A click usage error as one line naming the command's help; no-args help as it is."""
    if type(e).__name__ == "NoArgsIsHelpError":
        e.show()
        return
    ctx = getattr(e, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    label = "usage" if e.exit_code == 2 else "error"
    error_line(e.format_message() + hint, label)


class _Group(TyperGroup):
    """The root group; shows click's errors as one line instead of the usage block."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _CLICK_ERROR as e:
            _show_click_error(e)
            sys.exit(e.exit_code)
        except typer.Abort:  # EOF at a prompt
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # a stop the command has no path of its own for (info, verify)
            typer.echo("interrupted", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None


def _unexpected(e: Exception) -> int:
    """One line for an exception no command handled; the exit code for it."""
    hint = "; `moepack --debug ...` shows the traceback"
    if isinstance(e, OSError):  # disk full, permission denied: the environment, not a bug
        error_line(str(e) + hint)
        return 1
    if isinstance(e, MemoryError):
        error_line("out of memory" + hint)
        return 1
    error_line(f"{type(e).__name__}: {e}: this is a bug, please report it{hint}", "internal error")
    return EXIT_BUG


def _stop(signum: int, frame: object) -> None:
    """SIGTERM or SIGHUP: the command stops as on Ctrl-C (its KeyboardInterrupt path: a journal
    saved, a partial file removed, workers ended). A second one ends the process at once."""
    note_stop(signum)
    for sig in STOP_SIGNALS:  # not a second KeyboardInterrupt in the middle of the clean-up
        if sig != signal.SIGINT and signal.getsignal(sig) == _stop:
            signal.signal(sig, signal.SIG_DFL)
    raise KeyboardInterrupt


def _stop_like_ctrl_c() -> None:
    """Route SIGTERM and SIGHUP through `_stop`, where their action is the default one (a SIGHUP
    that nohup ignores stays ignored). Commands with their own handlers (serve, seed) override
    it; runtime/cli.py's Interrupt catches all three while generating."""
    if threading.current_thread() is not threading.main_thread():  # signal.signal's rule
        return
    for sig in STOP_SIGNALS:
        if sig != signal.SIGINT and signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _stop)


class _App(typer.Typer):
    """The process entry point: unexpected exceptions become one line (see `_unexpected`).
    typer's CliRunner calls the click command directly, so tests still see the exception."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _stop_like_ctrl_c()
        try:
            return super().__call__(*args, **kwargs)
        except SystemExit as e:
            if e.code == EXIT_INTERRUPTED:  # 143 after SIGTERM, 129 after SIGHUP
                sys.exit(interrupted_code())
            raise
        except Exception as e:  # noqa: BLE001 (the last resort: every exception, one line)
            if _debug["on"]:
                raise
            sys.exit(_unexpected(e))


app = _App(
    name="moepack",
    help="Convert, verify, distribute and run huge Mixture-of-Experts models from one container.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Group,
)

# Each of these modules defines `register(app: typer.Typer) -> None`.
_COMMAND_MODULES = (
    "moepack.format.cli",
    "moepack.convert.cli",
    "moepack.verify.cli",
    "moepack.fetch.cli",
    "moepack.runtime.cli",
    "moepack.serve.cli",
)


def _show_version(value: bool) -> None:
    if value:
        import moepack

        print(f"moepack {moepack.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option(
        "--debug", help="On an unexpected error, show the full traceback.")] = False,
    version: Annotated[bool, typer.Option(
        "--version", callback=_show_version, is_eager=True,
        help="Print the version and exit.")] = False,
) -> None:
    """moepack: Mixture-of-Experts containers."""
    _debug["on"] = debug


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(app)


_register_all()
