"""The typed recipe schema. Every field has a docstring; unknown keys are rejected.

A recipe is YAML with these sections. `trainguard run --set section.key=value` overrides any
field; `docs/recipes.md` lists them all (generated from this file).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from trainguard.config.batch_ramp import schedule_changes
from trainguard.config.distributed import DistributedConfig
from trainguard.config.evals import EvalsConfig
from trainguard.errors import ConfigError
from trainguard.guard.config import GuardsConfig
from trainguard.metrics.config import MetricsConfig
from trainguard.util.strict import StrictModel

SEED_MAX = 2**63 - 1
"""Seeds are 0..2**63-1: what torch, numpy and Python's random all accept."""

LR_MAX = 10.0
"""A learning rate above this is a typo (3e1 for 3e-1), not a setting."""


class _Section(StrictModel):
    # No NaN or infinity in any number of a recipe: they only ever come from a typo or a bug.
    # Strict types (StrictModel): `true` is no step count, 8.5 no batch size.
    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, frozen=False, allow_inf_nan=False
    )


class DataConfig(_Section):
    source: str = "stdlib"
    """Where the text comes from: `stdlib` (the running Python's standard library source), a
    folder of text files, a JSON Lines file (`.jsonl`, `.ndjson`: one object per line with a
    `text` field), or a Parquet file (`.parquet`, `.pq`) with a `text` column; every command
    that reads documents accepts the same (data/corpus.py)."""
    text_field: str = "text"
    """Field holding the document text in JSONL and Parquet sources."""
    val_fraction: float = Field(0.05, gt=0.0, lt=0.5)
    """Share of documents held out for validation, chosen by a stable hash of the document id."""
    seq_len: int = Field(128, ge=8, le=8192)
    """Tokens per training sample (the model's context length)."""
    cache_dir: str | None = None
    """Where prepared shards are cached.
    Default: `$TRAINGUARD_CACHE`, else `~/.cache/trainguard`."""
    prepared: str | None = None
    """A prepared data folder to train on instead of preparing `source`: the key folder
    `trainguard data prepare --out` wrote, uploaded whole to an fsspec URL
    (`s3://bucket/prefix/KEY`) or a local path. Remote shards are fetched on demand into the
    node cache, once per machine, and memory-mapped there (`node_cache_dir`)."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """fsspec options for a URL `prepared`, e.g. `{key, secret, client_kwargs: {endpoint_url}}`."""
    node_cache_dir: str | None = None
    """The machine-wide cache remote shards are fetched into (a local disk, not NFS).
    Default: `$TRAINGUARD_CACHE/node`, else `~/.cache/trainguard/node`."""
    node_cache_max_gb: float = Field(64.0, gt=0.0)
    """Size limit of the node cache: least recently used entries not in use are evicted."""
    shard_tokens: int = Field(4_000_000, ge=1024)
    """Tokens per shard file."""


class TokenizerConfig(_Section):
    vocab_size: int = Field(4096, ge=260, le=1_000_000)
    """Byte-level BPE vocabulary size, special tokens included."""
    min_frequency: int = Field(2, ge=1)
    """A pair must occur at least this often to be merged."""


class MoEConfig(_Section):
    n_experts: int = Field(4, ge=2)
    """Experts per MoE layer."""
    top_k: int = Field(1, ge=1)
    """Experts each token is routed to (token-choice routers)."""
    router: Literal["token_choice", "dropless", "expert_choice"] = "token_choice"
    """`token_choice`: top-k with a capacity limit, overflow tokens dropped and counted.
    `dropless`: top-k without a limit. `expert_choice`: each expert picks its top tokens over
    the sequence, which lets a position see the future (a target for `check-model`)."""
    capacity_factor: float = Field(1.25, gt=0.0)
    """Capacity per expert as a multiple of the balanced share (token_choice, expert_choice)."""
    every: int = Field(1, ge=1)
    """Every k-th transformer block gets an MoE feed-forward; the others a dense one."""
    aux_loss_weight: float = Field(0.01, ge=0.0)
    """Weight of the load-balancing loss (Switch Transformer) added to the training loss."""

    @model_validator(mode="after")
    def _top_k_within_experts(self) -> MoEConfig:
        if self.top_k > self.n_experts:
            raise ValueError(
                f"model.moe.top_k={self.top_k} exceeds model.moe.n_experts={self.n_experts}: "
                "a token cannot be routed to more experts than there are"
            )
        return self


class ModelConfig(_Section):
    n_layers: int = Field(4, ge=1)
    """Transformer blocks."""
    d_model: int = Field(128, ge=8)
    """Residual stream width."""
    n_heads: int = Field(4, ge=1)
    """Attention heads; must divide d_model."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on attention and residual branches."""
    moe: MoEConfig | None = None
    """Mixture-of-experts feed-forward; omit for a dense model."""

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.n_heads={self.n_heads} must divide model.d_model={self.d_model}"
            )
        return self


