"""The recipe's `distributed` section. Kept free of torch so that loading a recipe (and the
CLI's start-up) does not import it."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from trainguard.util.strict import StrictModel


class DistributedConfig(StrictModel):
    """The recipe's `distributed` section: only read when the run has more than one process."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    backend: str = Field("auto", pattern="^(auto|gloo|nccl)$")
    """Process-group backend for the gradients: `auto` (nccl when the machine has a GPU for
    every local rank, else gloo), `gloo` or `nccl`."""
    init_timeout_s: float = Field(900.0, gt=0.0)
    """Collective timeout until warm-up ends: the first rendezvous, data preparation on rank 0,
    the first (compiling) step."""
    warmup_steps: int = Field(2, ge=1)
    """Steps each process runs before the short timeouts and step-boundary barriers start."""
    collective_timeout_s: float = Field(300.0, gt=0.0)
    """Timeout of the gradient all-reduce after warm-up. A rank that does not arrive within it
    fails the collective; the ranks then run the hung-rank diagnosis (R301). With
    `derive_timeouts` this is the ceiling of the derived value."""
    hang_timeout_s: float = Field(60.0, gt=0.0)
    """How long the monitored barriers (step boundaries after warm-up, and the diagnosis after
    a collective timeout) wait before naming the ranks that did not arrive (R301). With
    `derive_timeouts` this is the ceiling of the derived value."""
    derive_timeouts: bool = True
    """Derive the collective and hang timeouts from the run's own step times once warm-up has
    ended and 5 steps were timed: max(`timeout_floor_s`, min(ceiling, `timeout_factor` x the
    `timeout_percentile`-th percentile of the last 128 step times)), the ceilings being
    `collective_timeout_s` and `hang_timeout_s`. False: those two fixed values."""
    timeout_factor: float = Field(10.0, ge=1.0)
    """The multiple of the step-time percentile that a derived timeout allows."""
    timeout_percentile: float = Field(99.0, gt=0.0, le=100.0)
    """The percentile of recent step times the derived timeouts scale (99: the slow steps
    that do happen, not the typical one)."""
    timeout_floor_s: float = Field(15.0, gt=0.0)
    """The least a derived timeout waits, however short the steps (jitter, a loaded host);
    never more than its ceiling (`collective_timeout_s`, `hang_timeout_s`)."""
    checkpoint_timeout_s: float = Field(1800.0, gt=0.0)
    """Collective timeout while the loop is in its `checkpoint` phase (a sharded save's
    collectives wait for the slowest writer): a budget of its own, not a step time."""
    eval_timeout_s: float = Field(1800.0, gt=0.0)
    """Collective timeout while the loop is in its `eval` phase: a budget of its own."""
    step_barrier: bool = True
    """A monitored barrier at every step boundary after warm-up (one small round trip on the
    gloo monitor group), so that a rank stuck outside any collective is also named."""
    sync_timeout_s: float = Field(1800.0, gt=0.0)
    """Timeout of the barriers where ranks wait for rank 0's checkpoint writes and for
    evaluations, and of trainguard's own collectives (resume step, hashes, timings)."""
    replica_check_interval: int = Field(50, ge=0)
    """Compare the ranks' parameter hashes every this many steps and before every checkpoint
    (H201); 0 disables it (checkpoints are then not guarded either)."""
    replica_check_optimizer: bool = False
    """Also hash the optimizer state (AdamW moments, Muon momentum) in the replica check:
    stricter, slower."""
    straggler_interval: int = Field(5, ge=0)
    """Gather every rank's per-step phase timings every this many steps and score each step
    for stragglers (H202); 0 disables it. A straggler is named at the step it is found, and
    reported at the next gather."""
    straggler_threshold: float = Field(0.5, gt=0.0, le=1.0)
    """A rank is behind at a step when it arrives at the end of a phase (the collective it
    enters) later than the median of the other ranks by more than (1 - this) x the step time:
    0.5 means the others waited half the step for it (it doubled the step); 0.8, a fifth."""
    straggler_steps: int = Field(5, ge=1)
    """Steps in a row a rank must be behind to be named (H202); as many in step re-arm it."""
    straggler_min_lag_s: float = Field(0.01, ge=0.0)
    """The least lag, in seconds, that counts as behind, however short the steps (scheduling
    noise on a shared host)."""
    straggler_history: int = Field(8, ge=1)
    """Unused since stragglers are found by comparing the ranks at each step, not a rank with
    its own past; accepted so that recipes that set it still load."""
    fp32_reduce: bool = True
    """With train.precision=bf16, all-reduce gradients with fp32 accumulation (numerics'
    `fp32_accumulate_hook`): no swamping bias in the sum at any world size (N101)."""
