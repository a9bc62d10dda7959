"""Evaluation first inside `trainguard run`: refuse a recipe without a use-case eval, lint the
specs in pre-flight, run the evals before the first step, every K steps and at the end, and
flag a run that leaves the loss band a scaling-law fit predicted for it, or the curve of its
reference run (`monitors/reference.py`, built by `train/reference_hook.py`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trainguard.evals.spec import require_use_case_eval
from trainguard.findings import Finding
from trainguard.train.reference_hook import RunReference

if TYPE_CHECKING:
    from trainguard.train.run import RunSession


class RunEvals:
    """The eval schedule and the on-track alarms (scaling-law band, reference curve) of one run."""

    def __init__(self, session: RunSession, enabled: bool = True) -> None:
        self.session = session
        self.cfg = session.recipe.evals
        self.enabled = enabled
        if enabled:
            require_use_case_eval(self.cfg)  # before any expensive work
        self.schedule = None
        self.offtrack = None
        # Before any expensive work: an unreadable reference or another recipe's is exit 2.
        self.reference = RunReference(session)

    def attach_data(self) -> None:
        """Once data and tokenizer exist: build the schedule and the off-track monitor."""
        s = self.session
        if self.enabled:
            from trainguard.evals.schedule import EvalSchedule

            self.schedule = EvalSchedule(
                self.cfg, s.data.tokenizer, s.recipe.data, s.recipe.train.eval_interval, s.device
            )
        band_path = s.recipe.prediction.band
        if band_path:
            from trainguard.scaling.offtrack import OffTrackMonitor, PredictionBand

            p = s.recipe.prediction
            self.offtrack = OffTrackMonitor(
                PredictionBand.load(band_path), margin=p.margin, patience=p.patience
            )
        self.reference.attach_data()

    def lint(self) -> list[Finding]:
        if not (self.enabled and self.cfg.lint):
            return []
        from trainguard.evals.lint import lint_specs

        s = self.session
        found = lint_specs(
            self.cfg.specs, s.data.tokenizer, data=s.recipe.data, max_examples=self.cfg.max_examples
        )
        # The trailing-space trap costs eval accuracy, not training compute: it is reported, but
        # never stops a run on its own (fix the spec and re-run the evals).
        return [
            replace(f, severity="warning") if f.code == "E111" and f.severity == "error" else f
            for f in found
        ]

    def maybe_run(self, step: int, final: bool = False) -> None:
        """Run the evals if due at `step`; the row goes to the metric log, findings recorded."""
        s = self.session
        if self.schedule is None or not self.schedule.due(step, final=final):
            return
        if s.watchdog is not None:
            s.watchdog.set_phase("eval")
        row, findings = self.schedule.run(s.model, step)
        if s.is_main:
            s.metrics.write(row)
        s.record(findings)

    def after_validation(self, step: int, result: dict[str, float]) -> None:
        """Feed the validation loss (with tokens seen) to the off-track alarm."""
        if self.offtrack is not None:
            tokens = self.session.state.tokens_seen
            self.session.record(self.offtrack.update(step, {**result, "tokens": tokens}))

    def after_step(self, step: int, metrics: dict[str, Any]) -> None:
        """Feed a finished step's loss and batch hash to the reference comparison."""
        self.reference.after_step(step, metrics)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.schedule is not None:
            state["schedule"] = self.schedule.state_dict()
        if self.offtrack is not None:
            state["offtrack"] = self.offtrack.state_dict()
        if (reference := self.reference.state_dict()) is not None:
            state["reference"] = reference
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.schedule is not None and "schedule" in state:
            self.schedule.load_state_dict(state["schedule"])
        if self.offtrack is not None and "offtrack" in state:
            self.offtrack.load_state_dict(state["offtrack"])
        self.reference.load_state_dict(state.get("reference"))
