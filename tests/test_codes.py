"""The code registry: one module per layer letter, complete entries, lifecycles, redirects.

Redirects are tested on a registry of the test's own (no code has been renamed yet), and through
the real registry's table for what users write (`guards.actions`) and `Finding.of`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import trainguard.codes as codes_pkg
from trainguard.codes import (
    LAYERS,
    LIFECYCLES,
    REDIRECTS,
    REGISTRY,
    Code,
    CodeRegistry,
    all_codes,
    render_markdown,
)
from trainguard.findings import Finding
from trainguard.guard.config import GuardsConfig

CODES_DIR = Path(codes_pkg.__file__).parent
TESTS_DIR = Path(__file__).parent

# Codes no test plants yet, and why (each is emitted by the code named).
NOT_PLANTED = {
    "H402": "doctor/compute.py: a computation that differs between two runs needs faulty hardware",
    "H404": "doctor/compute.py: throttling during a sustained burn needs a throttling device",
    "H405": "doctor/memory.py: memory that does not hold what was written needs faulty memory",
    "H429": "cli/doctor.py: every doctor process dying before rank 0 reports",
}


def _code(code: str, **kw) -> Code:
    entry = {
        "title": f"{code} title",
        "severity": "warning",
        "catches": "c",
        "why": "w",
        "fix": "f",
    }
    return Code(code=code, **{**entry, **kw})


def _layer_files(module: str) -> list[Path]:
    """The files of a letter's codes: `codes/<module>.py`, or the package `codes/<module>/`."""
    package = CODES_DIR / module
    if package.is_dir():
        return sorted(p for p in package.glob("*.py") if p.name != "__init__.py")
    return [CODES_DIR / f"{module}.py"]


def _numbers(path: Path) -> list[str]:
    return [
        kw.value.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Code"
        for kw in node.keywords
        if kw.arg == "code"
    ]


