"""A layout that shows what it holds (issue 21): modules small enough to read at once, and
command-line functions that only parse options and call the work (docs/architecture.md,
"Conventions"; the work is in plain functions the tests call, tests/test_command_functions.py).

Each allowlist names what is over the limit today and only shrinks: an entry that is no longer
over it (or no longer exists) fails, so that it is removed with the split that fixed it."""

from __future__ import annotations

import ast
from pathlib import Path

import trainguard

SRC = Path(trainguard.__file__).parent
MAX_LINES = 400
MAX_COMMAND_BODY = 35  # lines of a typer function after its docstring: a call, printing, emit

# Over the limit (none since issue 21 split the last ones; an entry must come with its reason).
LONG_MODULES: set[str] = set()
# Commands over the limit (none since issue 21 moved the last bodies out).
LONG_COMMANDS: set[str] = set()


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_over_400_lines():
    modules = {p.relative_to(SRC).as_posix(): p for p in SRC.rglob("*.py")}
    over = sorted(name for name, p in modules.items() if _lines(p) > MAX_LINES)
    assert sorted(set(over) - LONG_MODULES) == [], (
        f"modules over {MAX_LINES} lines: split each by concern into modules named for what "
        "they hold"
    )
    assert sorted(LONG_MODULES - set(over)) == [], "no longer long: remove from LONG_MODULES"


def command_bodies(root: Path = SRC) -> dict[str, int]:
    """{"cli/x.py:function": lines} for each function defined inside a `register(app)`."""
    out = {}
    for path in sorted((root / "cli").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.FunctionDef) and node.name == "register"):
                continue
            for fn in ast.walk(node):
                if isinstance(fn, ast.FunctionDef) and fn is not node:
                    body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
                    if body:
                        lines = body[-1].end_lineno - body[0].lineno + 1  # type: ignore[operator]
                        out[f"cli/{path.name}:{fn.name}"] = lines
    return out


def test_command_functions_only_parse_options_and_call_the_work():
    bodies = command_bodies()
    assert len(bodies) > 15  # the walk finds the commands
    long = sorted(name for name, n in bodies.items() if n > MAX_COMMAND_BODY)
    assert sorted(set(long) - LONG_COMMANDS) == [], (
        f"command bodies over {MAX_COMMAND_BODY} lines: move the work into a plain function "
        "(in the layer that owns it, or the cli module) that the tests call"
    )
    assert sorted(LONG_COMMANDS - set(long)) == [], "no longer long: remove from LONG_COMMANDS"


def test_a_long_command_body_is_named(tmp_path: Path):
    cli = tmp_path / "cli"
    cli.mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(40))
    (cli / "big.py").write_text(
        f'def register(app):\n    @app.command()\n    def big():\n        """Doc."""\n{body}\n'
    )
    assert command_bodies(tmp_path) == {"cli/big.py:big": 40}
