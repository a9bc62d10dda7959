"""The hung-rank finding (R301): who did not arrive at the monitored barrier, from its error;
and the dead-rank finding (R302): whose process ended, as a survivor or the launcher saw it.

gloo's monitored barrier fails on rank 0 with "Ranks 1, 3 failed to pass monitoredBarrier in
2000 ms": only rank 0 learns who is missing; every other rank learns that rank 0 did not answer.
"""

from __future__ import annotations

import re

from trainguard.errors import ExitStatus
from trainguard.findings import Finding
from trainguard.guard.distributed.group import MonitorGroup
from trainguard.guard.distributed.peers import Death

_MISSING = re.compile(r"Ranks? ([\d,\s]+?) failed to pass monitoredBarrier")
# How a peer's death reads in gloo's errors: its connection closed under us ("Connection closed
# by peer [10.0.0.7]:29500"); the address is the peer's, not its rank.
PEER_GONE = re.compile(
    r"(?:closed|reset) by peer(?: \[(?P<addr>[^\]]+)\](?::\d+)?)?|broken pipe", re.I
)


def lost_peer(message: str) -> str | None:
    """The peer address a closed connection names ('' when none), or None for another error."""
    m = PEER_GONE.search(message)
    return None if m is None else (m.group("addr") or "")


def missing_ranks(message: str) -> list[int]:
    """The ranks a failed monitored barrier named (rank 0's view); [] if it named none."""
    m = _MISSING.search(message)
    return sorted({int(x) for x in re.findall(r"\d+", m.group(1))}) if m else []


def hung_rank_finding(
    step: int,
    phase: str,
    cause: BaseException,
    barrier_error: BaseException,
    group: MonitorGroup,
    hang_timeout_s: float,
    stack_file: str,
) -> Finding:
    """R301 naming the ranks (and hosts) the failed barrier named, as this rank saw it."""
    missing = missing_ranks(str(barrier_error))
    if missing:
        who = ", ".join(group.where(r) for r in missing)
        message = f"{who} did not arrive within {hang_timeout_s:g}s"
    else:
        first = str(barrier_error).splitlines()[0] if str(barrier_error) else ""
        message = f"the monitored barrier failed on {group.where(group.rank)}: {first}"
    why = str(cause).splitlines()[0][:300] if str(cause) else type(cause).__name__
    hosts = [group.hosts[r] for r in missing if r < len(group.hosts)]
    return Finding.of(
        "R301",
        f"hung rank at step {step} (phase {phase!r}): {message}; cause: {why}",
        step=step,
        rank=missing[0] if len(missing) == 1 else None,
        where=", ".join(hosts) or None,
        data={
            "missing_ranks": missing,
            "missing_hosts": hosts,
            "reporting_rank": group.rank,
            "phase": phase,
            "stack_file": stack_file,
            "exit_status": ExitStatus.HANG,
        },
    )


def lost_peer_finding(
    step: int, phase: str, address: str, group: MonitorGroup, stack_file: str
) -> Finding:
    """R302 when a peer's connection closed (so its process ended) but the rank is not one this
    process can look at (another host): dead, rank unknown from here; its launcher names it."""
    at = f" at {address}" if address else ""
    return Finding.of(
        "R302",
        f"dead rank at step {step} (phase {phase!r}): a peer{at} closed its connection (its "
        f"process ended), seen by {group.where(group.rank)}; the rank is on another host: its "
        "launcher's log names it",
        step=step,
        data={
            "dead_ranks": [],
            "peer_address": address or None,
            "reporter": f"rank {group.rank}",
            "phase": phase,
            "stack_file": stack_file,
            "exit_status": ExitStatus.HANG,
        },
    )


def dead_rank_finding(
    dead: dict[int, Death],
    hosts: list[str],
    *,
    step: int | None = None,
    phase: str | None = None,
    reporter: str = "",
    stack_file: str | None = None,
) -> Finding:
    """R302 naming every dead rank (host, signal or status where known). `reporter` says who
    saw it: 'rank 0' (a survivor) or 'the launcher'."""
    ranks = sorted(dead)

    def host(r: int) -> str:
        return hosts[r] if 0 <= r < len(hosts) else "?"

    who = "; ".join(f"rank {r} ({host(r)}) {dead[r].describe()}" for r in ranks)
    at = f" at step {step} (phase {phase!r})" if step is not None else ""
    seen = f", seen by {reporter}" if reporter else ""
    first = dead[ranks[0]] if len(ranks) == 1 else Death()
    data = {
        "dead_ranks": ranks,
        "dead_hosts": [host(r) for r in ranks],
        "exit_signals": {str(r): dead[r].signal for r in ranks},
        "exit_statuses": {str(r): dead[r].status for r in ranks},
        "signal": first.signal,
        "status": first.status,
        "reporter": reporter,
        "phase": phase,
        "exit_status": ExitStatus.HANG,
    }
    if stack_file is not None:
        data["stack_file"] = stack_file
    return Finding.of(
        "R302",
        f"dead rank{at}: {who}{seen}",
        step=step,
        rank=ranks[0] if len(ranks) == 1 else None,
        where=", ".join(dict.fromkeys(host(r) for r in ranks)) or None,
        data=data,
    )
