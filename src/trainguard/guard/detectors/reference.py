"""The run compared with its reference curve, step by step: `update(step, metrics)`.

Three comparisons, cheapest first:

- the batches: the reference recorded each step's batch hash; a run that reads other batches
  (a changed data order, batches skipped after a rollback) is no longer paired with it, so the
  comparison stops there (R504). Data that differs as a whole (tokenizer, corpus) is found
  before the first step by `check_data` (R503).
- bitwise, when the caller says it may expect it (CPU, the same software, threads and process
  count): the first step whose loss is not exactly the reference's is a departure (R502).
- the band, always: d = run loss - reference loss at the same step, in units of the reference's
  own noise (`reference.noise`), feeds a two-sided CUSUM (Page 1954). Steps within +-allowance
  add nothing; steps outside accumulate, and when the sum passes `threshold` the run has left
  the band (R501). The step the sum last started from zero is the first step of departure.
  Both runs read the same batches, so the batch-to-batch scatter cancels in d: a clean rerun
  stays orders of magnitude inside the band, and a change that moves the loss by the
  reference's noise for a dozen steps (or by several times it once) is reported. Verdicts
  come every `interval` steps and at the reference's last step.

Environment differences from the reference (H101, computed by the caller) are reported next to
the first departure. At the reference's last step an R506 summary says how the run compared.
The monitor is pure and keeps its state in `state_dict()`, so a resumed run continues the
comparison where its checkpoint left it; a step fed again (a rollback replays it) is ignored.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from trainguard.data.shards import identity_changes
from trainguard.findings import Finding
from trainguard.reference.curve import ReferenceCurve

STATE_VERSION = 1


@dataclasses.dataclass
class _Side:
    """One side of the two-sided CUSUM: the sum, and the excursion it is in (the step it left
    zero at, the differences summed since, how many steps)."""

    sum: float = 0.0
    onset: int | None = None
    total: float = 0.0
    count: int = 0

    def add(self, step: int, d: float, increment: float) -> None:
        self.sum = max(0.0, self.sum + increment)
        if self.sum == 0.0:
            self.onset, self.total, self.count = None, 0.0, 0
            return
        if self.onset is None:
            self.onset = step
        self.total += d
        self.count += 1


class ReferenceMonitor:
    """`update(step, metrics) -> list[Finding]` against one `ReferenceCurve`."""

    def __init__(
        self,
        reference: ReferenceCurve,
        *,
        bitwise: bool = False,
        drift: Sequence[Finding] = (),
        interval: int = 10,
        threshold: float = 5.0,
        allowance: float = 0.5,
        origin: str = "the reference",
    ) -> None:
        """`bitwise`: expect the exact same losses; `drift`: H101 findings listing how the
        environment differs from the reference's (reported with the first departure)."""
        self.reference = reference
        self.bitwise = bitwise
        self.drift = list(drift)
        self.interval = interval
        self.threshold = threshold
        self.allowance = allowance
        self.origin = origin
        self.sigma = reference.noise.sigma
        self._reset()

    def _reset(self) -> None:
        self.last_step = -1  # steps count from 0
        self.stopped: str | None = None
        self.compared = 0
        self.max_abs_diff = 0.0
        self.bitwise_departure: int | None = None
        self.band_departure: int | None = None
        self.drift_reported = False
        self.high, self.low = _Side(), _Side()  # the loss above / below the reference
        self.peak = 0.0

    # -- checks --------------------------------------------------------------------------------
    def check_data(self, identity: dict[str, Any] | None) -> list[Finding]:
        """Before the first step: R503 (and no comparison) when the run's prepared data is not
        the data the reference was trained on."""
        recorded = self.reference.data_identity
        if recorded is None or identity is None:
            return []
        what = identity_changes(recorded, identity)
        if not what:
            return []
        self.stopped = "data"
        changed = ", ".join(f"the {w}" for w in what)
        return [
            Finding.of(
                "R503",
                f"the prepared data differs from {self.origin}'s ({changed} changed): the "
                "curves are not compared",
                data={"changed": what, "reference": recorded, "run": identity},
            )
        ]

    def update(self, step: int, metrics: dict[str, Any]) -> list[Finding]:
        """Compare step `step` (0-based, as logged): `metrics["loss"]` and, when given,
        `metrics["batch_hash"]`."""
        ref = self.reference
        i = ref.index.get(step)
        if self.stopped or step <= self.last_step or i is None:
            return []
        self.last_step = step
        out: list[Finding] = []
        theirs, ours = ref.batch_hash[i], metrics.get("batch_hash")
        if theirs is not None and ours is not None and theirs != ours:
            self.stopped = "batches"
            return [
                Finding.of(
                    "R504",
                    f"from step {step} the run reads other batches than {self.origin} (batch "
                    f"hash {ours} vs {theirs}): the curves are no longer paired, the "
                    "comparison stops here",
                    step=step,
                    data={"batch_hash": ours, "reference_batch_hash": theirs},
                )
            ]
        loss = metrics.get("loss")
        if not isinstance(loss, int | float) or not math.isfinite(loss):
            return out  # the guards report non-finite losses; nothing to compare
        d = float(loss) - float(ref.loss[i])
        self.compared += 1
        self.max_abs_diff = max(self.max_abs_diff, abs(d))
        if self.bitwise and d != 0.0 and self.bitwise_departure is None:
            self.bitwise_departure = step
            out += self._bitwise_finding(step, float(loss), float(ref.loss[i]), d)
        self._accumulate(step, d)
        # A verdict after every `interval` steps done (steps count from 0), and at the end.
        done = step + 1
        if self.band_departure is None and (done % self.interval == 0 or step == ref.steps[-1]):
            out += self._band_verdict(step)
        if step == ref.steps[-1]:
            out.append(self._summary_finding(step))
        return out

    # -- the band ------------------------------------------------------------------------------
    def _accumulate(self, step: int, d: float) -> None:
        e = d / self.sigma
        self.high.add(step, d, e - self.allowance)
        self.low.add(step, d, -e - self.allowance)
        self.peak = max(self.peak, self.high.sum, self.low.sum)

    def _band_verdict(self, step: int) -> list[Finding]:
        side = max((self.high, self.low), key=lambda s: s.sum)
        if side.sum <= self.threshold:
            return []
        onset, mean = side.onset, side.total / max(side.count, 1)
        self.band_departure = onset
        where = "above" if side is self.high else "below"
        finding = Finding.of(
            "R501",
            f"the training loss left {self.origin}'s band at step {onset}: {where} it by "
            f"{mean:+.4f} nats per step on average over steps {onset}-{step} "
            f"({mean / self.sigma:+.1f} x its noise {self.sigma:.4f}; CUSUM {side.sum:.1f} > "
            f"{self.threshold:g})" + self._environment_note(),
            step=onset,
            metric="loss",
            data={
                "first_step": onset,
                "verdict_step": step,
                "direction": where,
                "mean_difference": mean,
                "noise_sigma": self.sigma,
                "cusum": side.sum,
                "threshold": self.threshold,
                "allowance": self.allowance,
            },
        )
        return [finding, *self._drift_at(onset)]

    # -- bitwise and the summary ---------------------------------------------------------------
    def _bitwise_finding(self, step: int, loss: float, theirs: float, d: float) -> list[Finding]:
        finding = Finding.of(
            "R502",
            f"the training loss departed bitwise from {self.origin} at step {step} ({loss!r} vs "
            f"{theirs!r}, difference {d:+.3g}) although it ran on the same CPU software, threads "
            "and process count: what the run computes has changed" + self._environment_note(),
            step=step,
            metric="loss",
            data={"first_step": step, "loss": loss, "reference_loss": theirs, "difference": d},
        )
        return [finding, *self._drift_at(step)]

    def _environment_note(self) -> str:
        if self.drift:
            return "; the environment differs from the reference's (H101)"
        return "; the software is the reference's: the change is in the code, data or recipe"

    def _drift_at(self, step: int) -> list[Finding]:
        if self.drift_reported:
            return []
        self.drift_reported = True
        return [dataclasses.replace(f, step=step) for f in self.drift]

    def _summary_finding(self, step: int) -> Finding:
        s = self.summary()
        if s["bitwise_equal"]:
            how = "bitwise equal"
        elif self.band_departure is None:
            how = "within the band"
        else:
            how = f"outside the band from step {self.band_departure}"
        return Finding.of(
            "R506",
            f"compared {s['compared']} steps with {self.origin}: {how} (largest difference "
            f"{s['max_abs_diff']:.3g} nats, noise {self.sigma:.3g}, CUSUM peak {s['peak']:.2f} "
            f"of {self.threshold:g})",
            step=step,
            metric="loss",
            data=s,
        )

    def summary(self) -> dict[str, Any]:
        return {
            "reference": self.reference.checksum,
            "compared": self.compared,
            "bitwise_expected": self.bitwise,
            "bitwise_equal": self.compared > 0 and self.max_abs_diff == 0.0,
            "bitwise_departure": self.bitwise_departure,
            "band_departure": self.band_departure,
            "max_abs_diff": self.max_abs_diff,
            "noise_sigma": self.sigma,
            "peak": self.peak,
            "stopped": self.stopped,
        }

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "reference": self.reference.checksum,
            "last_step": self.last_step,
            "stopped": self.stopped,
            "compared": self.compared,
            "max_abs_diff": self.max_abs_diff,
            "bitwise_departure": self.bitwise_departure,
            "band_departure": self.band_departure,
            "drift_reported": self.drift_reported,
            "high": dataclasses.asdict(self.high),
            "low": dataclasses.asdict(self.low),
            "peak": self.peak,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a comparison; a state saved against another reference (the file at
        reference.path was re-recorded) is ignored and the comparison starts afresh."""
        stopped = self.stopped  # check_data's verdict on this process's data stands
        if state.get("version") != STATE_VERSION or state.get("reference") != (
            self.reference.checksum
        ):
            self._reset()
            self.stopped = stopped
            return
        for key in (
            "last_step",
            "compared",
            "max_abs_diff",
            "bitwise_departure",
            "band_departure",
            "drift_reported",
            "peak",
        ):
            setattr(self, key, state[key])
        self.high, self.low = _Side(**state["high"]), _Side(**state["low"])
        self.stopped = stopped or state["stopped"]
