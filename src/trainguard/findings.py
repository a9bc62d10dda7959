"""The one result type every check and monitor returns (docs/architecture.md, convention 3)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

# The severities are the code registry's (a code's default severity is one of them).
from trainguard.codes import SEVERITIES, Severity, get_code


@dataclass
class Finding:
    """A fault found by a check or monitor.

    `message` says what is wrong, `fix` what to do about it; the optional fields say where it
    applies. The JSON form (`to_dict`) has exactly these keys.
    """

    code: str
    severity: Severity
    message: str
    fix: str = ""
    step: int | None = None
    metric: str | None = None
    rank: int | None = None
    where: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        keys = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in keys})

    @classmethod
    def of(cls, code: str, message: str, **where: Any) -> Finding:
        """A finding whose severity and fix default to the code's registry entry. A renamed
        code gives its new number; a removed one is a bug (ValueError)."""
        entry = get_code(code)
        if entry.lifecycle == "removed":
            raise ValueError(f"code {entry.code} was removed: nothing may report it any more")
        severity = where.pop("severity", entry.severity)
        fix = where.pop("fix", entry.fix)
        return cls(code=entry.code, severity=severity, message=message, fix=fix, **where)

    def __str__(self) -> str:
        loc = []
        if self.step is not None:
            loc.append(f"step {self.step}")
        if self.rank is not None:
            loc.append(f"rank {self.rank}")
        if self.metric:
            loc.append(self.metric)
        if self.where:
            loc.append(self.where)
        at = f" ({', '.join(loc)})" if loc else ""
        return f"{self.code} {self.severity}{at}: {self.message}"


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


# --- episodes: consecutive findings of one fault, shown as one ---------------------------------
# A fault that lasts (a NaN that poisoned the weights, a loader that stalls for minutes) gives
# one finding per step: the data model keeps every one (guard.jsonl, metrics.jsonl, `findings`
# in JSON), and every renderer shows them grouped by `group_episodes`, one line per episode.


@dataclass
class Episode:
    """Consecutive findings of one code at one place: `count` findings from `first_step` to
    `last_step` (None for findings without a step), the worst value among them and its step,
    and the first finding (its message and fix stand for the episode)."""

    first: Finding
    first_step: int | None
    last_step: int | None
    count: int = 1
    severity: Severity = "info"
    worst_value: Any = None
    worst_step: int | None = None
    _worst: float | None = field(default=None, repr=False)  # `_badness` of the worst

    @property
    def code(self) -> str:
        return self.first.code

    @property
    def steps(self) -> str:
        """The steps as text: 'step 6', 'steps 6-12', or '' without a step."""
        if self.first_step is None:
            return ""
        if self.last_step == self.first_step:
            return f"step {self.first_step}"
        return f"steps {self.first_step}-{self.last_step}"

    def to_dict(self) -> dict[str, Any]:
        f = self.first
        return {
            "code": f.code,
            "severity": self.severity,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "count": self.count,
            "worst_value": self.worst_value,
            "worst_step": self.worst_step,
            "metric": f.metric,
            "rank": f.rank,
            "where": f.where,
            "message": f.message,
            "fix": f.fix,
        }


_RANK = {s: i for i, s in enumerate(reversed(SEVERITIES))}  # info 0 < warning 1 < error 2


def _badness(f: Finding) -> float | None:
    """How bad a finding's `data["value"]` is, to pick an episode's worst: a non-finite value
    is the worst; else its distance from the `median` it was judged against (a spike above it,
    a throughput drop below it); else its size. None without a numeric value."""
    v = f.data.get("value") if isinstance(f.data, dict) else None
    if isinstance(v, str):
        try:
            v = float(v)  # R101 stores "nan", "inf"
        except ValueError:
            return None
    if not isinstance(v, int | float) or isinstance(v, bool):
        return None
    if not math.isfinite(v):
        return math.inf
    median = f.data.get("median")
    if isinstance(median, int | float) and not isinstance(median, bool) and math.isfinite(median):
        return abs(v - median)
    return abs(v)


def _key(f: Finding) -> tuple[Any, ...]:
    layer = f.data.get("layer") if isinstance(f.data, dict) else None
    return (f.code, f.rank, f.metric, f.where, str(layer) if layer is not None else None)


class EpisodeGrouper:
    """Groups findings into episodes as they come (`trainguard watch --follow` prints an
    episode when it opens): a finding extends the open episode of its code, rank, metric and
    place when its step follows that episode's last step by at most `gap` steps (the log
    interval: a log written every 10 steps has its findings 10 steps apart). Findings without
    an integer step are episodes of their own."""

    def __init__(self, gap: int = 1) -> None:
        self.gap = max(int(gap), 1)
        self.episodes: list[Episode] = []
        self._open: dict[tuple[Any, ...], Episode] = {}

    def add(self, f: Finding) -> tuple[Episode, bool]:
        """The episode `f` joins, and whether `f` opened it."""
        step = f.step if isinstance(f.step, int) and not isinstance(f.step, bool) else None
        key = _key(f)
        ep = self._open.get(key) if step is not None else None
        if ep is not None and ep.last_step is not None and 0 <= step - ep.last_step <= self.gap:
            ep.last_step = step
            ep.count += 1
            if _RANK.get(f.severity, 0) > _RANK.get(ep.severity, 0):
                ep.severity = f.severity
            bad = _badness(f)
            if bad is not None and (ep._worst is None or bad > ep._worst):
                ep.worst_value, ep.worst_step, ep._worst = f.data["value"], step, bad
            return ep, False
        ep = Episode(first=f, first_step=step, last_step=step, severity=f.severity)
        bad = _badness(f)
        if bad is not None:
            ep.worst_value, ep.worst_step, ep._worst = f.data["value"], step, bad
        self.episodes.append(ep)
        if step is not None:
            self._open[key] = ep
        return ep, True


def group_episodes(findings: list[Finding], gap: int = 1) -> list[Episode]:
    """The findings as episodes, in the order each episode first appears (see EpisodeGrouper)."""
    grouper = EpisodeGrouper(gap)
    for f in findings:
        grouper.add(f)
    return grouper.episodes


def step_interval(steps: list[int]) -> int:
    """A log's interval in steps: the most common gap between consecutive logged steps (1 for a
    row per step, 10 for `logging_steps=10`), the gap episodes allow."""
    gaps = Counter(b - a for a, b in zip(steps, steps[1:], strict=False) if b > a)
    return gaps.most_common(1)[0][0] if gaps else 1
