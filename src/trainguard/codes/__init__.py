"""The registry of failure codes (docs/architecture.md, convention 2).

One module per layer letter holds that layer's codes (`LAYERS`: `codes/model.py` the M codes,
`codes/numerics.py` the N codes, ...), each section of a module one range of numbers; this
module gathers them into `REGISTRY`. `docs/codes.md` is generated from here by
`python -m trainguard.codes`.

A code is never reused or renumbered. Each has a `lifecycle`: `stable` (the default), `preview`
(new; its thresholds or wording may still change), `deprecated` (still emitted, to be removed),
`removed` (emitted by nothing, kept so that its number is never given to another fault: making
a finding of it is a bug). A code renamed to another number keeps working through `REDIRECTS`
(old -> new): lookups, `Finding.of` and the codes users write in a recipe (`guards.actions`)
resolve to the new code, as ruff's redirects do. None has been renamed yet.

Number ranges, so that parallel work never collides: M1xx model checks; N1xx numerics;
H1xx single-process hardware and environment, H2xx multi-process replicas and stragglers,
H4xx `trainguard doctor` (H401-H430); R1xx in-run detectors, R2xx actions and watchdog, R3xx
multi-process hangs, R4xx fire drills (R619 a drill's blind spot), R5xx reference curves
(R501-R509), R601-R605 MoE router health and data-loader stalls, R620-R629 the schedule across
resumes, R701-R709 goodput planning (`trainguard plan`); C1xx checkpoints (C120-C139 the
Checkpointer, C150-C159 resume), C2xx object storage;
D1xx corpus and shards, D2xx dedup, filters (D210-D249) and contamination (D250-D259), D3xx
shuffle quality; T1xx tokenizer; E1xx evaluation and scaling.

A letter's module that would grow past 400 lines becomes a package `codes/<module>/` with one
file per range, its `__init__` importing each (`codes/run/`, `codes/data/`); `LAYERS` still
names one module per letter.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

# A finding's severity; the registry gives each code its default (`findings.py` uses these).
Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")

Lifecycle = Literal["stable", "preview", "deprecated", "removed"]
LIFECYCLES: tuple[str, ...] = get_args(Lifecycle)

LAYERS = {  # letter -> (the module under codes/ that holds its codes, the layer's name)
    "M": ("model", "model"),
    "N": ("numerics", "numerics"),
    "H": ("hardware", "hardware"),
    "R": ("run", "run"),
    "C": ("checkpoint", "checkpoint"),
    "D": ("data", "data"),
    "T": ("tokenizer", "tokenizer"),
    "E": ("evaluation", "evaluation"),
}

REDIRECTS: dict[str, str] = {}
"""Renamed codes, old -> new (the old number is never given to another fault)."""


@dataclass(frozen=True)
class Code:
    """One failure mode: what it catches, why it hurts, what to do."""

    code: str
    title: str
    severity: Severity
    catches: str
    why: str
    fix: str
    false_positives: str = "None known."
    references: tuple[str, ...] = field(default_factory=tuple)
    lifecycle: Lifecycle = "stable"

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"code {self.code}: severity {self.severity!r} not in {SEVERITIES}")
        if self.lifecycle not in LIFECYCLES:
            raise ValueError(f"code {self.code}: lifecycle {self.lifecycle!r} not in {LIFECYCLES}")


class CodeRegistry:
    """Codes by number, and the redirects of renamed ones. `REGISTRY` is trainguard's; tests
    build their own."""

    def __init__(
        self, redirects: Mapping[str, str] | None = None, loader: Callable[[], None] | None = None
    ) -> None:
        self.codes: dict[str, Code] = {}
        self.redirects: Mapping[str, str] = redirects if redirects is not None else {}
        self._loader = loader
        # Threads look codes up at once (side-by-side gating runs): one loads, the others wait
        # for the whole registry (re-entrant: loading registers codes).
        self._loading = threading.RLock()
        self._busy = False

    def register(self, *codes: Code) -> None:
        for c in codes:
            if c.code[:1] not in LAYERS:
                raise ValueError(f"code {c.code} has no known layer letter (one of {list(LAYERS)})")
            if c.code in self.redirects:
                raise ValueError(
                    f"code {c.code} was renamed to {self.redirects[c.code]}: its number is never "
                    "reused"
                )
            if c.code in self.codes and self.codes[c.code] != c:
                raise ValueError(f"code {c.code} registered twice with different content")
            self.codes[c.code] = c

    def resolve(self, code: str) -> str:
        """`code`, or the code it was renamed to (following renames of renames)."""
        seen = [code]
        while code in self.redirects:
            code = self.redirects[code]
            if code in seen:
                raise ValueError(f"redirect loop: {' -> '.join([*seen, code])}")
            seen.append(code)
        return code

    def _load(self) -> None:
        if self._loader is None:  # loaded: the common case takes no lock
            return
        with self._loading:
            if self._loader is not None and not self._busy:  # busy: a look-up while loading
                self._busy = True
                try:
                    self._loader()
                    self._loader = None  # only once every code is in
                finally:
                    self._busy = False

    def get(self, code: str) -> Code:
        """The entry of `code` (a renamed code: of its new number); KeyError if unknown."""
        target = self.resolve(code)
        if target not in self.codes:
            self._load()  # a module may have imported just its own codes so far
        try:
            return self.codes[target]
        except KeyError:
            renamed = f" (renamed from {code})" if target != code else ""
            raise KeyError(
                f"unknown finding code {target!r}{renamed}; register it in "
                f"trainguard.codes.{LAYERS.get(target[:1], ('<letter>',))[0]}"
            ) from None

    def all(self) -> list[Code]:
        self._load()
        return sorted(self.codes.values(), key=lambda c: (list(LAYERS).index(c.code[0]), c.code))

    def render_markdown(self) -> str:
        codes = self.all()
        lines = [
            "# Failure codes",
            "",
            "Generated from `trainguard.codes` by `python -m trainguard.codes > docs/codes.md`.",
            "A code is never reused or renumbered. Lifecycle: `stable`; `preview` (new, may still "
            "change); `deprecated` (still emitted, to be removed); `removed` (emitted by nothing, "
            "its number kept).",
            "",
            "| code | severity | lifecycle | title |",
            "|---|---|---|---|",
        ]
        for c in codes:
            lines.append(
                f"| [{c.code}](#{c.code.lower()}) | {c.severity} | {c.lifecycle} | {c.title} |"
            )
        lines += ["", "## Renamed codes", ""]
        if self.redirects:
            lines += ["| old | now |", "|---|---|"]
            lines += [f"| {old} | [{new}](#{new.lower()}) |" for old, new in self.redirects.items()]
        else:
            lines.append("None yet.")
        for c in codes:
            lines += [
                "",
                f"## {c.code}",
                "",
                f"**{c.title}** ({LAYERS[c.code[0]][1]} layer, default severity {c.severity}, "
                f"{c.lifecycle})",
                "",
                f"- **Catches:** {c.catches}",
                f"- **Why it hurts:** {c.why}",
                f"- **What to do:** {c.fix}",
                f"- **Known false positives:** {c.false_positives}",
            ]
            if c.references:
                lines.append("- **References:** " + "; ".join(c.references))
        return "\n".join(lines) + "\n"


def _load_all() -> None:
    # Each letter's module registers its codes on import.
    for module, _ in LAYERS.values():
        importlib.import_module(f"{__name__}.{module}")


REGISTRY = CodeRegistry(REDIRECTS, loader=_load_all)


def register(*codes: Code) -> None:
    REGISTRY.register(*codes)


def resolve(code: str) -> str:
    return REGISTRY.resolve(code)


def get_code(code: str) -> Code:
    return REGISTRY.get(code)


def all_codes() -> list[Code]:
    return REGISTRY.all()


def render_markdown() -> str:
    return REGISTRY.render_markdown()
