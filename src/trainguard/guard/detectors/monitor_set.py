"""MonitorSet: every detector over every watched metric, one `update` per step.

Which detectors watch a metric depends on its kind:
- `loss`: non-finite (R101), spike (R102), divergence (R104), oscillation (R105);
- `grad_norm`: non-finite (R101), spike (R103);
- `throughput`: drop (R106).
The same object runs online (`Guard`, the training loop) and offline (`trainguard watch`), so
a log replayed through `watch` gives the findings the run saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from trainguard.findings import Finding
from trainguard.guard.config import MonitorsConfig
from trainguard.guard.detectors.divergence import DivergenceDetector
from trainguard.guard.detectors.nonfinite import NonFiniteDetector
from trainguard.guard.detectors.oscillation import OscillationDetector
from trainguard.guard.detectors.spikes import SpikeDetector
from trainguard.guard.detectors.throughput import ThroughputDetector

MetricKind = Literal["loss", "grad_norm", "throughput"]
METRIC_KINDS: tuple[str, ...] = ("loss", "grad_norm", "throughput")
DEFAULT_METRICS: dict[str, MetricKind] = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "tokens_per_s": "throughput",
}


class Monitor(Protocol):
    metric: str

    def update(self, step: int, metrics: Mapping[str, float | None]) -> list[Finding]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def infer_kind(name: str) -> MetricKind:
    """The detector family for a metric name from any trainer (`train/loss`, `grad_norm`, ...)."""
    low = name.lower()
    if "grad" in low and "norm" in low:
        return "grad_norm"
    if any(k in low for k in ("throughput", "_per_s", "per_sec", "tokens/s", "tok/s", "samples/s")):
        return "throughput"
    return "loss"


def _detectors(name: str, kind: MetricKind, c: MonitorsConfig, data_period: float | None):
    if kind == "loss":
        return {
            "nonfinite": NonFiniteDetector(name),
            "spike": SpikeDetector(
                name, "R102", c.loss_spike_z, c.loss_spike_min_ratio, c.spike_window,
                c.spike_min_history,
            ),
            "divergence": DivergenceDetector(
                name, c.divergence_span, c.divergence_rise, c.divergence_patience,
                c.divergence_min_steps,
            ),
            "oscillation": OscillationDetector(
                name, c.oscillation_window, c.oscillation_interval, c.oscillation_alpha,
                c.oscillation_min_amplitude, data_period,
            ),
        }  # fmt: skip
    if kind == "grad_norm":
        return {
            "nonfinite": NonFiniteDetector(name),
            "spike": SpikeDetector(
                name, "R103", c.grad_spike_z, c.grad_spike_min_ratio, c.spike_window,
                c.spike_min_history,
            ),
        }  # fmt: skip
    return {
        "throughput": ThroughputDetector(
            name, c.throughput_drop, c.throughput_patience, c.throughput_window,
            c.throughput_min_history, c.throughput_z,
        )
    }  # fmt: skip


class MonitorSet:
    """All detectors for `metrics` ({name: kind}); `update(step, values)` returns their findings."""

    def __init__(
        self,
        config: MonitorsConfig | None = None,
        metrics: Mapping[str, MetricKind] | None = None,
        data_period: float | None = None,
    ) -> None:
        self.config = config or MonitorsConfig()
        self.metrics = dict(metrics or DEFAULT_METRICS)
        for name, kind in self.metrics.items():
            if kind not in METRIC_KINDS:
                raise ValueError(f"metric {name!r}: kind {kind!r} is not one of {METRIC_KINDS}")
        self.monitors: dict[str, Monitor] = {}
        for name, kind in self.metrics.items():
            for det, mon in _detectors(name, kind, self.config, data_period).items():
                self.monitors[f"{name}/{det}"] = mon
        self._list = list(self.monitors.values())

    def update(self, step: int, metrics: Mapping[str, float | None]) -> list[Finding]:
        out: list[Finding] = []
        for mon in self._list:
            found = mon.update(step, metrics)
            if found:
                out += found
        return out

    def finalize(self, step: int | None = None) -> list[Finding]:
        """Offline end of a log: run the periodic tests on the rows not yet tested."""
        out: list[Finding] = []
        for mon in self._list:
            if isinstance(mon, OscillationDetector):
                out += mon.finalize(step)
        return out

    def set_data_period(self, period: float | None) -> None:
        for mon in self._list:
            if isinstance(mon, OscillationDetector):
                mon.data_period = period

    def state_dict(self) -> dict[str, Any]:
        return {key: mon.state_dict() for key, mon in self.monitors.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Monitors absent from the saved state (a metric added on resume) start fresh.
        for key, mon in self.monitors.items():
            if key in state:
                mon.load_state_dict(state[key])
