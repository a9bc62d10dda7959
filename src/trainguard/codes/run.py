"""Run layer codes (R): what goes wrong while a run trains.

R101-R199 in-run detectors; R201-R299 actions and the hang watchdog; R301-R399
multi-process hangs; R401-R499 fire drills (and R619, a drill's documented blind spot);
R501-R509 reference curves: a run compared with a known-good run of its recipe; R601-R605
MoE router health and data-loader stalls; R620-R629 the learning-rate schedule across resumes.

A code is never reused or renumbered; a renamed one gets a redirect in `codes/__init__.py`
(REDIRECTS). `docs/codes.md` is generated from these entries.
"""

from trainguard.codes import Code, register

_SPIKE_REFS = (
    "Chowdhery et al. 2022, PaLM, sec. 5.1 (restart before the spike, skip 200-500 batches)",
    "Zhang et al. 2022, OPT-175B logbook (loss spikes, divergence, lowering the LR)",
    "Takase et al. 2023, Spike No More: Stabilizing the Pre-training of LLMs",
)
_REF_RERECORD = (
    "If the change is intended, record a new reference from a finished run: `trainguard "
    "reference record RUN_DIR --out REF.json`."
)
_REF_REFS = (
    "Page 1954, Continuous Inspection Schemes (the CUSUM)",
    "OLMo, Pythia: published loss curves as the check for a reproduced run",
)
_MOE_DOCS = (
    "docs/own-loop.md#watching-moe-routers-and-the-data-loader",
    "Fedus et al. 2021, Switch Transformer (capacity, aux loss)",
)


# --- R1xx in-run detectors, R2xx actions and the hang watchdog ------------------------------------
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

# --- R3xx multi-process hangs (guard/distributed/guards.py) ---------------------------------------
register(
    Code(
        code="R301",
        title="Hung rank: a rank did not reach a collective or the step boundary",
        severity="error",
        catches="After warm-up, collectives run with a short timeout (derived from the run's "
        "step times: max(`distributed.timeout_floor_s`, min(`collective_timeout_s`, "
        "`timeout_factor` x p99 step time))) and the ranks meet in a gloo monitored barrier "
        "at step boundaries. On a timeout every surviving rank enters a monitored barrier "
        "(`wait_all_ranks=True`, the hang timeout, derived the same way under "
        "`distributed.hang_timeout_s`) that names the ranks which did "
        "not arrive; their hosts, the phase and step are recorded and the stacks of this "
        "process dumped to RUN_DIR/hang-<time>-rank<r>.txt.",
        why="A collective timeout by itself says only that someone did not answer, after tens "
        "of minutes by default; every rank waits and nobody is named.",
        fix="The process exits with status 3 so the launcher (`--max-restarts`) restarts the "
        "job and auto-resume continues from the last verified checkpoint. If the same rank or "
        "host hangs again, run `trainguard doctor` on the job's nodes (it tests every rank, "
        "link and collective with timeouts) and drain what it names; read the stack dump for "
        "where it stopped.",
        false_positives="A rank that is merely much slower than the timeout (a huge first "
        "step, a long evaluation on one rank, a checkpoint save outside a `checkpoint` phase); "
        "mark checkpoints and evaluations with `guard.phase('checkpoint'|'eval', step)` on "
        "every rank, also when only rank 0 writes (they have budgets of their own), raise "
        "`distributed.timeout_floor_s` or `distributed.warmup_steps`, or set "
        "`distributed.derive_timeouts: false`.",
        references=(
            "torch.distributed.monitored_barrier",
            "PyTorch Flight Recorder for NCCL collectives",
        ),
    ),
    Code(
        code="R302",
        title="Dead rank: a rank exited or was killed",
        severity="error",
        catches="A rank's process ended (an exit, a crash, a SIGKILL from the OOM killer or a "
        "scheduler) while the others trained. A surviving rank whose collective fails checks "
        "its peers' processes (their pids, gathered at start) and names the dead ones, with the "
        "exit signal or status when the kernel still holds it; `trainguard run --nproc` and "
        "`doctor --nproc` name each dead worker with the status the launcher saw. Within "
        "seconds: a gloo peer's closed connection fails the collective at once.",
        why="Without it a crash looks like a hang: the survivors wait out their collective and "
        "barrier timeouts (minutes) and report R301 naming nobody; only the launcher's own log "
        "says which local rank died and how.",
        fix="Read the dead rank's own log for its last error; signal 9 (SIGKILL) is most often "
        "the kernel's OOM killer (`dmesg`, the node's memory) or the scheduler. The survivors "
        "exit with status 3 so the launcher (`--max-restarts`) restarts the job and auto-resume "
        "continues from the last verified checkpoint. If the same host loses ranks again, run "
        "`trainguard doctor` on it.",
        false_positives="None known: a rank whose process is gone is dead. A rank on another "
        "host cannot be looked at from here: when a peer's connection closed (gloo) it is "
        "R302 without a rank (the peer's address in `data.peer_address`), and that host's "
        "launcher names the rank; a survivor that exits after naming it also closes its "
        "connections, so in a large job a few such findings share one cause.",
        references=("torch.distributed.elastic ChildFailedError (the agent's exit codes)",),
    ),
)