class TrainConfig(_Section):
    max_steps: int = Field(500, ge=1)
    """Optimizer steps. The only key that may change when resuming a run: larger, the LR
    schedule keeps its decay and appends a segment (`schedule_on_extend`, finding R620);
    below the checkpoint's step, the resume is refused (exit 2)."""
    schedule_on_extend: Literal["constant", "rewarm"] = "constant"
    """What a resume with a larger `max_steps` appends to the LR schedule, which keeps its
    original warm-up and cosine decay to the old `max_steps`: `constant` holds the LR of the
    last planned step for the added steps (no jump); `rewarm` climbs from it back to the peak
    over `warmup_steps`, then decays by cosine to the new `max_steps`. Never changes a run
    that is not extended."""
    batch_size: int = Field(16, ge=1)
    """Sequences per micro-batch, summed over all processes (the global micro-batch)."""
    grad_accum: int = Field(1, ge=1)
    """Micro-batches per optimizer step. Global batch = batch_size * grad_accum sequences."""
    batch_ramp: list[list[int]] | None = None
    """A global batch-size ramp (GPT-3 style): `[[step, sequences], ...]`, the first at step 0,
    steps rising, counted from 0 as the step rows are (a change at 100 applies from logged
    step 100, the 101st step).
    Each size is a multiple of `batch_size` (that step accumulates size / batch_size
    micro-batches) and the last is the full batch, batch_size * grad_accum, which holds to
    the end. The steps cut the same data order into other lengths: every sequence is still
    read once per epoch, and a resume on another process count reads the same batches.
    The learning-rate schedule is per optimizer step and unchanged by the ramp (warm-up and
    decay count steps, not sequences); lower `lr` or lengthen `warmup_steps` if the small
    early batches need it. None (the default): every step reads the full batch."""
    optimizer: Literal["adamw", "muon"] = "adamw"
    """adamw: AdamW on every parameter. muon: Muon (train/optim.py) on the hidden 2-D weight
    matrices and AdamW on embeddings, the tied head, norm gains and biases."""
    lr: float = Field(3e-3, gt=0.0, le=LR_MAX, allow_inf_nan=False)
    """Peak learning rate of AdamW (with optimizer muon: of the parameters AdamW keeps)."""
    muon_lr: float = Field(0.02, gt=0.0, le=LR_MAX, allow_inf_nan=False)
    """Peak learning rate of Muon's matrices (optimizer muon only); same schedule as lr."""
    muon_momentum: float = Field(0.95, ge=0.0, lt=1.0)
    """Muon's Nesterov momentum (optimizer muon only)."""
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0)
    """The cosine schedule decays to lr * min_lr_ratio."""
    warmup_steps: int = Field(50, ge=0)
    """Linear warm-up steps."""
    weight_decay: float = Field(0.1, ge=0.0)
    """Decoupled weight decay on hidden matrices (not on norms, biases or embeddings), by AdamW
    or, with optimizer muon, by Muon."""
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    """AdamW beta1."""
    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    """AdamW beta2."""
    grad_clip: float = Field(1.0, ge=0.0)
    """Clip the global gradient norm to this value; 0 disables clipping."""
    seed: int = Field(1337, ge=0, le=SEED_MAX)
    """Seeds model initialisation, dropout and the data order."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Compute precision: fp32, or bf16 autocast with fp32 weights and optimizer state."""
    eval_interval: int = Field(100, ge=1)
    """Validation loss and bits per byte every this many steps, and at the end."""
    eval_batches: int = Field(8, ge=1)
    """Micro-batches of validation data per evaluation."""
    log_interval: int = Field(10, ge=1)
    """Plain progress lines every this many steps when not on a terminal."""
    threads: int | None = Field(None, ge=1)
    """torch intra-op threads; default: torch's choice. Fix it for bitwise reproducibility
    across machines with different core counts."""

    @model_validator(mode="after")
    def _ramp_reaches_the_full_batch(self) -> TrainConfig:
        ramp = self.batch_ramp
        if ramp is None:
            return self
        full = self.batch_size * self.grad_accum
        form = "train.batch_ramp as [[0, size], [step, size], ...], or leave it out"
        try:  # the sampler's rules (config/batch_ramp.py), then the recipe's own
            schedule_changes(ramp, "train.batch_ramp", form)
        except ConfigError as e:
            raise ValueError(f"{e.message}: {e.fix}") from None
        for i, (_, size) in enumerate(ramp):
            if size % self.batch_size:
                raise ValueError(
                    f"train.batch_ramp[{i}] has {size} sequences, not a positive multiple of "
                    f"train.batch_size={self.batch_size} (the micro-batch a step accumulates)"
                )
        if ramp[-1][1] != full:
            raise ValueError(
                f"train.batch_ramp ends at {ramp[-1][1]} sequences, not the full batch "
                f"train.batch_size * train.grad_accum = {full}: end the ramp at {full}"
            )
        return self


