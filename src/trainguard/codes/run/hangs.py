"""Run codes R301-R399: multi-process hangs (`guard/distributed/guards.py`)."""

from trainguard.codes import Code, register

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
