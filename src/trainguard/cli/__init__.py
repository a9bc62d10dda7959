"""The `trainguard` command line.

Each module in this package that defines `register(app)` adds its commands; the app is
assembled by discovery so that commands live next to nothing but their own rendering. `main`
registers only the invoked command's modules (`COMMAND_MODULES`), `app` every module.
Only the CLI prints and exits; checks return findings (docs/architecture.md, convention 4).
Every command runs inside the one error handler (`common.exit_statuses`, through the app's
group class); `--traceback` before the command shows a trainguard error's traceback instead of
its message.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from typing import Any

# Before torch loads OpenMP: threads that spin while they wait make every step several times
# slower when the machine is shared or oversubscribed (measured 4x on 2 busy cores), and
# waiting passively costs nothing measurable on an idle machine. A user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer

from trainguard.cli.common import TrainguardGroup

# The modules that register each top-level command. `main` imports only the invoked command's
# module(s): a restart then pays neither for the other commands' imports nor for typer building
# their parameters (docs/benchmarks.md, the restart row). Anything else (no command, `--help`, a
# name not listed here) registers every module, so a new module works before it is listed;
# tests/test_cli_lazy.py checks this table against what the modules register.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "batch": ("batch",),
    "check-model": ("check_model",),
    "check-precision": ("check_precision",),
    "check-tokenizer": ("check_tokenizer",),
    "checkpoint": ("checkpoint",),
    "data": (
        "data_ablate",
        "data_check_chat",
        "data_contamination",
        "data_dedup",
        "data_filter",
        "data_inspect",
        "data_order_check",
        "data_prepare",
    ),
    "doctor": ("doctor",),
    "drill": ("drill",),
    "eval": ("eval",),
    "plan": ("plan",),
    "recipes": ("recipes",),
    "reference": ("reference",),
    "report": ("report",),
    "run": ("run",),
    "scale": ("scale",),
    "watch": ("watch",),
}
_HELP = "Keeps LLM training runs from failing silently: pre-flight checks, guards, fire drills."


def _options(
    traceback: bool = typer.Option(
        False,
        "--traceback",
        help="For developers: on an error, raise it with its traceback instead of printing "
        "the message (the exit status is then the interpreter's, 1).",
    ),
) -> None:
    """Keeps LLM training runs from failing silently: pre-flight checks, guards, fire drills."""


def command_modules() -> list[str]:
    """Every module of this package that may define `register(app)`, by name."""
    return [
        info.name
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name)
        if not info.name.startswith("_") and info.name != "common"
    ]


def build_app(modules: list[str] | tuple[str, ...] | None = None) -> typer.Typer:
    """The `trainguard` app with the commands of `modules` (default: all of them)."""
    app = typer.Typer(
        cls=TrainguardGroup,
        name="trainguard",
        help=_HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    app.callback()(_options)
    for name in command_modules() if modules is None else modules:
        register = getattr(importlib.import_module(f"{__name__}.{name}"), "register", None)
        if register is not None:
            register(app)
    return app


def invoked_command(argv: list[str]) -> str | None:
    """The top-level command `argv` (without the program name) names, if any: the first word
    after the app's own options (`--traceback`); None for `--help`, no command or an option."""
    for arg in argv:
        if arg == "--traceback":
            continue
        return None if arg.startswith("-") else arg
    return None


def __getattr__(name: str) -> Any:
    # `trainguard.cli.app` (what tests and embedders invoke) has every command; built on first
    # use so that `main` does not build it too.
    if name == "app":
        app = build_app()
        globals()["app"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    from trainguard.cli._signals import graceful_interrupts
    from trainguard.util.processes import die_with_launcher

    die_with_launcher()  # a worker of a trainguard launcher ends with it (util/processes.py)

    app = build_app(COMMAND_MODULES.get(invoked_command(sys.argv[1:]) or ""))
    with graceful_interrupts():
        app()
