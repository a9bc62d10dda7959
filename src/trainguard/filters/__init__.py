"""Heuristic quality filters with stable codes (D210-D299), one module per rule family.

`apply_rules(text)` returns the flagged spans of every rule; a document with no flags is kept.
Thresholds default to Gopher's (Rae et al. 2021); see `FilterConfig` and codes/data/filters.py.
"""

from trainguard.filters.base import Doc, FilterConfig, Flag
from trainguard.filters.registry import ALL_CODES, RULES, Rule, apply_rules, reasons, select_rules

__all__ = [
    "ALL_CODES",
    "RULES",
    "Doc",
    "FilterConfig",
    "Flag",
    "Rule",
    "apply_rules",
    "reasons",
    "select_rules",
]
