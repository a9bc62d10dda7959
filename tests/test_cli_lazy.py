"""`trainguard CMD` imports only CMD's module (issue 24, item 4: a restart pays for `run` alone,
not for the other commands' imports and typer building their parameters; docs/benchmarks.md,
the restart row). Counted in fresh interpreters through `python -m trainguard`, never timed."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import typer

import trainguard.cli as cli

# Runs `python -m trainguard ARGS...` in this process, then lists the modules it imported.
_PROBE = """
import json, runpy, sys
sys.argv = ["trainguard", *sys.argv[1:]]
try:
    runpy.run_module("trainguard", run_name="__main__")
except SystemExit as e:
    status = e.code
print(json.dumps({"status": status, "modules": sorted(sys.modules)}))
"""

# Heavy libraries that other commands use (plots, statistics, Hugging Face, Parquet, HTML):
# neither the command line nor `run`'s set-up may import them eagerly.
HEAVY = ("matplotlib", "scipy", "transformers", "pyarrow", "jinja2", "pandas", "sklearn")


def _probe(*args: str) -> dict:
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _cli_modules(modules: list[str]) -> set[str]:
    return {m.rsplit(".", 1)[1] for m in modules if m.startswith("trainguard.cli.")}


def test_resolving_run_imports_no_other_command_and_no_heavy_library() -> None:
    out = _probe("run", "--help")
    assert out["status"] == 0
    # run's own module and the package's private helpers; no other command's module.
    commands = _cli_modules(out["modules"]) & set(cli.command_modules())
    assert commands == {"run"}
    assert [m for m in out["modules"] if m.split(".")[0] in HEAVY] == []


def test_the_top_level_help_still_lists_every_command() -> None:
    out = _probe("--help")
    assert out["status"] == 0
    assert _cli_modules(out["modules"]) >= set(cli.command_modules())


def test_the_table_names_what_each_module_registers() -> None:
    registered: dict[str, set[str]] = {}
    for name in cli.command_modules():
        app = typer.Typer()
        register = getattr(importlib.import_module(f"trainguard.cli.{name}"), "register", None)
        if register is None:
            continue
        register(app)
        names = [c.name or c.callback.__name__ for c in app.registered_commands]
        names += [g.name for g in app.registered_groups]
        for command in names:
            registered.setdefault(command, set()).add(name)
    assert {k: set(v) for k, v in cli.COMMAND_MODULES.items()} == registered


def test_the_invoked_command_is_the_first_word_after_the_apps_options() -> None:
    assert cli.invoked_command(["run", "default", "--json"]) == "run"
    assert cli.invoked_command(["--traceback", "data", "dedup"]) == "data"
    assert cli.invoked_command(["--help"]) is None
    assert cli.invoked_command([]) is None