# --- R4xx fire drills (`trainguard drill`) whose fault was missed ---------------------------------
register(
    Code(
        code="R401",
        title="Fire drill: the injected fault was not detected",
        severity="error",
        catches="A drill injected a fault into a real run and none of the codes that should "
        "catch it appeared.",
        why="A guard that misses a drilled fault will miss the real one: the run goes on with a "
        "poisoned update, a corrupt weight or a stuck process, and nobody is told.",
        fix="Read the drill's run dir (kept with --keep): its metrics.jsonl shows what the "
        "detectors saw. Tune the guards section of the recipe (thresholds, actions) or fix the "
        "detector.",
        false_positives="A fault that truly has no effect (a bit flip in a weight the step "
        "never reads) cannot be detected; the drills inject faults that always matter.",
        references=("docs/drills.md",),
    ),
    Code(
        code="R402",
        title="Fire drill: the run did not recover from the injected fault",
        severity="error",
        catches="After the fault (and a relaunch where the drill needs one, as a launcher "
        "would do), the run did not finish all its steps, or its final validation loss is "
        "far from the clean run's.",
        why="Detection without recovery still loses the run: a rollback loop, a resume from the "
        "wrong step or a corrupt checkpoint chosen over a good one.",
        fix="Read the drill's run dir (kept with --keep) and the row's note; check the actions "
        "(guards.actions, guards.max_rollbacks) and the checkpoint interval.",
        false_positives="A recipe whose final loss is very noisy at drill settings can differ "
        "from the clean run by more than the tolerance after a skipped batch.",
        references=("docs/drills.md",),
    ),
    Code(
        code="R403",
        title="Fire drill: the clean run raised an alarm",
        severity="error",
        catches="The drill's fault-free run produced a warning or error finding.",
        why="False alarms train people to ignore the guards, and an action taken on a false "
        "alarm (a skipped or rolled-back step) costs work for nothing.",
        fix="Look at the finding: a real event at drill settings (an early gradient spike at a "
        "high learning rate) is fixed by the recipe; a false alarm by the detector's thresholds.",
        false_positives="Early training at a high learning rate has real gradient-norm spikes; "
        "the drill settings use a gentler schedule for that reason.",
        references=("docs/drills.md",),
    ),
    Code(
        code="R619",
        title="Fire drill: a documented blind spot did not behave as documented",
        severity="error",
        catches="A drill that demonstrates what the guards cannot see (a low mantissa bit "
        "flipped in one process's weight) either raised a code that claims to catch it, or "
        "left the final weights bitwise equal to the clean run's (the fault never took "
        "effect, so the row proves nothing).",
        why="The drill matrix states what one process can and cannot see. If a detector starts "
        "to fire on the blind-spot fault, or the fault stops landing, the documented limitation "
        "is no longer true and docs/drills.md would mislead.",
        fix="If a code now catches the fault, turn the drill into a detection drill (expected "
        "codes, recovery) and update the drill matrix in docs/drills.md; if the fault did not "
        "land, check that the flipped weight is still read by every step "
        "(faults.py).",
        false_positives="None known: the clean run and the drill run are bitwise deterministic "
        "on CPU, so equal weights mean the fault had no effect.",
        references=("docs/drills.md",),
    ),
)