class CheckpointConfig(_Section):
    interval: int = Field(100, ge=1)
    """Write a checkpoint every this many steps (and always at the end)."""
    keep: int = Field(3, ge=1)
    """Valid checkpoints to keep; the newest verified one is never deleted."""
    dir: str | None = None
    """Where checkpoints go: a path or any fsspec URL (`s3://bucket/prefix`, `file://...`).
    Default: `RUN_DIR/checkpoints`."""
    storage_options: dict[str, Any] = Field(default_factory=dict)
    """fsspec options for a URL `dir`, e.g. `{key, secret, client_kwargs: {endpoint_url}}`
    for S3-compatible stores; empty uses the backend's defaults (environment credentials)."""
    async_save: bool = True
    """Write checkpoints in the background: the loop stops only to copy its small state and
    trains on while a thread copies the weights and the optimizer state (the next step waits
    for that copy before its update), then writes, verifies and prunes; the next save and the
    end of the run wait for the write. A crash mid-write leaves the previous checkpoint as it
    was. `false` writes in the loop (the same files)."""
    queue: int = Field(2, ge=1)
    """With `async_save`: how many snapshots may be held at once, the one being written
    included. A save waits for the oldest write only when this many are held (1: every save
    waits for the previous write). Memory: up to this many copies of the weights and the
    optimizer state, on their device, besides the live ones."""
    when_full: Literal["wait", "skip"] = "wait"
    """With `async_save`, a save that finds the queue full: `wait` for room, or `skip` it (an
    info finding, C124) so the loop never waits for storage; the last save of a run always
    waits."""


class PreflightConfig(_Section):
    enabled: bool = True
    """Run the pre-flight checks before training."""
    fail_on_error: bool = True
    """Refuse to train when a pre-flight check reports an error finding."""
    doctor: bool = False
    """Run `trainguard doctor --quick` on every rank before anything else (after the resume
    check, before data preparation): compute, memory, collectives, the checkpoint storage and
    the environment against known answers (`trainguard run --doctor` sets it for one run).
    Its errors stop the run like any pre-flight error; it runs even with `enabled: false`."""
    contamination_max: float = Field(0.5, ge=0.0, le=1.0)
    """Share of an eval task's examples found in the training data (D250: a 13-gram in common,
    a MinHash near-copy, or an edited copy) above which pre-flight reports an error; at or below
    it a warning. Code shares idioms and licence headers, so some overlap is incidental: the
    default recipe's python_next_line has about 29% of its examples sharing a 13-gram with the
    training split, 36.5% with edited copies counted."""


class PredictionConfig(_Section):
    band: str | None = None
    """A band file from `trainguard scale fit --band`: the run's validation loss must stay in
    the loss band the scaling-law fit predicts at each token count (E151 above, E152 below)."""
    margin: float = Field(0.02, ge=0.0)
    """Relative slack around the band before an evaluation counts as off track."""
    patience: int = Field(2, ge=1)
    """Consecutive off-track evaluations before the alarm fires."""


class ReferenceConfig(_Section):
    path: str | None = None
    """A reference curve from `trainguard reference record RUN_DIR --out REF.json`: the run's
    training loss is compared with it step by step. Default: the reference shipped next to a
    shipped recipe when one was recorded at exactly this recipe's settings (`trainguard
    recipes` lists them); none otherwise. A reference of another recipe (any non-operational
    key differs, docs/recipes.md#operational-keys) is refused unless `force`."""
    enabled: bool = True
    """Compare with the reference; false ignores `path` and the shipped references."""
    force: bool = False
    """Use a `path` recorded for another recipe anyway (`trainguard run --force` sets it): the
    differing keys are reported (R505) and the curve is compared with the band only."""
    interval: int = Field(10, ge=1)
    """Steps between verdicts on the band (every step's loss feeds the comparison; a bitwise
    departure is reported at once)."""
    threshold: float = Field(5.0, gt=0.0)
    """How far outside the band, accumulated, the loss may go before R501: a CUSUM decision
    limit in units of the reference's noise (its robust scale around its own smoothed curve)."""
    allowance: float = Field(0.5, ge=0.0)
    """Half-width of the band around the reference, in units of its noise: steps within it
    accumulate nothing (the CUSUM allowance)."""


class Recipe(_Section):
    """A complete, validated training recipe."""

    name: str = "default"
    """Recipe name; the default run dir is `runs/<name>`."""
    description: str = ""
    """One line on what the recipe is for."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Corpus and sample length."""
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    """Tokenizer training."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The reference GPT."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """Optimisation and the loop."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Verified checkpoints."""
    preflight: PreflightConfig = Field(default_factory=PreflightConfig)
    """Checks before the first step."""
    guards: GuardsConfig = Field(default_factory=GuardsConfig)
    """In-run detectors, their actions, the hang watchdog."""
    evals: EvalsConfig = Field(default_factory=EvalsConfig)
    """Use-case evals defined before training, run before, during and after it."""
    prediction: PredictionConfig = Field(default_factory=PredictionConfig)
    """Where a scaling-law fit says this run's loss should land (the off-track alarm)."""
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    """Where metrics and findings go besides `metrics.jsonl`: TensorBoard, W&B."""
    reference: ReferenceConfig = Field(default_factory=ReferenceConfig)
    """The known-good curve this run is compared with (`trainguard reference record`)."""
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    """Several processes (`trainguard run --nproc N`, torchrun): timeouts, replica checks,
    stragglers, hung ranks."""
