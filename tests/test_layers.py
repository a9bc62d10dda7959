"""Imports go downward only: the floors of docs/architecture.md ("Layers"), checked on the source.

Every module's imports are read with `ast`: module-level ones, those inside functions and under
`if TYPE_CHECKING:` (a type is a dependency too), relative ones, `importlib.import_module` of a
literal name, and `from trainguard import Name` (the lazy public names, resolved to the module
that defines them). Importing `a.b.c` also runs the packages `a` and `a.b`: a package's
`__init__` sits on the lowest floor of anything inside it, so it must import nothing above that
(a package holding a `config.py` keeps an `__init__` that imports nothing above the config floor).
A module may import its own floor and the floors below; each import that climbs is named with its
file and line. Nor may modules import each other in a circle, on one floor or across: the same
imports form a graph whose strongly connected components (Tarjan) are the circles, each named
with its modules and the import lines that close it. The package's `if TYPE_CHECKING:` block
mirrors the lazy names for type checkers and counts as they do (it must equal `_LAZY`).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import trainguard

SRC = Path(trainguard.__file__).resolve().parent.parent

# The floors, lowest first (docs/architecture.md draws them). Keys are the packages or modules
# directly under `trainguard`; every `config.py` anywhere is on floor 1 whatever its package.
FLOORS: dict[str, int] = {
    # 0 base: what every module may use
    "errors": 0,
    "findings": 0,
    "codes": 0,
    "util": 0,
    # 1 config: the recipe schema, pure pydantic (+ every */config.py); recipes are its YAML
    "config": 1,
    "recipes": 1,
    # 2 primitives: data, the model, numerics, metric logs, reference curves, detectors,
    # checkpoints, faults
    "data": 2,
    "model": 2,
    "numerics": 2,
    "metrics": 2,
    "reference": 2,
    "checkpoint": 2,
    "faults": 2,
    # 3 parts: each public part and check built from the primitives
    "guard": 3,
    "checks": 3,
    "evals": 3,
    "dedup": 3,
    "filters": 3,
    "scaling": 3,
    "ablation": 3,
    "goodput": 3,
    "report": 3,
    "doctor": 3,
    # 4 the run, composed from the parts
    "train": 4,
    # 5 what drives or embeds a run: fire drills, other trainers
    "drills": 5,
    "integrations": 5,
    # 6 the command line
    "cli": 6,
    "__main__": 6,
}

# Known upward imports (none since the run's rebuild moved the fault plan below train/); an
# entry that no longer matches an import fails the test, so this list only shrinks.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

# `train/guarded_run.py` is the top of the run: only the command line (and the lazy public name
# `trainguard.run_recipe`) may import it; parts get a narrow context instead (issue 11).
RUN = "trainguard.train.guarded_run"
ALLOWED_RUN_IMPORTERS: dict[str, str] = {}  # callbacks get a narrow context instead

# Circles between modules that are known and justified in docs/architecture.md ("Circles"): the
# modules of one circle -> why it stays. At most one; an entry that no longer matches a circle
# fails the test.
ALLOWED_CIRCLES: dict[frozenset[str], str] = {}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    where: str  # path:line

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.imported}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / "trainguard").rglob("*.py"))}


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return name in modules and modules[name].name == "__init__.py"


def lazy_names(root: Path) -> dict[str, str]:
    """`trainguard._LAZY`: the public names `from trainguard import X` resolves lazily."""
    tree = ast.parse((root / "trainguard" / "__init__.py").read_text())
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "_LAZY":
            return ast.literal_eval(node.value)
    return {}


def type_checking_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    """The `from ... import ...` statements of a module's top-level `if TYPE_CHECKING:` blocks."""
    found = []
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        name = getattr(test, "id", None) or getattr(test, "attr", None)
        if name == "TYPE_CHECKING":
            found += [n for n in node.body if isinstance(n, ast.ImportFrom)]
    return found


def lazy_mirror(tree: ast.Module, lazy: dict[str, str]) -> list[ast.ImportFrom]:
    """The package's `if TYPE_CHECKING:` imports that are exactly lazy names (`from M import X
    as X` with `_LAZY["X"] == M`): the lazy table for type checkers, never run. Any other
    import there counts as an import of the package."""
    return [
        node
        for node in type_checking_imports(tree)
        if all(lazy.get(a.name) == node.module and a.asname in (None, a.name) for a in node.names)
    ]


