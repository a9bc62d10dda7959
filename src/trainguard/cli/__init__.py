"""The `trainguard` command line.

Each module in this package that defines `register(app)` adds its commands; the app is
assembled by discovery so that commands live next to nothing but their own rendering.
Only the CLI prints and exits; checks return findings (docs/architecture.md, convention 4).
Every command runs inside the one error handler (`common.exit_statuses`, through the app's
group class); `--traceback` before the command shows a trainguard error's traceback instead of
its message.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

# Before torch loads OpenMP: threads that spin while they wait make every step several times
# slower when the machine is shared or oversubscribed (measured 4x on 2 busy cores), and
# waiting passively costs nothing measurable on an idle machine. A user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer

from trainguard.cli.common import TrainguardGroup

app = typer.Typer(
    cls=TrainguardGroup,
    name="trainguard",
    help="Keeps LLM training runs from failing silently: pre-flight checks, guards, fire drills.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _options(
    traceback: bool = typer.Option(
        False,
        "--traceback",
        help="For developers: on an error, raise it with its traceback instead of printing "
        "the message (the exit status is then the interpreter's, 1).",
    ),
) -> None:
    """Keeps LLM training runs from failing silently: pre-flight checks, guards, fire drills."""


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name == "common":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_commands()


def main() -> None:
    from trainguard.cli._signals import graceful_interrupts
    from trainguard.util.processes import die_with_launcher

    die_with_launcher()  # a worker of a trainguard launcher ends with it (util/processes.py)

    with graceful_interrupts():
        app()
