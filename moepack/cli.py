"""The `moepack` command: one typer app; each subpackage registers its own subcommands."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="moepack",
    help="Convert, verify, distribute and run huge Mixture-of-Experts models from one container.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
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


@app.callback()
def _main() -> None:
    """moepack: Mixture-of-Experts containers."""


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(app)


_register_all()
