"""How a run ended: `RunResult`, which `run_recipe` returns and hands to its `on_end` hook on
every exit (finished, failed, interrupted, or about to exit for a hang), and its JSON form, the
one object `trainguard run --json` prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import ExitStatus, RunHung, exit_status_for
from trainguard.findings import Finding, group_episodes
from trainguard.report.skips import RUN_AVERAGE, skipped_updates


@dataclass
class RunResult:
    run_dir: Path | None
    final_step: int | None
    final_val_loss: float | None
    final_val_bpb: float | None
    params: int
    tokens: int
    resumed_from: int | None = None
    findings: list[Finding] = field(default_factory=list)
    exit_status: int = ExitStatus.OK
    """The exit status the run ends the process with (errors.py): 0 when it finished."""
    error: dict[str, Any] | None = None
    """Why it did not finish: {"type", "message", "fix"}, plus "notes" when cleanup failed too."""
    skipped_steps: list[int] = field(default_factory=list)
    """The steps whose update the guard skipped (its history: across resumes and rollbacks)."""

    @property
    def ok(self) -> bool:
        """The run finished. Faults its guards handled stay findings with their own severity."""
        return self.exit_status == ExitStatus.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exit_status": self.exit_status,
            "error": self.error,
            "findings": [f.to_dict() for f in self.findings],
            # The same findings, consecutive ones of one code grouped (one line each in text).
            "episodes": [e.to_dict() for e in group_episodes(self.findings)],
            "skipped_updates": skipped_updates(self.skipped_steps, RUN_AVERAGE),
            "run_dir": None if self.run_dir is None else str(self.run_dir),
            "final_step": self.final_step,
            "final_val_loss": self.final_val_loss,
            "final_val_bpb": self.final_val_bpb,
            "params": self.params,
            "tokens": self.tokens,
            "resumed_from": self.resumed_from,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        """The inverse of `to_dict` (`run --nproc` reads its rank 0's result this way)."""
        return cls(
            run_dir=None if d.get("run_dir") is None else Path(d["run_dir"]),
            final_step=d.get("final_step"),
            final_val_loss=d.get("final_val_loss"),
            final_val_bpb=d.get("final_val_bpb"),
            params=int(d.get("params") or 0),
            tokens=int(d.get("tokens") or 0),
            resumed_from=d.get("resumed_from"),
            findings=[Finding.from_dict(f) for f in d.get("findings") or []],
            exit_status=int(d.get("exit_status") or 0),
            error=d.get("error"),
            skipped_steps=list((d.get("skipped_updates") or {}).get("steps") or []),
        )

    @classmethod
    def empty(cls, run_dir: Path | None) -> RunResult:
        """A run that ended before it started (bad input, a refused lock): add `with_error`."""
        return cls(run_dir, None, None, None, 0, 0)

    def with_error(self, exc: BaseException, status: int | None = None) -> RunResult:
        self.exit_status = exit_status_for(exc) if status is None else status
        self.error = describe_error(exc)
        # What the error found, e.g. NoUsableCheckpoint's C107 listing every step and why.
        for f in getattr(exc, "findings", None) or []:
            if isinstance(f, Finding) and f not in self.findings:
                self.findings.append(f)
        return self


def describe_error(exc: BaseException) -> dict[str, Any]:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    out: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": getattr(exc, "message", None) or text,
        "fix": getattr(exc, "fix", ""),
    }
    notes = getattr(exc, "__notes__", None)
    if notes:
        out["notes"] = list(notes)
    return out


def close_run(
    metrics: Any, run_dir: Path, write_report: bool, primary: BaseException | None = None
) -> None:
    """Close the metric sinks and write the report (after a halt too: the report is where a
    user looks first; `write_report` on rank 0 only). While `primary` ends the run, a failure
    here is noted on it and never raised in its place: the first error is the one the user
    must see."""
    steps: list[tuple[str, Callable[[], object]]] = [("close metrics", metrics.close)]
    if write_report and metrics.path.exists():
        from trainguard.report.build import write_report as write

        steps.append(("write the report", lambda: write(run_dir)))
    for what, step in steps:
        try:
            step()
        except Exception as e:
            if primary is None:
                raise
            primary.add_note(f"also could not {what}: {e}")


def hang_outcome(result: RunResult, finding: Finding) -> RunResult:
    """The result to hand `on_end` when the process is about to exit for a restart
    (ExitStatus.HANG): from the watchdog's thread, or from the hung-rank diagnosis."""
    if finding not in result.findings:
        result.findings.append(finding)
    hung = RunHung(
        f"the hang watchdog stopped a stuck step: {finding.message}",
        "run the same command again: it resumes from the last verified checkpoint",
    )
    return result.with_error(hung)