# --- R501-R509 reference curves (`trainguard reference`, `reference.path`) ------------------------
register(
    Code(
        code="R501",
        title="Run left its reference curve",
        severity="error",
        catches="A training loss that departs from the reference run's loss at the same steps "
        "by more than the reference's own noise, for long enough: a two-sided CUSUM of the "
        "difference in units of that noise (its robust scale around its smoothed curve) passed "
        "`reference.threshold`. The finding names the first step of departure and lists the "
        "environment differences (H101) next to it.",
        why="After a torch, driver, kernel or data-pipeline change, or a small code change (an "
        "attention scale, an initialisation), a run still trains and its curve still looks "
        "plausible, but it is not the recipe's known run: the budget is spent on something "
        "nobody tested.",
        fix="Look at what changed since the reference (the H101 finding beside it, `git log`, "
        "the data identity) and at the step it names. " + _REF_RERECORD,
        false_positives="The comparison assumes paired runs (same recipe, same batches, "
        "verified per step). Long GPU runs with non-deterministic kernels drift apart "
        "slowly; raise `reference.threshold` or `reference.allowance` if that drift alone "
        "fires. A reference recorded with other software (`single_environment: false`) is "
        "compared with the band only.",
        references=_REF_REFS,
    ),
    Code(
        code="R502",
        title="Bitwise departure from the reference on the same environment",
        severity="warning",
        catches="A CPU run with the same software, CPU, thread count and process count as its "
        "reference whose loss at some step is not exactly the reference's. Names the first "
        "such step.",
        why="On CPU trainguard's runs are deterministic: the same recipe on the same software "
        "gives bitwise the same curve. Any departure means what is computed changed (the "
        "code, a kernel, the data), however small the effect on the loss.",
        fix="Find the change (the H101 finding lists a changed trainguard revision; `git diff` "
        "it). " + _REF_RERECORD,
        false_positives="A deliberate change that is meant to alter numerics (a new kernel, a "
        "fused operation) fires it once: record the new reference.",
        references=_REF_REFS,
    ),
    Code(
        code="R503",
        title="Data differs from the reference's",
        severity="warning",
        catches="A run whose prepared data (tokenizer, train or validation tokens) is not the "
        "data its reference was trained on. The curves are then not compared.",
        why="A changed tokenizer merge, corpus or cleaning step changes what every step "
        "trains on; a loss comparison across different data measures the data, not the run.",
        fix="Point the run at the reference's data (its `data_identity` names the tokenizer and "
        "shard checksums), or record a reference on this data.",
        false_positives="A shipped recipe's reference was recorded on the Python standard "
        "library of one Python version: another version's library is other data.",
        references=_REF_REFS,
    ),
    Code(
        code="R504",
        title="Batches differ from the reference's",
        severity="warning",
        catches="A step whose batch hash is not the reference's at that step: a changed data "
        "order, or batches skipped after a rollback. The comparison stops there.",
        why="The comparison is paired: both runs must read the same batches for their "
        "difference to cancel the batch-to-batch scatter.",
        fix="If the guards rolled back and skipped batches, the departure is expected. Otherwise "
        "the data order changed: check `train.seed`, `data/order.py` and the data identity.",
        references=_REF_REFS,
    ),
    Code(
        code="R505",
        title="Reference of another recipe used on purpose",
        severity="warning",
        catches="A run compared with a reference recorded for a recipe that differs in "
        "non-operational keys, allowed by `reference.force` (`trainguard run --force`). Lists "
        "the differing keys.",
        why="Such a comparison is a loose guide at best: the band assumes the same recipe.",
        fix="Record a reference for this recipe; without `--force` a mismatched reference is "
        "refused (exit 2).",
        references=_REF_REFS,
    ),
    Code(
        code="R506",
        title="Reference comparison summary",
        severity="info",
        catches="The result of comparing the run with its reference at the reference's last "
        "step: bitwise equal, within the band, or outside it; the largest difference and the "
        "noise.",
        why="A quiet comparison should say that it happened and how close the run came.",
        fix="Nothing to do.",
        references=_REF_REFS,
    ),
    Code(
        code="R507",
        title="Reference recorded from a run that was not clean",
        severity="warning",
        catches="`trainguard reference record` on a finished run whose guards skipped updates "
        "or rolled back, or that resumed under other software (H101).",
        why="A reference should be a known-good run: a rerun of the recipe does not repeat "
        "skipped batches or a mid-run software change.",
        fix="Record the reference from a clean run of the recipe. A reference recorded across "
        "software versions is compared with the band only, never bitwise.",
        references=_REF_REFS,
    ),
)

