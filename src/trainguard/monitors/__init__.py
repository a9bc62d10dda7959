"""In-run detectors: `update(step, metrics) -> list[Finding]`, `state_dict()` (DESIGN.md, 5)."""

from trainguard.monitors.config import MonitorsConfig
from trainguard.monitors.divergence import DivergenceDetector
from trainguard.monitors.monitor_set import DEFAULT_METRICS, MonitorSet, infer_kind
from trainguard.monitors.nonfinite import NonFiniteDetector
from trainguard.monitors.oscillation import OscillationDetector, find_wave, match_data_period
from trainguard.monitors.spikes import SpikeDetector
from trainguard.monitors.throughput import ThroughputDetector

__all__ = [
    "DEFAULT_METRICS",
    "DivergenceDetector",
    "MonitorSet",
    "MonitorsConfig",
    "NonFiniteDetector",
    "OscillationDetector",
    "SpikeDetector",
    "ThroughputDetector",
    "find_wave",
    "infer_kind",
    "match_data_period",
]