def imports_of(name: str, path: Path, modules: dict[str, Path], lazy: dict[str, str]):
    """Every trainguard module `name` imports, wherever the import statement sits."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    where = f"{path.relative_to(SRC) if path.is_relative_to(SRC) else path}"
    mirror = {id(n) for n in lazy_mirror(tree, lazy)} if name == "trainguard" else set()
    for node in ast.walk(tree):
        if id(node) in mirror:
            continue  # as `from trainguard import X` is resolved: to the module, not the package
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if base == "trainguard" and alias.name in lazy:
                    targets.append(lazy[alias.name])
                else:
                    targets.append(sub if sub in modules else base)
        elif isinstance(node, ast.Call):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0] if node.args else None
            if fname == "import_module" and isinstance(arg, ast.Constant):
                targets = [str(arg.value)]
        for target in targets:
            if target == "trainguard" or target.startswith("trainguard."):
                yield Import(name, target, f"{where}:{node.lineno}")


def with_parents(imported: str) -> list[str]:
    """Importing a.b.c runs a, a.b and a.b.c."""
    parts = imported.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def own_floor(name: str) -> int | None:
    parts = name.split(".")
    if parts[-1] == "config" and len(parts) > 1:
        return 1
    if len(parts) == 1:
        return 0  # the package itself: its version and the lazy table of public names
    return FLOORS.get(parts[1])


def floor_of(name: str, modules: dict[str, Path]) -> int | None:
    """A module's floor; a package's `__init__`: the lowest floor inside it (every import of
    anything inside runs it)."""
    if _is_package(name, modules):
        inside = [own_floor(m) for m in modules if m == name or m.startswith(name + ".")]
        known = [f for f in inside if f is not None]
        return min(known) if known else None
    return own_floor(name)


def check(root: Path) -> tuple[list[str], list[str], set]:
    """(upward imports, modules without a floor, allowlist entries used)."""
    modules = all_modules(root)
    lazy = lazy_names(root)
    upward, unplaced, used = [], [], set()
    for name, path in modules.items():
        mine = floor_of(name, modules)
        if mine is None:
            unplaced.append(name)
            continue
        for imp in imports_of(name, path, modules, lazy):
            floors = []
            for target in with_parents(imp.imported):
                if target == name or name.startswith(target + "."):
                    continue  # its own package: already running
                theirs = floor_of(target, modules)
                if theirs is None:
                    unplaced.append(target)
                else:
                    floors.append(theirs)
            theirs = max(floors, default=0)
            if theirs > mine:
                if (name, imp.imported) in ALLOWED_UPWARD:
                    used.add((name, imp.imported))
                else:
                    upward.append(
                        f"{imp.where}: {name} (floor {mine}) imports {imp.imported} "
                        f"(floor {theirs})"
                    )
            if imp.imported == RUN and not (name.startswith("trainguard.cli") or name == RUN):
                if name in ALLOWED_RUN_IMPORTERS:
                    used.add(name)
                else:
                    upward.append(f"{imp.where}: {name} imports {RUN} (only the CLI may)")
    return sorted(set(upward)), sorted(set(unplaced)), used


def test_imports_go_downward_only():
    upward, unplaced, used = check(SRC)
    assert unplaced == [], "modules without a floor: add them to FLOORS and docs/architecture.md"
    assert upward == [], "imports that climb a floor:\n" + "\n".join(upward)
    stale = (set(ALLOWED_UPWARD) | set(ALLOWED_RUN_IMPORTERS)) - used
    assert not stale, f"allowlist entries that no longer match an import (delete them): {stale}"
    assert all(k[0].startswith("trainguard.train.") for k in ALLOWED_UPWARD)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of `graph` (node -> the nodes it points to),
    iterative (no recursion limit); each component sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> tuple[str, Iterator[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return node, iter(sorted(graph.get(node, ())))

    for root in sorted(graph):
        if root in index:
            continue
        work = [visit(root)]
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    work.append(visit(child))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:  # every child seen: `node` is done
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:  # the root of a component: pop it off the stack
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def circles(root: Path) -> dict[frozenset[str], list[str]]:
    """Every circle between modules (a strongly connected component of more than one module),
    with the import lines inside it."""
    modules = all_modules(root)
    lazy = lazy_names(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    lines: dict[tuple[str, str], list[Import]] = {}
    for name, path in modules.items():
        for imp in imports_of(name, path, modules, lazy):
            if imp.imported != name:
                graph[name].add(imp.imported)
                lines.setdefault((name, imp.imported), []).append(imp)
    found = {}
    for component in strongly_connected(graph):
        if len(component) > 1:
            inside = set(component)
            found[frozenset(component)] = sorted(
                {
                    str(imp)
                    for (a, b), imps in lines.items()
                    if a in inside and b in inside
                    for imp in imps
                }
            )
    return found


def test_no_circles_between_modules():
    """No two modules import each other, directly or around a ring: a circle makes the import
    order matter and hides which of the two is the lower one (docs/architecture.md)."""
    found = circles(SRC)
    unexpected = {c: imps for c, imps in found.items() if c not in ALLOWED_CIRCLES}
    report = [
        f"circle of {len(c)} modules: {', '.join(sorted(c))}\n    " + "\n    ".join(imps)
        for c, imps in sorted(unexpected.items(), key=lambda kv: sorted(kv[0]))
    ]
    assert not unexpected, "modules that import each other:\n" + "\n".join(report)
    stale = set(ALLOWED_CIRCLES) - set(found)
    assert not stale, f"allowed circles that no longer exist (delete them): {stale}"
    assert len(ALLOWED_CIRCLES) <= 1  # and that one named and justified in architecture.md
    page = (SRC.parent / "docs" / "architecture.md").read_text()
    for circle in ALLOWED_CIRCLES:
        assert all(m.removeprefix("trainguard.").replace(".", "/") in page for m in circle)


def test_the_lazy_names_are_visible_to_type_checkers():
    """`if TYPE_CHECKING:` in trainguard/__init__.py imports each lazy public name from the
    module `_LAZY` loads it from, as an explicit re-export (`X as X`), and nothing else; and the
    public names include the exit table and the run's result."""
    lazy = lazy_names(SRC)
    tree = ast.parse((SRC / "trainguard" / "__init__.py").read_text())
    typed = {
        (alias.asname or alias.name): node.module
        for node in type_checking_imports(tree)
        for alias in node.names
    }
    assert typed == lazy
    assert len(lazy_mirror(tree, lazy)) == len(type_checking_imports(tree))
    assert all(a.asname == a.name for n in type_checking_imports(tree) for a in n.names)
    from trainguard.errors import ExitStatus
    from trainguard.train.outcome import RunResult

    assert trainguard.ExitStatus is ExitStatus and trainguard.RunResult is RunResult
    assert {"ExitStatus", "RunResult"} <= set(trainguard.__all__)


