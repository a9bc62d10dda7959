"""The one result type every check and monitor returns (docs/architecture.md, convention 3)."""

from __future__ import annotations

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