# --- R601-R605 MoE router health and data-loader stalls (guard/detectors/moe.py, loader.py) -------
register(
    Code(
        code="R601",
        title="MoE layer drops tokens above the threshold",
        severity="warning",
        catches="An MoE layer's router sent more assignments to experts than their capacity "
        "holds: the share of dropped token-to-expert assignments (`tokens_dropped / "
        "tokens_routed` of the router statistics) stayed above `guards.moe_drop_max` for "
        "`guards.moe_patience` steps in a row. The worst layer is named.",
        why="A dropped token skips the layer's feed-forward (only the residual stream carries "
        "it): the model silently trains on less compute than its config says, and the drops "
        "concentrate on the tokens of the busiest experts.",
        fix="Raise `model.moe.capacity_factor`, raise `model.moe.aux_loss_weight` so the router "
        "balances, or use `model.moe.router=dropless`. If R603 or R602 came with it, the router "
        "has collapsed: fix that first.",
        false_positives="The first steps of a fresh router can drop a few percent; the default "
        "threshold (20%) and patience stay quiet on the clean runs of tests/test_moe_health.py.",
        references=_MOE_DOCS,
    ),
    Code(
        code="R602",
        title="MoE expert is dead (computes no tokens)",
        severity="warning",
        catches="An expert of an MoE layer computed no token for `guards.moe_dead_patience` "
        "steps in a row while its layer routed tokens. The layer and the expert are named.",
        why="A dead expert is parameters that never train: the model has less capacity than it "
        "pays for, and once the router stops picking an expert it rarely comes back.",
        fix="Raise `model.moe.aux_loss_weight` (the load-balancing loss), lower the learning "
        "rate of the router, or re-initialise the dead expert's gate row; check for R603.",
        false_positives="Tiny batches (few tokens per step) can leave an expert idle by chance "
        "for a step or two; the patience (20 steps by default) covers that.",
        references=_MOE_DOCS,
    ),
    Code(
        code="R603",
        title="MoE router collapsed onto a few experts",
        severity="error",
        catches="In an MoE layer, the top_k busiest experts computed at least "
        "`guards.moe_collapse_share` of all assignments for `guards.moe_patience` steps in a "
        "row: the router sends (nearly) every token to the same experts.",
        why="A collapsed router turns the MoE layer into one dense feed-forward (or, with "
        "capacity, into one that drops most tokens): the other experts stop training and the "
        "model's quality falls behind what its size promises.",
        fix="Roll back to a checkpoint before the collapse and raise "
        "`model.moe.aux_loss_weight` or lower the learning rate; keep the router in fp32.",
        false_positives="None known for top_k < n_experts: a healthy router spreads tokens, and "
        "the load-balancing loss keeps it doing so.",
        references=_MOE_DOCS,
    ),
    Code(
        code="R604",
        title="MoE load imbalance rising",
        severity="warning",
        catches="An MoE layer's load imbalance (the busiest expert's share of assignments times "
        "n_experts: 1 is balanced), smoothed over `guards.moe_imbalance_span` steps, rose more "
        "than `guards.moe_imbalance_rise` above its lowest value for `guards.moe_patience` "
        "steps in a row, after `guards.moe_min_steps` steps.",
        why="Rising imbalance is the early sign of router collapse and of token drops: the "
        "busiest expert gets more tokens than its capacity, the idle ones stop learning.",
        fix="Watch for R601-R603; raise `model.moe.aux_loss_weight` or lower the learning rate "
        "before the router collapses.",
        false_positives="A router that starts perfectly balanced by chance and settles at a "
        "mild, stable imbalance rises once; the rise threshold (50% of the smoothed value) is "
        "set above what the clean runs of tests/test_moe_health.py show.",
        references=_MOE_DOCS,
    ),
    Code(
        code="R605",
        title="Data loader stall: the data phase takes a large share of the step",
        severity="warning",
        catches="The data phase of the step (fetching and preparing the batch: "
        "`data_time_s`) took at least `guards.loader_share` of the step's time, as the median "
        "of the last `guards.loader_window` steps. It names the loader, not a slow rank (H202) "
        "or a slow step (R106): the compute did not slow down, the batches came late.",
        why="Accelerators wait for the input pipeline: every second the loader takes is a "
        "second of the step the model does not train, and throughput falls without any "
        "compute fault to find.",
        fix="More loader workers or prefetching, a faster store (local cache, memory-mapped "
        "shards), less work per sample in the data path (tokenize ahead: `trainguard data "
        "prepare`).",
        false_positives="Very small models whose compute takes less time than reading a batch "
        "have a large data share by nature; raise `guards.loader_share` for them.",
        references=("docs/own-loop.md#watching-moe-routers-and-the-data-loader",),
    ),
)

