"""Timeouts from the run itself (guard/derived_timeouts.py): max(floor, min(ceiling, k * p_q)) over
the recent step times; budgets of their own for checkpoints and evaluations; the fixed values
when derivation is off or too few steps were seen. And the dead-peer check
(guard/distributed/peers.py)."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time

import pytest
from pydantic import ValidationError

from trainguard.config.distributed import DistributedConfig
from trainguard.guard.derived_timeouts import StepTimes, derived_timeout, percentile
from trainguard.guard.distributed.group import MonitorGroup
from trainguard.guard.distributed.group_timeouts import GroupTimeouts
from trainguard.guard.distributed.guards import DistributedGuards
from trainguard.guard.distributed.hang import dead_rank_finding, lost_peer, lost_peer_finding
from trainguard.guard.distributed.peers import (
    Death,
    Peer,
    dead_peers,
    peer_death,
    process_start,
    this_process,
)


def test_percentile_interpolates_between_ranks() -> None:
    xs = [float(i) for i in range(1, 101)]  # 1..100
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 99) == pytest.approx(99.01)
    assert percentile(xs, 100) == 100.0
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([], 99)


def test_derived_timeout_is_a_multiple_of_the_high_percentile() -> None:
    steps = [1.0] * 98 + [1.5, 2.0]  # a few slow steps: p99 follows them, not the median
    got = derived_timeout(steps, factor=10, q=99, floor_s=5, ceiling_s=300)
    assert got == pytest.approx(10 * percentile(steps, 99))
    assert 15 < got < 20


def test_floor_ceiling_and_too_few_samples() -> None:
    fast = [0.01] * 20
    assert derived_timeout(fast, factor=10, q=99, floor_s=15, ceiling_s=300) == 15
    slow = [100.0] * 20
    assert derived_timeout(slow, factor=10, q=99, floor_s=15, ceiling_s=300) == 300
    assert derived_timeout([1.0] * 4, factor=10, q=99, floor_s=1, min_samples=5) is None
    # A ceiling below the floor caps it: never longer than the fixed timeout it replaces.
    assert derived_timeout(slow, factor=10, q=99, floor_s=50, ceiling_s=20) == 20
    assert derived_timeout(fast, factor=10, q=99, floor_s=50, ceiling_s=20) == 20
    assert derived_timeout(slow, factor=10, q=99, floor_s=1) == 1000  # no ceiling: math.inf


def test_step_times_leave_out_budget_steps() -> None:
    times = StepTimes()
    for t in (0.0, 1.0, 2.0):
        times.boundary(t)
    times.skip_this_step()  # a checkpoint ran in this step
    times.boundary(60.0)
    times.boundary(61.0)
    assert list(times.durations) == [1.0, 1.0, 1.0]


def test_guard_timeouts_derived_fixed_and_budgets() -> None:
    part = DistributedGuards(DistributedConfig())  # one process: the rule, no collectives
    assert part.collective_timeout_s() == 300 and part.hang_timeout_s() == 60  # nothing seen
    part.timeouts.step_times.durations.extend([1.0] * 10)  # 1 s steps
    assert part.collective_timeout_s() == pytest.approx(15.0)  # max(15, 10 * 1.0)
    assert part.hang_timeout_s() == pytest.approx(15.0)
    part.timeouts.step_times.durations.extend(
        [3.0] * 10
    )  # slower steps raise it, up to the ceiling
    assert part.collective_timeout_s() == pytest.approx(30.0)
    part.timeouts.step_times.durations.extend([30.0] * 10)
    assert part.collective_timeout_s() == 300 and part.hang_timeout_s() == 60  # the ceilings
    assert part.timeouts.budget_s("checkpoint") == 1800 and part.timeouts.budget_s("eval") == 1800

    fixed = DistributedGuards(DistributedConfig(derive_timeouts=False, hang_timeout_s=7))
    fixed.timeouts.step_times.durations.extend([1.0] * 10)
    assert fixed.collective_timeout_s() == 300 and fixed.hang_timeout_s() == 7
    tuned = DistributedConfig(timeout_factor=3, timeout_percentile=50, timeout_floor_s=2)
    part = DistributedGuards(tuned)
    part.timeouts.step_times.durations.extend([1.0] * 9 + [9.0])
    assert part.collective_timeout_s() == pytest.approx(3.0)  # 3 x median, not the slow step


def test_budgets_switch_the_default_groups_timeout(tmp_path) -> None:
    """A real (one-process gloo) default group: the step timeout once warm, the checkpoint and
    eval budgets while in those phases, the step timeout back after them."""
    import torch
    import torch.distributed as dist

    def group_timeout(group=None) -> float:
        group = group or dist.distributed_c10d._get_default_group()
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 's'}", rank=0, world_size=1)
    try:
        start = group_timeout()
        config = DistributedConfig(checkpoint_timeout_s=600, eval_timeout_s=900)
        t = GroupTimeouts(config)
        # The guard's monitor group follows too: its per-step all-gathers (the agreement on
        # the metrics) otherwise waited `sync_timeout_s` (1800 s) for a rank stopped there.
        monitor = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=1800))
        t.groups.append(monitor)
        t.enter("checkpoint")  # warming up: the start-up timeout stands
        assert group_timeout() == start
        t.enter("data")
        now = 0.0
        for _ in range(7):  # 1 s steps: 6 timed, the step timeout is the floor
            now += 1.0
            t.step_boundary(now)
        assert t.applied_s == pytest.approx(15.0) and group_timeout() == pytest.approx(15.0)
        assert group_timeout(monitor) == pytest.approx(15.0)
        t.enter("checkpoint")
        assert group_timeout() == 600 and group_timeout(monitor) == 600
        now += 200.0  # a long save: its step is no step time
        t.enter("data")
        t.step_boundary(now)
        assert group_timeout() == pytest.approx(15.0) and max(t.step_times.durations) == 1.0
        with t.budget("eval"):
            assert group_timeout() == 900
        assert group_timeout() == pytest.approx(15.0)
    finally:
        dist.destroy_process_group()


def test_a_resumed_process_derives_its_timeouts_from_the_saved_step_times(tmp_path) -> None:
    """The step times travel with the checkpoint (DistributedGuards.state_dict): a process
    resumed on as many processes has the derived timeout from its first warm step, not the
    fixed 300 s + 60 s for 5 more steps (a rank hung then took six minutes to name); on
    another process count, and from a damaged state, it times its own steps."""
    import json

    import torch
    import torch.distributed as dist

    def group_timeout() -> float:
        group = dist.distributed_c10d._get_default_group()
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 's'}", rank=0, world_size=1)
    try:
        saving = DistributedGuards(DistributedConfig())
        now = 0.0
        for _ in range(8):  # 1 s steps
            now += 1.0
            saving.timeouts.step_boundary(now)
        state = json.loads(json.dumps(saving.state_dict()))  # as a checkpoint holds it
        assert state["step_times"]["world_size"] == 1

        resumed = DistributedGuards(DistributedConfig())
        resumed.load_state_dict(state)
        resumed.timeouts.step_boundary(500.0)  # its first warm step: none timed of its own
        assert resumed.timeouts.applied_s == pytest.approx(15.0)
        assert group_timeout() == pytest.approx(15.0) and resumed.hang_timeout_s() == 15.0

        elsewhere = GroupTimeouts(DistributedConfig())
        elsewhere.load_state_dict({**state["step_times"], "world_size": 2}, world_size=1)
        elsewhere.step_boundary(500.0)
        assert elsewhere.applied_s == 300.0  # saved on 2 processes: another pace
        damaged = {"world_size": 1, "durations": ["1.0", -1, float("nan"), True, 1e400, None]}
        elsewhere.load_state_dict(damaged, world_size=1)
        assert list(elsewhere.step_times.durations) == []
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    "key,value",
    [
        ("timeout_factor", 0.5),
        ("timeout_percentile", 0),
        ("timeout_percentile", 101),
        ("timeout_floor_s", 0),
        ("checkpoint_timeout_s", -1),
        ("derive_timeouts", "yes"),
    ],
)
def test_timeout_keys_are_checked(key: str, value: object) -> None:
    with pytest.raises(ValidationError):
        DistributedConfig(**{key: value})


# -- dead peers ------------------------------------------------------------------------------
def test_a_killed_peer_is_dead_with_its_signal_a_live_one_is_not() -> None:
    me = this_process()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        peer = Peer(me.host, child.pid, process_start(child.pid), me.space)
        assert peer_death(peer) is None and dead_peers([me, peer], 0) == {}  # running
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while peer_death(peer) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        death = peer_death(peer)  # a zombie until waited for: its status is still there
        assert death == Death(signal=signal.SIGKILL)
        assert dead_peers([me, peer], 0) == {1: death}
        assert dead_peers([peer, peer], 0) == {1: death}  # never names itself (rank 0)
        # Another host, or another pid namespace on this one (a container): not judged.
        assert dead_peers([me, Peer("elsewhere", child.pid, peer.start, me.space)], 0) == {}
        assert dead_peers([me, Peer(me.host, child.pid, peer.start, "other/ns")], 0) == {}
    finally:
        child.kill()
        child.wait()
    assert peer_death(peer) == Death()  # reaped: gone, status unknown
    assert peer_death(Peer(me.host, os.getpid(), "1")) == Death()  # pid reused by another one


def test_dead_rank_finding_names_rank_host_and_status() -> None:
    f = dead_rank_finding(
        {1: Death(signal=9), 3: Death(status=1)}, ["a", "b", "c", "d"], step=4, phase="backward"
    )
    assert f.code == "R302" and f.rank is None and f.where == "b, d" and f.step == 4
    assert "rank 1 (b) killed by SIGKILL (signal 9)" in f.message
    assert "rank 3 (d) exited with status 1" in f.message
    assert f.data["dead_ranks"] == [1, 3] and f.data["exit_signals"] == {"1": 9, "3": None}
    one = dead_rank_finding({1: Death(signal=9)}, ["a", "b"], reporter="the launcher")
    assert one.rank == 1 and one.data["signal"] == 9 and "seen by the launcher" in one.message


def test_a_closed_connection_is_a_lost_peer_a_timeout_is_not() -> None:
    gloo = (
        "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[10.0.0.7]:22926. This is typically caused by a remote worker crashing."
    )
    assert lost_peer(gloo) == "10.0.0.7"
    assert lost_peer("Connection reset by peer") == ""
    assert lost_peer("Timed out waiting 15000ms for recv operation to complete") is None
    assert lost_peer("Rank 1 failed to pass monitoredBarrier in 15000 ms") is None
    group = MonitorGroup(None, 0, 2, ["a", "b"], 60.0)
    f = lost_peer_finding(7, "backward", "10.0.0.7", group, "hang-x-rank0.txt")
    assert f.code == "R302" and f.rank is None and f.step == 7
    assert f.data["peer_address"] == "10.0.0.7" and f.data["dead_ranks"] == []
    assert "10.0.0.7" in f.message and "another host" in f.message