def test_a_planted_circle_is_named(tmp_path):
    """The circle checker on a small tree: a pair through `TYPE_CHECKING`, a ring of three
    through a function-level import, each named with its modules and lines; a chain that does
    not close, and the package's lazy mirror, are no circle."""
    root = _plant(
        tmp_path,
        {
            "trainguard/__init__.py": """\
                from typing import TYPE_CHECKING
                _LAZY = {"Loop": "trainguard.train.loop"}
                if TYPE_CHECKING:
                    from trainguard.train.loop import Loop as Loop
                """,
            "trainguard/errors.py": "",
            "trainguard/train/__init__.py": "",
            "trainguard/train/spine.py": "from trainguard.train.steps import step\n",
            "trainguard/train/steps.py": """\
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from trainguard.train.spine import Loop
                """,
            "trainguard/train/loop.py": "import trainguard\nfrom trainguard.errors import x\n",
            "trainguard/drills/__init__.py": "",
            "trainguard/drills/a.py": "from trainguard.drills import b\n",
            "trainguard/drills/b.py": "from . import c\n",
            "trainguard/drills/c.py": "def f():\n    from trainguard.drills.a import g\n",
        },
    )
    found = circles(root)
    pair = frozenset({"trainguard.train.spine", "trainguard.train.steps"})
    ring = frozenset({"trainguard.drills.a", "trainguard.drills.b", "trainguard.drills.c"})
    assert set(found) == {pair, ring}
    named = {c: [line.rpartition("/src/")[2] for line in imps] for c, imps in found.items()}
    assert named[pair] == [
        "trainguard/train/spine.py:1: trainguard.train.spine imports trainguard.train.steps",
        "trainguard/train/steps.py:3: trainguard.train.steps imports trainguard.train.spine",
    ]
    assert (
        "trainguard/drills/c.py:2: trainguard.drills.c imports trainguard.drills.a" in named[ring]
    )
    assert len(named[ring]) == 3