# --- R620-R629 the learning-rate schedule across resumes ------------------------------------------
register(
    Code(
        code="R620",
        title="train.max_steps changed on resume: the LR schedule was extended, not reshaped",
        severity="info",
        catches="A run resumed with another `train.max_steps` than the checkpoint planned. "
        "The schedule keeps its warm-up and cosine decay to the old end and, for a larger "
        "max_steps, appends the segment `train.schedule_on_extend` names (constant or "
        "rewarm); the finding gives both ends and the LR of the checkpoint's step and of the "
        "next.",
        why="A cosine schedule is a function of max_steps: recomputing it for a new max_steps "
        "moves every later step's LR, so a run resumed near its end would jump from the "
        "minimum back to a large LR with nothing logged (a loss spike, or a silently "
        "different run). Keeping the decay and saying what was appended makes the change "
        "explicit and the curve explainable.",
        fix="Nothing, if the extension was meant. Choose `train.schedule_on_extend: rewarm` "
        "to climb back to the peak (continued pre-training) or `constant` to hold the last LR "
        "(fine-tuning the end of a run); start a new run for a different schedule.",
        false_positives="None: it records a change of the recipe.",
        references=(
            "Ibrahim et al. 2024, Simple and Scalable Strategies to Continually Pre-train "
            "Large Language Models (re-warming and re-decaying the LR)",
        ),
    ),
)

# --- R701-R709 goodput planning (`trainguard plan`) ---------------------------------------------
_GOODPUT_DOCS = "docs/goodput.md"
register(
    Code(
        code="R701",
        title="Goodput plan: saves wait for the previous checkpoint write",
        severity="warning",
        catches="At the plan's checkpoint interval, or the one in use now (`--interval`, or "
        "the run's `checkpoint.interval`), writing a checkpoint until it is durable takes "
        "longer than the training between two saves plus the stall, so each save waits for "
        "the previous write: the wait is a stall too, and the plan counts it.",
        why="An asynchronous save hides its write only while the write is shorter than the "
        "interval. Past that, training blocks on every save, and a failure during the longer "
        "write falls back one more checkpoint: a short interval buys nothing.",
        fix="Make the write faster (local disk before object storage, fewer bytes: sharded "
        "saves, no optimizer copy you do not need), or save less often; the plan's interval "
        "already weighs the wait.",
        false_positives="Write times measured on a loaded machine or cold storage overstate "
        "the wait; measure on the fleet's storage.",
        references=(_GOODPUT_DOCS,),
        lifecycle="preview",
    ),
    Code(
        code="R702",
        title="Goodput plan: failures outpace progress (ETTR below one half)",
        severity="warning",
        catches="The expected effective training time ratio at the planned interval and "
        "number of GPUs is below 0.5: the job fails about as often as it can restart and "
        "reach its next durable checkpoint.",
        why="A job's failure rate grows with its GPUs (job MTBF = per-GPU MTBF / N). When "
        "restarts and redone work take most of the wall time, adding GPUs can slow the run.",
        fix="Cut the restart time (warm spares, faster checkpoint load), the stall "
        "(asynchronous saves) and the failure rate (health checks that drain bad hosts), or "
        "run on fewer GPUs until they are cut.",
        false_positives="A pessimistic failure rate: the default is Llama 3 405B's, an early "
        "H100 fleet; give --gpu-mtbf-hours from your own fleet's records.",
        references=(_GOODPUT_DOCS,),
        lifecycle="preview",
    ),
    Code(
        code="R703",
        title="Goodput plan: Young/Daly's interval is not the optimum here",
        severity="info",
        catches="The interval of Young/Daly's first-order formula, sqrt(2 * stall * MTBF), "
        "gives a lower expected ETTR than the best whole number of steps under the full "
        "model (by at least 0.001): the write outlasts Young's interval, or the MTBF is not "
        "large against the stall, the restart and the interval, where the first-order "
        "formula stops holding. The plan gives the model's optimum.",
        why="The first-order formula assumes failures are rare within an interval and that a "
        "save costs only its stall; a checkpoint interval taken from it where those fail "
        "loses goodput.",
        fix="Nothing to do: use the plan's interval_steps (the model's optimum, checked by "
        "the simulation).",
        false_positives="None: it records which formula gave the interval.",
        references=(_GOODPUT_DOCS, "Young 1974; Daly 2006 (optimum checkpoint intervals)"),
        lifecycle="preview",
    ),
)
