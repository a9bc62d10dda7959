"""Multi-process codes: replicas (H201, H203), stragglers (H202), hung ranks (R301). Never
renumber."""

from trainguard.codes import Code, register

register(
    Code(
        code="H201",
        title="Replica divergence: a rank's parameters differ from the others",
        severity="error",
        catches="Every `distributed.replica_check_interval` steps, and before every checkpoint, "
        "all ranks hash their parameters (xxhash of the raw bytes; optionally the optimizer "
        "state) and gather the hashes. Among ranks that hold the same parameters (DDP: all; "
        "HSDP: the ranks holding one shard) a rank whose hash differs from the majority is "
        "named with its host. With two ranks there is no majority: both are named as suspects.",
        why="Data-parallel replicas must hold bitwise the same weights: they start equal and "
        "apply the same averaged gradients. A difference means silent data corruption (a bad "
        "chip or memory) or a bug that desynchronised one rank; the run goes on without any "
        "error, averaging gradients of different models, and checkpoints hold rank 0's copy only.",
        fix="The run rolls back to the newest verified checkpoint (all ranks reload it). If the "
        "same host is named again, drain it: rerun its step on other hardware to confirm.",
        false_positives="Non-deterministic kernels whose results differ per rank only when a "
        "rank computes something the others do not (e.g. per-rank buffers not synchronised).",
        references=(
            "Dixit et al. 2021, Silent Data Corruptions at Scale (Meta)",
            "Hochschild et al. 2021, Cores that don't count (Google)",
            "Gemini / PaLM reports: SDC checks by replica comparison",
        ),
    ),
    Code(
        code="H202",
        title="Straggler: one rank computes much slower than the others",
        severity="warning",
        catches="Every `distributed.straggler_interval` steps the ranks gather their phase "
        "timings (data, forward and backward, optimizer: busy CPU time of the training thread; "
        "communication: the wall time spent waiting). A rank is named when its busy time per "
        "step scores below `distributed.straggler_threshold` both against the fastest rank "
        "(fastest / its own) and against its own history (its median over earlier intervals / "
        "now).",
        why="Data parallelism runs at the pace of the slowest rank: one throttled or failing "
        "chip slows every step of every rank, and the others only show it as time waiting in "
        "the all-reduce.",
        fix="Check the named host (thermal throttling, a failing device, a noisy neighbour, a "
        "slow data path): `trainguard doctor` on the job's nodes (under the same torchrun) "
        "names a slow or throttled rank against the others; restart the job without it if it "
        "persists.",
        false_positives="A rank that legitimately does more work (uneven data on the last "
        "batch, a rank that also writes checkpoints or logs). On GPUs the busy time of the "
        "Python thread is not the device time; the scores there say less.",
        references=("Megatron-LM straggler detector", "Wu et al. 2024, FALCON: stragglers"),
    ),
    Code(
        code="H203",
        title="No replicas to compare: the model is fully sharded",
        severity="info",
        catches="The replica check (H201) found no two ranks that hold the same parameters: "
        "every parameter is a DTensor sharded over every rank (plain FSDP2 `fully_shard` on a "
        "1-D mesh). Said once per run, at the first check.",
        why="A replica comparison needs replicas. Fully sharded training keeps one copy of "
        "each shard, so a corrupted shard cannot be told from a healthy one by comparison, and "
        "the check would otherwise pass silently while checking nothing.",
        fix="Nothing to fix: know that silent corruption is not checked for this model. HSDP "
        "(`fully_shard` on a 2-D (replicate, shard) mesh) or DDP keep replicas, and the check "
        "compares them.",
        false_positives="None known.",
        references=("PyTorch FSDP2 `fully_shard` and HSDP (2-D device mesh)",),
    ),
    Code(
        code="R301",
        title="Hung rank: a rank did not reach a collective or the step boundary",
        severity="error",
        catches="After warm-up, collectives run with a short timeout "
        "(`distributed.collective_timeout_s`) and the ranks meet in a gloo monitored barrier "
        "at step boundaries. On a timeout every surviving rank enters a monitored barrier "
        "(`wait_all_ranks=True`, `distributed.hang_timeout_s`) that names the ranks which did "
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
        "step, a long evaluation on one rank); raise `distributed.collective_timeout_s` or "
        "`distributed.warmup_steps`.",
        references=(
            "torch.distributed.monitored_barrier",
            "PyTorch Flight Recorder for NCCL collectives",
        ),
    ),
)
