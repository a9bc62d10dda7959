"""The registry of failure codes (DESIGN.md, convention 2).

A code is never reused or renumbered. Each layer of the failure catalogue keeps its codes in
its own module (`codes/model.py` holds M-codes, ...); this module gathers them. `docs/codes.md`
is generated from here by `python -m trainguard.codes`.

Number ranges, so that parallel work never collides: M1xx model checks; N1xx numerics;
H1xx single-process hardware and environment, H2xx multi-process replicas and stragglers,
H4xx `trainguard doctor` (H401-H430);
R1xx in-run detectors, R2xx actions and watchdog, R3xx multi-process hangs,
R4xx fire drills, R5xx reference curves (R501-R509), R601-R605 MoE router health and
data-loader stalls (R619 a drill's blind spot); C1xx checkpoints,
C2xx object storage; D1xx corpus and shards, D2xx dedup and filters, D3xx shuffle quality;
T1xx tokenizer; E1xx evaluation and scaling.

Layers: M model, N numerics, H hardware, R run, C checkpoint, D data, T tokenizer, E evaluation.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field

from trainguard.findings import Severity

LAYERS = {
    "M": ("model", "model"),
    "N": ("numerics", "numerics"),
    "H": ("hardware", "hardware"),
    "R": ("run", "run"),
    "C": ("checkpoint", "checkpoint"),
    "D": ("data", "data"),
    "T": ("tokenizer", "tokenizer"),
    "E": ("evaluation", "evaluation"),
}


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


REGISTRY: dict[str, Code] = {}


def register(*codes: Code) -> None:
    for c in codes:
        if c.code[0] not in LAYERS:
            raise ValueError(f"code {c.code} has no known layer letter (one of {sorted(LAYERS)})")
        if c.code in REGISTRY and REGISTRY[c.code] != c:
            raise ValueError(f"code {c.code} registered twice with different content")
        REGISTRY[c.code] = c


_loaded = False


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    # Every module in this package registers codes on import; one module per layer or topic.
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):  # __main__ renders the docs; it registers nothing
            continue
        importlib.import_module(f"{__name__}.{info.name}")


def get_code(code: str) -> Code:
    if code not in REGISTRY:
        _load_all()  # a module may have imported just its own codes so far
    try:
        return REGISTRY[code]
    except KeyError:
        raise KeyError(f"unknown finding code {code!r}; register it in trainguard/codes/") from None


def all_codes() -> list[Code]:
    _load_all()
    return sorted(REGISTRY.values(), key=lambda c: (list(LAYERS).index(c.code[0]), c.code))


def render_markdown() -> str:
    lines = [
        "# Failure codes",
        "",
        "Generated from `trainguard.codes` by `python -m trainguard.codes > docs/codes.md`.",
        "A code is never reused or renumbered.",
        "",
        "| code | severity | title |",
        "|---|---|---|",
    ]
    codes = all_codes()
    for c in codes:
        lines.append(f"| [{c.code}](#{c.code.lower()}) | {c.severity} | {c.title} |")
    for c in codes:
        lines += [
            "",
            f"## {c.code}",
            "",
            f"**{c.title}** ({LAYERS[c.code[0]][1]} layer, default severity {c.severity})",
            "",
            f"- **Catches:** {c.catches}",
            f"- **Why it hurts:** {c.why}",
            f"- **What to do:** {c.fix}",
            f"- **Known false positives:** {c.false_positives}",
        ]
        if c.references:
            lines.append("- **References:** " + "; ".join(c.references))
    return "\n".join(lines) + "\n"