def test_tarjan_finds_every_component():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"f", "a"}}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["d", "e"], ["f"]]
    chain = {str(i): {str(i + 1)} for i in range(5000)}  # deep: no recursion limit
    assert len(strongly_connected(chain)) == 5001


def test_the_diagram_matches_the_floors():
    """docs/architecture.md draws each package on the floor this test enforces."""
    page = (SRC.parent / "docs" / "architecture.md").read_text()
    drawn: dict[str, int] = {}
    for m in re.finditer(r"^ floor (\d)  (.+)$", page, flags=re.M):
        for token in m.group(2).split("  "):
            name = token.strip().removesuffix("/").removesuffix(".py")
            if name and " " not in name:
                drawn[name] = int(m.group(1))
    expected = {k: v for k, v in FLOORS.items() if k != "__main__"}
    assert {k: drawn.get(k) for k in expected} == expected


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "src"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_a_planted_upward_import_is_named(tmp_path):
    """The checker on a small tree: each way of importing upward is caught, with its line."""
    root = _plant(
        tmp_path,
        {
            "trainguard/__init__.py": '_LAZY = {"Guard": "trainguard.guard.core"}\n',
            "trainguard/errors.py": "",
            "trainguard/guard/core.py": "from trainguard.errors import x\n",
            "trainguard/train/__init__.py": "",
            "trainguard/train/guarded_run.py": "",
            "trainguard/guard/__init__.py": "from trainguard.guard import core\n",
            "trainguard/guard/config.py": "",
            "trainguard/data/__init__.py": "",
            "trainguard/data/corpus.py": """\
                from typing import TYPE_CHECKING
                from trainguard.errors import BadInputError
                if TYPE_CHECKING:
                    from trainguard.guard.core import Guard
                def late():
                    from ..train import guarded_run
                    import importlib
                    importlib.import_module("trainguard.train.guarded_run")
                from trainguard import Guard as G
                """,
            "trainguard/nowhere/__init__.py": "",
        },
    )
    upward, unplaced, _ = check(root)
    assert unplaced == ["trainguard.nowhere"]
    text = "\n".join(upward)
    corpus = "trainguard/data/corpus.py:{}: trainguard.data.corpus"
    assert corpus.format(4) + " (floor 2) imports trainguard.guard.core (floor 3)" in text
    assert corpus.format(6) + " (floor 2) imports trainguard.train.guarded_run (floor 4)" in text
    assert corpus.format(8) + " (floor 2) imports trainguard.train.guarded_run (floor 4)" in text
    assert corpus.format(9) + " (floor 2) imports trainguard.guard.core (floor 3)" in text
    assert corpus.format(6) + " imports trainguard.train.guarded_run (only the CLI may)" in text
    # guard/ holds a config.py (floor 1): its __init__ runs for the config, so it may not
    # import the Guard.
    assert "trainguard.guard (floor 1) imports trainguard.guard.core (floor 3)" in text
    assert "errors" not in text


def test_loading_a_recipe_stays_on_the_config_floor():
    """What the ast check cannot see (a package's import-time side effects, lazy loads) at run
    time: loading and validating a recipe imports no module above floor 1."""
    code = (
        "import sys\n"
        "from trainguard.config.load import load_recipe\n"
        "load_recipe('default', ['guards.actions={R102: halt}'])\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith(('trainguard', 'torch'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    modules = all_modules(SRC)
    above = [m for m in out if (floor_of(m, modules) or 0) > 1]
    assert above == [], f"loading a recipe imported {above}"
    assert "trainguard.guard.config" in out and "torch" not in out  # nor torch


def test_nothing_cites_a_design_file_outside_the_repo():
    """The conventions live in docs/architecture.md; no file points at a design note the repo
    does not hold."""
    name = "design" + ".md"  # spelled apart so that this file does not cite it either
    repo = SRC.parent
    files = [repo / "README.md", repo / "pyproject.toml", repo / "Makefile"]
    for folder in ("src", "tests", "docs", "examples", "benchmarks"):
        files += [p for p in (repo / folder).rglob("*") if p.suffix in (".py", ".md", ".j2")]
    citing = [
        str(p.relative_to(repo))
        for p in files
        if p.is_file() and name in p.read_text(errors="replace").lower()
    ]
    assert citing == []
