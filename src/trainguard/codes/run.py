"""Run layer failure codes: R1xx in-run detectors, R2xx actions and the hang watchdog.

Never reuse or renumber a code. R3xx (multi-process hangs) lives with the distributed work.
"""

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
        catches="After removing the trend (a degree-5 polynomial in log step fitted to log loss "
        "over the last `oscillation_window` rows), the residual spectrum has a peak that "
        "Fisher's g-test finds significant at `oscillation_alpha`; or, for a faint wave (0.5% "
        "of the loss under 2% noise), the periodogram of the last 2-8 half-window blocks joined "
        "(each detrended on its own) has a peak beyond chance at the same level, present in "
        "every block. The message names the period; `data.period_steps` holds it, "
        "`data.windows` the number of blocks joined (1: one window), and "
        "`data.matches_data_period` says whether it equals (or divides) the known data period "
        "(shard or epoch length).",
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
        code="R201",
        title="Update skipped",
        severity="info",
        catches="The guard told the loop not to apply this step's update (a non-finite or "
        "spiking loss or gradient norm).",
        why="Recorded so that the data order stays auditable: the batch was seen but not learned.",
        fix="Nothing, unless skips repeat; then the guard escalates to a rollback (R204).",
    ),
    Code(
        code="R202",
        title="Rollback to the last good checkpoint",
        severity="warning",
        catches="The guard asked the loop to restore the last good checkpoint and skip the "
        "offending batches (divergence or repeated bad steps).",
        why="Recorded with the steps whose batches are skipped, so the data order stays "
        "deterministic and auditable after the rollback.",
        fix="If rollbacks recur, lower the learning rate or look at the skipped batches.",
    ),
    Code(
        code="R203",
        title="Run halted by the guard",
        severity="error",
        catches="The guard needed more than `max_rollbacks` rollbacks in one run, or a finding "
        "whose configured action is `halt` occurred.",
        why="A run that keeps failing from the same checkpoint will not recover by itself; "
        "stopping with a report saves the compute.",
        fix="Read the findings before the halt; lower the learning rate, check the data around "
        "the skipped batches, rerun the suspect step to rule out hardware, then resume.",
    ),
    Code(
        code="R204",
        title="Repeated bad steps",
        severity="warning",
        catches="At least `repeat_count` skipped steps (non-finite or spikes) within "
        "`repeat_window` steps.",
        why="One bad batch is noise; a cluster means the model state itself is going bad, and "
        "skipping more steps will not save it.",
        fix="Roll back to the last good checkpoint (the default action) and skip the offending "
        "batches; lower the learning rate if it happens again.",
    ),
    Code(
        code="R205",
        title="Rerun differs: suspected hardware fault (silent data corruption)",
        severity="error",
        catches="The same step recomputed from the same state and batch gave a different result.",
        why="Deterministic code on healthy hardware gives the same answer twice; a difference "
        "points to a faulty chip, memory or link that corrupts results without any error.",
        fix="Take the machine out of service and run its vendor diagnostics; resume the run "
        "elsewhere from the last checkpoint verified by checksum.",
        false_positives="Nondeterministic kernels (atomics in scatter/index_add, some cuDNN "
        "algorithms) differ run to run by rounding; enable deterministic algorithms or set "
        "`rerun_rtol` above their noise.",
        references=(
            "Dixit et al. 2021, Silent Data Corruptions at Scale (Meta)",
            "Hochschild et al. 2021, Cores that don't count (Google)",
        ),
    ),
    Code(
        code="R206",
        title="Rerun identical: data or software fault",
        severity="warning",
        catches="The suspect step recomputed from the same state and batch gave the same result.",
        why="The fault is deterministic: the batch, the model state or the code, not the "
        "hardware. Restarting on other machines will not help.",
        fix="Inspect the batch (its hash is in the metrics log), skip it, and look for a "
        "numerical problem in the code at this model state.",
    ),
    Code(
        code="R210",
        title="Hang: a step exceeded its timeout",
        severity="error",
        catches="No heartbeat from the training loop for longer than its timeout: the larger of "
        "`hang_floor_s` and `hang_factor` times the median of recent step times. The stacks of "
        "every thread are dumped to RUN_DIR/hang-<time>.txt, with the phase the loop was in.",
        why="A stuck collective or a dead data-loader worker stops the run without an error; "
        "communication timeouts fire after tens of minutes and name no culprit.",
        fix="Read the stack dump: the phase (data, forward, backward, optimizer, checkpoint, "
        "collective) and frame say where it stopped. The process exits with status 3 so the "
        "launcher restarts it; auto-resume continues from the last verified checkpoint. If it "
        "happens again, run `trainguard doctor` on the same nodes to find a bad device, link "
        "or rank.",
        false_positives="A legitimately slow step (the first compile, a huge checkpoint write) "
        "longer than the floor; raise `hang_floor_s`.",
        references=("PyTorch Flight Recorder (TORCH_NCCL_TRACE_BUFFER_SIZE) for collectives",),
    ),
)
