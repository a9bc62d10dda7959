"""The run's reference comparison: which reference, whether to expect the same bits, and the
environment differences to report next to a departure (H101). The comparison itself is the
pure `monitors/reference.py`; this adapter feeds it from `trainguard run`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from trainguard.data.shards import data_identity
from trainguard.monitors.reference import ReferenceMonitor
from trainguard.reference.select import select_reference
from trainguard.train.envinfo import BITWISE_KEYS, drift_findings, environment_changes

if TYPE_CHECKING:
    from trainguard.config.schema import Recipe
    from trainguard.data.prepare import PreparedData
    from trainguard.findings import Finding


class RunView(Protocol):
    """What the comparison reads of the run (its session provides it): only the command line
    imports `train/run.py` (docs/architecture.md, floors)."""

    recipe: Recipe
    recipe_dict: dict[str, Any]
    env: dict[str, Any]
    data: PreparedData

    def record(self, findings: list[Finding]) -> None: ...

    def log_event(self, event: str, **fields: object) -> None: ...


class RunReference:
    """Selected when the run starts, before any expensive work, so that an unreadable reference,
    or another recipe's without reference.force, is exit 2 (BadInputError) at once; the monitor
    is built in `attach_data`, once the thread count is applied and the data prepared."""

    def __init__(self, session: RunView) -> None:
        self.session = session
        self.selected = select_reference(session.recipe_dict)
        self.monitor: ReferenceMonitor | None = None

    def attach_data(self) -> None:
        """Build the monitor, say what the run is compared with and whether bits must repeat,
        and check that the data is the reference's (R503)."""
        s, selected = self.session, self.selected
        if selected is None:
            return
        curve, env, cfg = selected.curve, s.env, s.recipe.reference
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
        s.record(selected.findings)
        s.log_event(
            "reference",
            origin=selected.origin,
            recipe_hash=curve.recipe_hash,
            bitwise_expected=bitwise,
            not_bitwise_because=blockers,
            noise_sigma=curve.noise.sigma,
        )
        s.record(self.monitor.check_data(data_identity(s.data.manifest)))

    def after_step(self, step: int, metrics: dict[str, Any]) -> None:
        if self.monitor is not None:
            self.session.record(self.monitor.update(step, metrics))

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.monitor is None else self.monitor.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.monitor is not None and state:
            self.monitor.load_state_dict(state)
