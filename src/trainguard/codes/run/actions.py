"""Run codes R201-R299: the Guard's actions and the hang watchdog."""

from trainguard.codes import Code, register

register(
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
