"""Detector settings (`MonitorsConfig`, shared by `watch` and `Guard`) and the recipe's `guards`
section (`GuardsConfig`: the detectors' settings, their actions, the hang watchdog).

Pure pydantic on floor 1 (docs/architecture.md): loading a recipe imports neither the detectors
nor the runtime `Guard`.

The defaults are chosen to stay quiet on clean curves (power-law decay with warm-up, a cosine
learning-rate schedule, Gaussian or heavy-tailed per-batch noise of a few percent) and to catch
the planted faults in tests/test_monitors*.py.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from trainguard.codes import resolve
from trainguard.util.strict import StrictModel

Action = Literal["apply", "skip", "rollback", "halt"]
ACTIONS: tuple[str, ...] = ("apply", "skip", "rollback", "halt")
"""What the loop does with a step's update, weakest first (`guard/decision.py`)."""


class MonitorsConfig(StrictModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    spike_window: int = Field(64, ge=8)
    """Steps of history for the rolling median and IQR the spike detectors score against."""
    spike_min_history: int = Field(20, ge=4)
    """Steps seen before spikes are scored, so early training's fast changes never alarm."""
    loss_spike_z: float = Field(6.0, gt=0.0)
    """A loss spike is more than this many robust standard deviations (IQR / 1.349) above the
    rolling median..."""
    loss_spike_min_ratio: float = Field(1.3, ge=1.0)
    """...and at least this multiple of the rolling median (both must hold)."""
    grad_spike_z: float = Field(6.0, gt=0.0)
    """A gradient-norm spike is more than this many robust standard deviations above the rolling
    median..."""
    grad_spike_min_ratio: float = Field(2.0, ge=1.0)
    """...and at least this multiple of the rolling median (both must hold)."""
    divergence_span: int = Field(50, ge=2)
    """Span of the exponential moving average of the loss (alpha = 2 / (span + 1))."""
    divergence_rise: float = Field(0.1, gt=0.0)
    """Divergence: the smoothed loss is more than this fraction above its best value..."""
    divergence_patience: int = Field(20, ge=1)
    """...for this many consecutive steps."""
    divergence_min_steps: int = Field(50, ge=0)
    """Steps seen before divergence is scored (warm-up bumps are not divergence)."""
    oscillation_window: int = Field(1024, ge=128)
    """Rows of loss history tested for a periodic wave; one window's test finds periods up to a
    ninth of it (114 rows for a full window). Faint waves are tested over up to 8 blocks of half
    a window joined (4096 rows), periods up to about a ninth of the window; slow ones over the
    last 4 windows (4096 rows) kept as means of window/128 rows, periods from 4 such means (32
    rows) up to a third of the rows seen (1365 rows once 4 windows are held)."""
    oscillation_interval: int = Field(128, ge=1)
    """Test for a wave every this many rows (the FFT cost is amortised over them)."""
    oscillation_alpha: float = Field(1e-6, gt=0.0, lt=1.0)
    """Significance level of each wave test: the chance that noise alone (white near the peak)
    gives a periodogram peak so far above its neighbouring bins."""
    oscillation_min_amplitude: float = Field(0.003, ge=0.0)
    """Ignore waves whose amplitude is below this fraction of the loss (harmless ripples)."""
    throughput_window: int = Field(64, ge=4)
    """Steps of tokens-per-second history for the rolling median."""
    throughput_drop: float = Field(0.3, gt=0.0, lt=1.0)
    """A throughput drop is this fraction or more below the rolling median..."""
    throughput_z: float = Field(3.0, ge=0.0)
    """...and more than this many robust standard deviations below it (so a machine whose
    throughput swings by tens of percent step to step stays quiet)..."""
    throughput_patience: int = Field(5, ge=1)
    """...for this many consecutive steps (single slow steps such as checkpoints are ignored)."""
    throughput_min_history: int = Field(10, ge=1)
    """Steps seen before throughput is scored (the first steps are slow: allocation, compile)."""
    moe_drop_max: float = Field(0.2, ge=0.0, le=1.0)
    """R601: an MoE layer dropping more than this share of its token-to-expert assignments..."""
    moe_patience: int = Field(10, ge=1)
    """...for this many steps in a row (also the patience of R603 collapse and R604 imbalance)."""
    moe_dead_patience: int = Field(20, ge=1)
    """R602: an expert that computes no token for this many steps in a row is dead."""
    moe_collapse_share: float = Field(0.9, gt=0.0, le=1.0)
    """R603: the router collapsed when its top_k busiest experts compute this share or more."""
    moe_imbalance_span: int = Field(20, ge=1)
    """R604: span of the EMA of a layer's imbalance (busiest share x n_experts; 1 balanced)."""
    moe_imbalance_rise: float = Field(0.5, gt=0.0)
    """R604: the smoothed imbalance rising more than this fraction above its lowest value..."""
    moe_min_steps: int = Field(50, ge=0)
    """...counted only after this many steps (a fresh router's first steps settle first)."""
    loader_share: float = Field(0.4, gt=0.0, le=1.0)
    """R605: the data phase taking this share of the step's time or more (as the median of the
    last `loader_window` steps) names the data loader as what slows training."""
    loader_window: int = Field(10, ge=1)
    """R605: steps of data-phase shares the median is taken over (one slow batch is not a
    stall)."""


class GuardsConfig(MonitorsConfig):
    """The recipe's `guards` section: detector thresholds, actions, limits, the hang watchdog."""

    enabled: bool = True
    """Run the detectors and act on them. Off: every step is applied and nothing is checked."""
    actions: dict[str, Action] = Field(default_factory=dict)
    """Action per finding code, over the defaults R101/R102/R103 skip, R104 rollback,
    R105/R106 apply, R204 rollback. Actions: apply, skip, rollback, halt."""
    max_rollbacks: int = Field(3, ge=0)
    """Rollbacks allowed in one run; one more halts it with R203."""
    repeat_count: int = Field(3, ge=1)
    """Skipped steps within `repeat_window` steps that escalate to R204 (a rollback)."""
    repeat_window: int = Field(50, ge=1)
    """Steps over which skipped steps are counted for `repeat_count`."""
    rerun_on: list[str] = Field(default_factory=lambda: ["R101", "R102", "R103"])
    """Codes whose finding asks the loop to rerun the step to classify hardware vs software."""
    rerun_rtol: float = Field(0.0, ge=0.0)
    """Relative tolerance of the rerun comparison; 0 assumes deterministic kernels (CPU)."""
    hang_floor_s: float = Field(300.0, gt=0.0)
    """The hang watchdog's timeout never goes below this many seconds."""
    hang_factor: float = Field(5.0, ge=1.0)
    """Hang timeout: the larger of the floor and this multiple of the median recent step time."""
    hang_window: int = Field(32, ge=1)
    """Recent step times the hang timeout is learned from."""
    decide_on: Literal["auto", "device", "host"] = "auto"
    """Where `trainguard run` decides a step's skip. device: on the accelerator, no host sync
    in the step (`Guard.step_async`; findings and the metrics row come one step later); host:
    `Guard.step`, one sync per step; auto: device on CUDA, host elsewhere."""

    @field_validator("actions")
    @classmethod
    def _known_codes(cls, v: dict[str, Action]) -> dict[str, Action]:
        for code in v:
            if not re.fullmatch(r"R\d{3}", code):
                raise ValueError(f"guards.actions key {code!r} is not a run code (R101..R299)")
        return {resolve(code): action for code, action in v.items()}  # renamed codes: new number
