"""The run's comparison with a reference curve (`reference.path`, or a shipped reference of the
recipe): which reference, whether to expect the same bits, the environment differences to
report next to a departure (H101), and every finished step's loss and batch hash fed to the
pure `guard/detectors/reference.py` (R501-R507).

The reference is selected when the run starts (`train/guarded_run.py`, before any expensive work: an
unreadable one, or another recipe's without `reference.force`, is exit 2 at once); the monitor
is built here once the thread count is applied and the data prepared, before the resume, so
that a checkpoint's comparison state can be handed back to it.
"""

from __future__ import annotations

from typing import Any

from trainguard.findings import Finding
from trainguard.guard.detectors.reference import ReferenceMonitor
from trainguard.reference.select import Selected
from trainguard.train.callback import Callback, RunContext
from trainguard.train.envinfo import BITWISE_KEYS, drift_findings, environment_changes


class ReferenceCallback(Callback):
    name = "reference"
    priority = 85  # right after the step row (StepLog); its pre_train after the resume's cut (87)

    def __init__(
        self,
        selected: Selected,
        env: dict[str, Any],
        data_identity: dict[str, Any] | None,
        cfg: Any,  # the recipe's ReferenceConfig: interval, threshold, allowance
    ) -> None:
        curve = selected.curve
        # Bits repeat only on CPU with the reference's software, CPU, threads and process
        # count, for the same recipe, and when the reference ran on one environment throughout.
        blockers = environment_changes(curve.env, env, BITWISE_KEYS)
        bitwise = (
            not blockers
            and not selected.differences
            and curve.single_environment
            and str(env.get("device", "")).startswith("cpu")
        )
        self.monitor = ReferenceMonitor(
            curve,
            bitwise=bitwise,
            drift=drift_findings(curve.env, env, None, against=f"{selected.origin} was recorded"),
            interval=cfg.interval,
            threshold=cfg.threshold,
            allowance=cfg.allowance,
            origin=selected.origin,
        )
        self.event = {
            "origin": selected.origin,
            "recipe_hash": curve.recipe_hash,
            "bitwise_expected": bitwise,
            "not_bitwise_because": blockers,
            "noise_sigma": curve.noise.sigma,
        }
        self.found: list[Finding] = [*selected.findings, *self.monitor.check_data(data_identity)]

    def pre_train(self, ctx: RunContext) -> None:
        """Say what the run is compared with and whether bits must repeat; R503 if the data is
        not the reference's (found when built, logged once the resume has cut the log)."""
        ctx.log_event("reference", **self.event)
        ctx.record(self.found)

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        ctx.record(
            self.monitor.update(step, {"loss": row["loss"], "batch_hash": row["batch_hash"]})
        )

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:  # {}: a checkpoint written before the comparison, or without one
            self.monitor.load_state_dict(state)
