"""The drill matrix: one row per drill, its verdict as findings, and its table forms."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rich.table import Table

from trainguard.findings import Finding

# A run that recovered ends within this fraction of the clean run's final validation loss:
# skipping one batch moves it by well under 1% at drill settings; a run that kept a corrupt
# update or resumed wrongly is far off (or NaN).
LOSS_TOLERANCE = 0.05

COLUMNS = (
    "fault",
    "detected",
    "steps to detect",
    "action taken",
    "recovered",
    "steps lost",
    "final loss vs clean",
)


@dataclass
class DrillRow:
    """What one drill injected, what caught it, what was done, and what it cost."""

    name: str
    fault: str
    expected: list[str]
    """Codes any one of which counts as detection (empty for the clean run)."""
    detected: list[str] = field(default_factory=list)
    """The relevant codes that appeared, in order of first appearance."""
    steps_to_detect: int | None = None
    action: str = ""
    finished: bool = False
    """The run (after any relaunch) completed all its steps; for pre-flight drills, the remedy
    passed the same check."""
    steps_lost: int | None = None
    final_loss: float | None = None
    loss_ratio: float | None = None
    """Final validation loss over the clean run's."""
    alarms: list[str] = field(default_factory=list)
    """Warning or error findings of the clean run (must stay empty)."""
    note: str = ""
    inject: str = ""
    """The fault plan (`TRAINGUARD_INJECT`) of the drill's run, if any."""
    trains: bool = True
    """False for pre-flight drills: nothing is trained, there is no loss to compare."""
    quiet: bool = False
    """A row that passes by raising no alarm, like the clean run (e.g. clean reruns compared
    with a reference)."""
    blind: str = ""
    """For a fault the guards cannot see (a documented blind spot): why, in words. Such a row
    passes when nothing claims to catch it and the fault provably changed the run (`landed`);
    it never counts as recovered."""
    weights: str | None = None
    """Checksum of the run's final weights (from the newest checkpoint's manifest)."""
    landed: bool | None = None
    """Blind spots: the final weights differ bitwise from the clean run's."""

    @property
    def is_clean(self) -> bool:
        return self.name == "clean" or self.quiet

    @property
    def ok_detected(self) -> bool:
        if self.is_clean:
            return not self.alarms
        if self.blind:  # as documented: nothing caught it, yet it changed the model
            return not self.detected and self.landed is True
        return any(c in self.expected for c in self.detected)

    @property
    def recovered(self) -> bool:
        if not self.finished or self.blind:
            return False
        if not self.trains:
            return True
        return self.loss_ratio is not None and self.loss_ratio <= 1 + LOSS_TOLERANCE

    @property
    def ok(self) -> bool:
        if self.blind:
            return self.ok_detected and self.finished
        return self.ok_detected and self.recovered

    def compare_with(self, clean: DrillRow) -> None:
        if self.final_loss is not None and clean.final_loss:
            self.loss_ratio = self.final_loss / clean.final_loss
        if self.blind and self.weights is not None and clean.weights is not None:
            self.landed = self.weights != clean.weights

    def cells(self) -> list[str]:
        recovered = "yes" if self.recovered else "NO"
        if self.is_clean:
            detected = "none (quiet)" if not self.alarms else "ALARM " + ", ".join(self.alarms)
        elif self.blind:
            detected = (
                "none: one process cannot see it" if not self.detected else ", ".join(self.detected)
            )
            recovered = {
                True: "no: the final weights differ bitwise from the clean run's",
                False: "NO EFFECT: the final weights equal the clean run's (the fault missed)",
                None: "unknown: no final weights to compare",
            }[self.landed]
        else:
            detected = ", ".join(self.detected) if self.detected else "MISSED"
        if self.loss_ratio is not None:
            vs = f"{self.loss_ratio:.4f}x ({self.final_loss:.4f})"
        elif self.final_loss is not None:
            vs = f"{self.final_loss:.4f}"
        else:
            vs = "-" if self.trains else "n/a (pre-flight)"
        return [
            f"{self.fault} ({self.inject})" if self.inject else self.fault,
            detected,
            "-" if self.steps_to_detect is None else str(self.steps_to_detect),
            self.action or "-",
            recovered,
            "-" if self.steps_lost is None else str(self.steps_lost),
            vs,
        ]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d |= {
            "detected_ok": self.ok_detected,
            "recovered": self.recovered,
            "ok": self.ok,
            "columns": dict(zip(COLUMNS, self.cells(), strict=True)),
        }
        return d


def verdict(rows: list[DrillRow]) -> list[Finding]:
    """R401 for a missed fault, R402 for a run that did not recover, R403 for a noisy clean run,
    R619 for a blind-spot drill that is not as documented."""
    out: list[Finding] = []
    for r in rows:
        if r.is_clean and r.alarms:
            out.append(
                Finding.of(
                    "R403",
                    f"the {r.name} drill run raised {', '.join(r.alarms)}",
                    where="clean",
                    data={"alarms": r.alarms},
                )
            )
        elif r.blind:
            if not r.ok:
                why = (
                    f"{', '.join(r.detected)} appeared: the blind spot is not blind any more, "
                    "update the drill and the docs"
                    if r.detected
                    else f"the fault did not change the run (landed: {r.landed})"
                    if r.finished
                    else r.note or "the run did not finish"
                )
                out.append(
                    Finding.of(
                        "R619",
                        f"drill {r.name!r} ({r.fault}) is not the documented blind spot: {why}",
                        where=r.name,
                        data={"detected": r.detected, "landed": r.landed},
                    )
                )
            continue
        elif not r.is_clean and not r.ok_detected:
            out.append(
                Finding.of(
                    "R401",
                    f"drill {r.name!r} ({r.fault}): none of {r.expected} appeared"
                    + (f"; {r.note}" if r.note else ""),
                    where=r.name,
                    data={"expected": r.expected, "detected": r.detected},
                )
            )
        if not r.recovered:
            why = r.note or (
                "the run did not finish"
                if not r.finished
                else f"final loss {r.loss_ratio}x the clean run's (tolerance {LOSS_TOLERANCE:.0%})"
            )
            out.append(
                Finding.of(
                    "R402",
                    f"drill {r.name!r} ({r.fault}) did not recover: {why}",
                    where=r.name,
                    data={"finished": r.finished, "loss_ratio": r.loss_ratio},
                )
            )
    return out


def matrix_table(rows: list[DrillRow], title: str = "Fire drills") -> Table:
    table = Table(title=title, show_lines=False, expand=False)
    for col in COLUMNS:
        table.add_column(col, overflow="fold")
    for r in rows:
        cells = r.cells()
        style = "" if r.ok else "bold red"
        table.add_row(*cells, style=style)
    return table


def matrix_markdown(rows: list[DrillRow]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in r.cells()) + " |")
    return "\n".join(lines) + "\n"
