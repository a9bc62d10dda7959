"""Run codes R101-R199: the in-run detectors."""

from trainguard.codes import Code, register

_SPIKE_REFS = (
    "Chowdhery et al. 2022, PaLM, sec. 5.1 (restart before the spike, skip 200-500 batches)",
    "Zhang et al. 2022, OPT-175B logbook (loss spikes, divergence, lowering the LR)",
    "Takase et al. 2023, Spike No More: Stabilizing the Pre-training of LLMs",
)


register(
    Code(
        code="R101",
        title="Non-finite loss or gradient norm",
        severity="error",
        catches="A step whose loss or global gradient norm is NaN or +-Inf, seen before the "
        "optimizer applies the update.",
        why="One non-finite update writes NaN into every parameter it touches and the optimizer "
        "moments; the run is lost from that step on, often silently when the loss is logged "
        "rarely.",
        fix="Skip the update (the default action). If it repeats, roll back to the last good "
        "checkpoint, skip the offending batches and look for overflow (fp16 without loss "
        "scaling), a division by zero, or a corrupt batch; rerun the step to rule out hardware.",
        false_positives="None: a non-finite value is always a fault.",
        references=("Micikevicius et al. 2018, Mixed Precision Training (loss scaling)",),
    ),
    Code(
        code="R102",
        title="Loss spike",
        severity="warning",
        catches="A loss far above its recent robust level: more than `loss_spike_z` robust "
        "standard deviations (IQR / 1.349 of the last `spike_window` steps) above the rolling "
        "median AND at least `loss_spike_min_ratio` times that median.",
        why="Spikes mark updates that throw the model out of its basin; unhandled they can turn "
        "into divergence and cost days of compute (PaLM, OPT, BLOOM logbooks).",
        fix="Skip the update. Repeated spikes: roll back to the last good checkpoint and skip the "
        "offending batches; if they keep coming, lower the learning rate or tighten gradient "
        "clipping, and inspect the batches (their hashes are in the metrics log).",
        false_positives="The first steps of training are never scored (`spike_min_history`). "
        "A genuine level shift (a new data mixture) fires once and is absorbed by the window. "
        "Very small batches with heavy-tailed per-batch loss noise (Student-t, 3% std) gave one "
        "single-batch 1.4x outlier in 360,000 synthetic steps; raise `loss_spike_min_ratio` "
        "for such runs.",
        references=_SPIKE_REFS,
    ),
    Code(
        code="R103",
        title="Gradient-norm spike",
        severity="warning",
        catches="A global gradient norm more than `grad_spike_z` robust standard deviations above "
        "its rolling median AND at least `grad_spike_min_ratio` times that median.",
        why="Gradient-norm spikes usually precede loss spikes by a few steps; gradient clipping "
        "hides their size but not the direction change they bring.",
        fix="Skip the update; if spikes repeat, roll back, lower the learning rate, raise Adam's "
        "epsilon or check the batch for garbage (long runs of a repeated token).",
        false_positives="Early training, where the gradient norm changes fast, is not scored "
        "(`spike_min_history`).",
        references=_SPIKE_REFS,
    ),
    Code(
        code="R104",
        title="Divergence: sustained rise of the smoothed loss",
        severity="error",
        catches="The exponentially smoothed loss (span `divergence_span`, single spikes clipped) "
        "stays more than `divergence_rise` above its best value for `divergence_patience` steps.",
        why="A diverging run burns compute for nothing, and the longer it goes on the further "
        "back the last good checkpoint is.",
        fix="Roll back to a checkpoint before the rise began, skip the batches since, and lower "
        "the learning rate or raise warm-up; check the data order for a bad stretch.",
        false_positives="A planned rise (curriculum switching to harder data, a restarted "
        "schedule) looks the same; raise `divergence_rise` or disable R104 for that run.",
        references=_SPIKE_REFS,
    ),
    Code(
        code="R105",
        title="Periodic oscillation of the loss",
        severity="warning",
        catches="After removing the trend (a degree-5 polynomial in log step fitted to log loss), "
        "a periodogram of the residual has a pair of adjacent bins far above its neighbouring "
        "bins (beyond chance at `oscillation_alpha`; a local noise level, so correlated or "
        "uneven batch noise is not a wave), in phase throughout. Three tests: the last "
        "`oscillation_window` rows (periods up to a ninth of it); for a faint short wave (0.5% "
        "of the loss under 2% noise) the last 2-8 half-window blocks joined, each detrended on "
        "its own (periods up to about a ninth of the window); and for a slow wave (1-2% under 3% "
        "noise, periods of hundreds to about a thousand steps) the last 4 windows kept as means "
        "of window/128 rows, periods up to a third of the rows seen. The message names the "
        "period and the relative amplitude; `data.period_steps` and `data.amplitude` hold them, "
        "`data.test` the test that found it (`window`, `blocks`, `long`), `data.rows` the rows it "
        "covered, `data.windows` the number of blocks joined (the long test: windows covered), "
        "and `data.matches_data_period` says whether it equals (or divides) the known data "
        "period (shard or epoch length).",
        why="A loss that waves with the data order means batches are not exchangeable: poorly "
        "shuffled shards or documents, so the model fits each stretch in turn and forgets.",
        fix="Shuffle across shards and documents (a global permutation of samples), not only "
        "within a shard; check `trainguard data inspect` for the order's quality.",
        false_positives="A cyclic learning-rate schedule or periodic evaluation that changes the "
        "model (e.g. EMA swaps) makes a genuine wave; compare the period with those intervals.",
        references=(
            "Fisher 1929, Tests of significance in harmonic analysis",
            "Lee et al. 2022, Deduplicating Training Data Makes Language Models Better",
        ),
    ),
    Code(
        code="R106",
        title="Throughput drop",
        severity="warning",
        catches="Tokens per second stay more than `throughput_drop` below their rolling median "
        "(and more than `throughput_z` robust standard deviations below it) for "
        "`throughput_patience` consecutive steps.",
        why="A slow node, thermal throttling, a filling disk or a data loader that starves the "
        "GPUs wastes the whole job's compute; it often precedes a hang.",
        fix="Look for a straggler (per-rank step times), data-loader stalls (phase timings), "
        "checkpoint writes blocking the loop, or other jobs on the machine.",
        false_positives="Single slow steps (evaluation, checkpoint writes) are ignored by the "
        "patience; a deliberate change of batch size or sequence length also fires once.",
    ),
    Code(
        code="R107",
        title="Loss logged as exactly zero",
        severity="warning",
        catches="A watched loss logged as exactly 0.0 (`trainguard watch`). A language model's "
        "cross-entropy is not exactly zero; a logged 0.0 stands for something else. The "
        "Hugging Face Trainer logs a NaN or Inf loss as a made-up value "
        "(`logging_nan_inf_filter`, on by default, adds `tr_loss / (1 + steps since the last "
        "log)` instead, `tr_loss` being the sum since that log): 0.0 for the first step after "
        "a log, so every non-finite step with `logging_steps=1`, and every logging window "
        "whose steps were all non-finite. With a NaN, Inf or missing gradient norm beside it "
        "in a `trainer_state.json`, the step is reported as R101 instead; a NaN or Inf "
        "gradient norm makes it R101 in any log. A `GuardedTrainer` step skipped for a "
        "non-finite loss logs 0.0 with a gradient norm of 0.0 (its gradients were dropped): "
        "R107, and guard.jsonl holds the skip.",
        why="The step it stands for is hidden: a NaN that went into the weights, or a batch with "
        "no target tokens; a chart shows a dip to zero, not a fault, and the Trainer's own "
        "`train_loss` averages the zeros in.",
        fix="Find out what the step computed: train with `logging_nan_inf_filter=False` (the "
        "Trainer then logs nan), check the batch's labels (every label -100 leaves no loss), and "
        "read the gradient norm of the same step. A run under trainguard's guard says in its "
        "guard.jsonl whether the step was skipped.",
        false_positives="A model that fits its batch exactly (a tiny model memorising a few "
        "samples; a saturated softmax in float32) can log 0.0; so can a metric that is rightly "
        "zero watched as a loss (an auxiliary loss switched off): choose the metrics with "
        "`--metric`. Not seen: a non-finite step inside a logging window with finite steps "
        "(`logging_steps` > 1) logs a plausible average; only the gradient norm of the window's "
        "last step is logged.",
        references=("transformers Trainer: TrainingArguments.logging_nan_inf_filter",),
        lifecycle="preview",
    ),
)