def test_one_module_per_layer_letter():
    """Each letter's codes live in its module, or, past the size a reader takes in at once, in
    its package with one file per range of numbers (docs/architecture.md, "Findings, codes,
    errors"); nothing else lives under codes/."""
    modules = {p.stem for p in CODES_DIR.glob("*.py")} - {"__init__", "__main__"}
    packages = {p.name for p in CODES_DIR.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert modules | packages == {module for module, _ in LAYERS.values()}
    assert not modules & packages
    for package in packages:  # no deeper folders: one file per range
        assert not [
            p for p in (CODES_DIR / package).iterdir() if p.is_dir() and p.name != "__pycache__"
        ], package
    for letter, (module, _) in LAYERS.items():
        for path in _layer_files(module):
            numbers = _numbers(path)
            assert numbers, path
            assert all(n.startswith(letter) for n in numbers), (path, numbers)
            assert len(path.read_text().splitlines()) <= 400, f"{path}: split it by range"
    assert {c.code for c in all_codes()} == set(REGISTRY.codes)


def test_a_layer_package_registers_every_file():
    """A letter's package imports each of its files: a file left out would register its codes
    only when something imported it directly (the registry would be incomplete)."""
    for module, _ in LAYERS.values():
        package = CODES_DIR / module
        if not package.is_dir():
            continue
        imported = {
            alias.name
            for node in ast.walk(ast.parse((package / "__init__.py").read_text()))
            if isinstance(node, ast.ImportFrom) and node.level == 1 and not node.module
            for alias in node.names
        }
        assert imported == {p.stem for p in _layer_files(module)}, module


def test_every_code_is_documented():
    for c in all_codes():
        assert re.fullmatch(r"[MNHRCDTE]\d{3}", c.code), c.code
        assert c.title and c.fix and c.false_positives, c.code
        assert c.catches and c.why, c.code  # what it catches and why it hurts, for every code
        assert c.lifecycle in LIFECYCLES, c.code
        if c.severity == "error":
            assert len(c.catches) > 40 and len(c.why) > 40, c.code


def test_every_code_is_planted_by_a_test():
    """Each code's bad case lives in some test (a fixture that must raise it), or is listed in
    NOT_PLANTED with the reason."""
    others = [p for p in TESTS_DIR.glob("*.py") if p.name != Path(__file__).name]
    text = "\n".join(p.read_text(errors="replace") for p in others)
    missing = sorted(c.code for c in all_codes() if not re.search(rf"\b{c.code}\b", text))
    assert missing == sorted(NOT_PLANTED)


def test_docs_show_each_lifecycle():
    page = render_markdown()
    assert "| code | severity | lifecycle | title |" in page
    for c in all_codes():
        assert f"| [{c.code}](#{c.code.lower()}) | {c.severity} | {c.lifecycle} |" in page
    assert "## Renamed codes" in page


def test_lifecycle_must_be_known():
    with pytest.raises(ValueError, match="lifecycle"):
        _code("R990", lifecycle="experimental")
    with pytest.raises(ValueError, match="severity"):
        _code("R990", severity="fatal")


def test_redirects_in_a_registry_of_our_own():
    reg = CodeRegistry(redirects={"R990": "R991", "R989": "R990"})
    reg.register(_code("R991"), _code("R992", lifecycle="removed"))
    assert reg.resolve("R990") == "R991" and reg.resolve("R989") == "R991"
    assert reg.get("R990").code == "R991" and reg.get("R989") is reg.get("R991")
    assert reg.resolve("R992") == "R992"
    with pytest.raises(ValueError, match="never reused"):
        reg.register(_code("R990"))  # an old number is never given to another fault
    with pytest.raises(ValueError, match="different content"):
        reg.register(_code("R991", title="another title"))
    with pytest.raises(KeyError, match="R993"):
        reg.get("R993")
    page = reg.render_markdown()
    assert "| R990 | [R991](#r991) |" in page and "| removed |" in page
    loop = CodeRegistry(redirects={"R990": "R991", "R991": "R990"})
    with pytest.raises(ValueError, match="redirect loop"):
        loop.resolve("R990")
    # Trainguard's own table: nothing renamed yet, and no redirect hides a registered code.
    assert not set(REDIRECTS) & set(REGISTRY.codes)
    assert all(REGISTRY.resolve(new) in REGISTRY.codes for new in REDIRECTS.values())


def test_renamed_codes_keep_working_where_users_write_them(monkeypatch):
    monkeypatch.setitem(REDIRECTS, "R190", "R101")
    assert GuardsConfig(actions={"R190": "halt"}).actions == {"R101": "halt"}
    f = Finding.of("R190", "a NaN")
    assert f.code == "R101" and f.severity == "error"


def test_a_removed_code_cannot_be_reported(monkeypatch):
    monkeypatch.setitem(REGISTRY.codes, "R998", _code("R998", lifecycle="removed"))
    assert REGISTRY.get("R998").lifecycle == "removed"  # still documented, number kept
    with pytest.raises(ValueError, match="removed"):
        Finding.of("R998", "should not happen")


def test_codes_looked_up_from_several_threads_at_first_use_are_all_there() -> None:
    """The registry loads on first look-up; a second thread used to see it half loaded and
    raise KeyError (two gating runs failing at once; found in review)."""
    import threading

    from trainguard.codes import Code, CodeRegistry

    registry = CodeRegistry()

    def load() -> None:
        for n in range(101, 160):
            registry.register(
                Code(
                    code=f"E{n}",
                    title="t",
                    severity="error",
                    catches="c",
                    why="w",
                    fix="f",
                )
            )
            threading.Event().wait(0.0005)  # importing the letter modules takes a while

    registry._loader = load
    errors: list[BaseException] = []

    def look() -> None:
        try:
            registry.get("E159")
        except BaseException as e:  # noqa: BLE001 - the assertion below names it
            errors.append(e)

    threads = [threading.Thread(target=look) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
