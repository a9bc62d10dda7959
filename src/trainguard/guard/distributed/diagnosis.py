"""The hung-rank diagnosis of `DistributedGuards`: after a collective failed, name the dead
ranks (R302: a peer whose process ended, looked at on this host) or the ranks that did not
arrive at the monitored barrier (R301), write this process's hang report (stacks, then the
finding) and exit with status 3 for the launcher to restart the job."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from trainguard.errors import ExitStatus
from trainguard.findings import Finding
from trainguard.guard.distributed.hang import (
    dead_rank_finding,
    hung_rank_finding,
    lost_peer,
    lost_peer_finding,
    missing_ranks,
)
from trainguard.guard.distributed.peers import Death, dead_peers
from trainguard.guard.hang_report import report_path, write_hang_report

DEAD_PEER_WAIT_S = 3.0  # a killed peer's sockets close before the kernel marks it exited


def diagnose(
    part: Any, step: int, cause: BaseException, barrier_error: BaseException | None = None
) -> NoReturn:
    """Name the dead ranks (R302) or the ranks that did not arrive (R301), dump this
    process's stacks, exit for a restart.

    A peer whose process ended is dead, not hung: that is checked first (gloo fails the
    collective at once when a peer's connection closes). If every rank does reach the
    diagnosis barrier, nobody hung: the failure was an ordinary error, raised as such."""
    group = part.group
    assert group is not None
    phase = part.phase_name
    _report_dead(part, step, phase, _dead_peers(part, str(cause)))
    if barrier_error is None:
        try:
            group.barrier(part.hang_timeout_s(), wait_all_ranks=True)
        except RuntimeError as e:
            barrier_error = e
        else:
            raise cause
    _report_dead(part, step, phase, _dead_peers(part, str(barrier_error)))
    txt = report_path(part.run_dir, group.rank)
    address = lost_peer(str(barrier_error))
    if address is not None and not missing_ranks(str(barrier_error)):
        # The barrier itself lost a peer: dead, on a host this process cannot look at.
        finding = lost_peer_finding(step, phase, address, group, txt.name)
    else:
        finding = hung_rank_finding(
            step, phase, cause, barrier_error, group, part.hang_timeout_s(), txt.name
        )
    _report_and_exit(part, txt, finding)


def _dead_peers(part: Any, error: str) -> dict[int, Death]:
    """The peers on this host whose process ended. After a closed connection, the peer may
    still be exiting: it is looked at again for up to `DEAD_PEER_WAIT_S`."""
    assert part.group is not None
    deadline = time.monotonic() + (DEAD_PEER_WAIT_S if lost_peer(error) is not None else 0.0)
    while True:
        dead = dead_peers(part.group.processes, part.group.rank)
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.05)


def _report_dead(part: Any, step: int, phase: str, dead: dict[int, Death]) -> None:
    if not dead:
        return
    assert part.group is not None
    txt = report_path(part.run_dir, part.group.rank)
    finding = dead_rank_finding(
        dead,
        part.group.hosts,
        step=step,
        phase=phase,
        reporter=f"rank {part.group.rank}",
        stack_file=txt.name,
    )
    _report_and_exit(part, txt, finding)


def _report_and_exit(part: Any, txt: Path, finding: Finding) -> NoReturn:
    assert part.group is not None
    part.run_dir.mkdir(parents=True, exist_ok=True)
    header = (
        f"trainguard {finding.code} on rank {part.group.rank} (pid {os.getpid()}): "
        f"{finding.message}"
    )
    write_hang_report(txt, header, finding)
    if part.on_hang is not None:
        part.on_hang(finding)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(ExitStatus.HANG)  # the launcher restarts the job; auto-resume takes it from there
