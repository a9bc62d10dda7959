"""Multi-process guards without launching processes: replica hashes (H201), straggler scores
(H202), the hung-rank message parser (R301), per-rank faults, the launcher command, the config,
and the bf16 communication hook on a real (one-process) gloo group."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.distributed as dist

from trainguard.config.distributed import DistributedConfig
from trainguard.config.load import load_recipe
from trainguard.errors import BadInputError, ConfigError
from trainguard.faults import FaultPlan
from trainguard.guard.core import Guard
from trainguard.guard.detectors.straggler import PhaseTimer, StragglerMonitor
from trainguard.guard.distributed.guards import DistributedGuards
from trainguard.guard.distributed.hang import missing_ranks
from trainguard.guard.distributed.replica import compare_replicas, replica_digest
from trainguard.numerics import fp32_accumulate_hook
from trainguard.train.launch import launch_argv
from trainguard.train.world import init_distributed, wrap_ddp

HOSTS = ["node-a", "node-a", "node-b", "node-b"]


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


# -- replicas (H201) -----------------------------------------------------------------------------
def test_replica_digest_sees_one_flipped_mantissa_bit() -> None:
    a, b = tiny_model(), tiny_model()
    assert replica_digest(a) == replica_digest(b)
    plan = FaultPlan.parse("bitflip@3/r1", rank=1)
    assert not plan.corrupt_replica(2, b)  # not its step
    assert plan.corrupt_replica(3, b)
    assert not plan.corrupt_replica(3, b)  # fires once
    # The change is tiny (bit 12 of the mantissa): no loss would notice, the hash does.
    diff = max(
        (pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters(), strict=True)
    )
    assert 0 < diff < 1e-3
    assert replica_digest(a) != replica_digest(b)


def test_replica_digest_with_optimizer_state() -> None:
    a, b = tiny_model(), tiny_model()
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (a, b)]
    for m, opt in zip((a, b), opts, strict=True):
        m(torch.ones(2, 8)).sum().backward()
        opt.step()
    assert replica_digest(a, opts[0]) == replica_digest(b, opts[1])
    with torch.no_grad():
        next(iter(opts[1].state.values()))["exp_avg"].view(-1)[0] += 1e-6
    assert replica_digest(a) == replica_digest(b)  # weights alone still agree
    assert replica_digest(a, opts[0]) != replica_digest(b, opts[1])


def test_compare_replicas_clean_is_quiet() -> None:
    assert compare_replicas(["abc"] * 4, HOSTS, step=10) == []
    assert compare_replicas(["abc"], HOSTS[:1], step=10) == []


def test_compare_replicas_names_the_odd_rank_and_host() -> None:
    found = compare_replicas(["abc", "abc", "xyz", "abc"], HOSTS, step=7)
    assert [f.code for f in found] == ["H201"]
    f = found[0]
    assert f.severity == "error" and f.rank == 2 and f.where == "node-b" and f.step == 7
    assert f.data["suspect_ranks"] == [2] and f.data["majority"] is True
    assert "rank 2 (node-b)" in f.message


def test_compare_replicas_without_majority_names_every_rank() -> None:
    found = compare_replicas(["abc", "xyz"], HOSTS[:2], step=4)
    assert [f.code for f in found] == ["H201"]
    assert found[0].rank is None and found[0].data["suspect_ranks"] == [0, 1]
    assert found[0].data["majority"] is False


# -- stragglers (H202) ---------------------------------------------------------------------------
# One step of one rank: seconds per phase (data, forward, backward, optimizer). In a DDP step the
# ranks begin together and leave the backward's all-reduce together: who arrives late there makes
# the others wait inside their backward phase.
def ddp_step(
    ranks: int,
    rng: random.Random,
    extra: dict[int, tuple[str, float, bool]] | None = None,
    base: float = 0.02,
) -> tuple[list[list[float]], list[list[float]]]:
    """Walls and CPU seconds of one step; `extra[r] = (phase, seconds, busy)` slows rank r."""
    walls, cpus, arrive = [], [], []
    for r in range(ranks):
        cpu = [base * f * rng.uniform(0.8, 1.25) for f in (0.1, 0.4, 0.4, 0.1)]
        wall = [c * rng.uniform(1.0, 1.3) for c in cpu]  # a shared host: some time descheduled
        phase, seconds, busy = (extra or {}).get(r, ("data", 0.0, False))
        i = ("data", "forward", "backward", "optimizer").index(phase)
        wall[i] += seconds
        cpu[i] += seconds if busy else 0.0
        walls.append(wall)
        cpus.append(cpu)
        arrive.append(sum(wall[:3]))
    for r in range(ranks):  # everyone leaves the all-reduce when the last one arrived
        walls[r][2] += max(arrive) - arrive[r]
    return walls, cpus


def test_straggler_slow_from_step_0_is_named_within_its_first_steps() -> None:
    """The issue's case: a rank that computes 12x longer from the first step is named at the
    third step (never, before: there was no history of it being fast)."""
    mon = StragglerMonitor(threshold=0.5, steps=3)
    rng = random.Random(0)
    found = []
    for step in range(6):
        walls, cpus = ddp_step(4, rng, {2: ("forward", 0.09, True)})
        found += mon.observe(step, walls, cpus, HOSTS)
    assert [(f.code, f.step, f.rank, f.where) for f in found] == [("H202", 2, 2, "node-b")]
    data = found[0].data
    assert (data["rank"], data["host"], data["phase"], data["kind"]) == (
        2,
        "node-b",
        "forward",
        "busy",
    )
    assert 0.08 < data["behind_s"] < 0.11 and found[0].severity == "warning"


def test_straggler_sleeping_or_waiting_rank_is_named_as_waiting() -> None:
    """A rank that sleeps (storage, a device sync) uses no CPU time: the old busy-time score
    never saw it; its late arrival is the signal."""
    mon = StragglerMonitor(threshold=0.5, steps=3)
    rng = random.Random(1)
    found = []
    for step in range(30, 36):
        walls, cpus = ddp_step(2, rng, {1: ("data", 0.3, False)} if step >= 31 else None)
        found += mon.observe(step, walls, cpus, HOSTS[:2])
    assert [(f.step, f.rank) for f in found] == [(33, 1)]
    assert (found[0].data["phase"], found[0].data["kind"]) == ("data", "waiting")
    assert found[0].data["busy_s"] < 0.01 and "waiting" in found[0].message


def test_straggler_busy_inside_the_collective_phase_is_named_from_cpu_time() -> None:
    """Work before the all-reduce inside backward: the others' wait there equals it, so the
    wall times agree; the CPU time tells."""
    mon = StragglerMonitor(threshold=0.5, steps=3)
    rng = random.Random(2)
    found = []
    for step in range(5):
        walls, cpus = ddp_step(2, rng, {0: ("backward", 0.06, True)})
        found += mon.observe(step, walls, cpus, HOSTS[:2])
    assert [(f.rank, f.data["phase"], f.data["kind"]) for f in found] == [(0, "backward", "busy")]


def test_straggler_quiet_on_clean_noisy_ranks_and_a_whole_job_slowing_down() -> None:
    rng = random.Random(3)
    for ranks in (2, 3, 8, 80):
        mon = StragglerMonitor(threshold=0.5, steps=3)
        for step in range(300):
            walls, cpus = ddp_step(ranks, rng, base=0.02 * (3 if step > 150 else 1))
            if rng.random() < 0.05:  # one step of one rank descheduled for a while
                walls[rng.randrange(ranks)][1] += rng.uniform(0.005, 0.05)
            assert mon.observe(step, walls, cpus) == [], (ranks, step)


def test_straggler_is_named_once_per_episode_and_again_after_recovering() -> None:
    mon = StragglerMonitor(threshold=0.5, steps=3)
    rng = random.Random(4)
    slow = {1: ("forward", 0.1, True)}
    named = []
    for step in range(20):
        walls, cpus = ddp_step(3, rng, slow if step < 8 or step >= 14 else None)
        named += [(f.step, f.rank) for f in mon.observe(step, walls, cpus)]
    assert named == [(2, 1), (16, 1)]


def test_straggler_many_ranks_robust_spread() -> None:
    """With many ranks a lag inside the others' spread is noise, beyond it a straggler."""
    mon = StragglerMonitor(threshold=0.9, steps=3, min_lag_s=0.0)
    rng = random.Random(5)
    for step in range(3):
        walls = [[0.001, rng.gauss(0.05, 0.004), 0.05, 0.005] for _ in range(32)]
        walls[7][1] += 0.008  # two sigma of the spread: not named
        assert mon.observe(step, walls, [list(w) for w in walls]) == []
    found = []
    for step in range(3, 6):
        walls = [[0.001, rng.gauss(0.05, 0.004), 0.05, 0.005] for _ in range(32)]
        walls[7][1] += 0.05
        found += mon.observe(step, walls, [list(w) for w in walls])
    assert [(f.step, f.rank) for f in found] == [(5, 7)]


def test_straggler_records_align_by_step_and_state_round_trips() -> None:
    mon = StragglerMonitor(threshold=0.5, steps=3)
    rng = random.Random(6)

    def records(steps: range) -> list[list[dict]]:
        out: list[list[dict]] = [[], []]
        for s in steps:
            walls, cpus = ddp_step(2, rng, {1: ("data", 0.2, False)})
            for r in range(2):
                out[r].append({"step": s, "wall": walls[r], "cpu": cpus[r]})
        return out

    assert mon.update([records(range(1))[0]]) == []  # one rank: nothing to compare
    first = records(range(10, 12))
    first[0].insert(0, {"step": 9, "wall": [1.0] * 4, "cpu": [1.0] * 4})  # rank 1 lacks step 9
    assert mon.update(first, HOSTS[:2]) == []  # behind at 10 and 11: two of three steps
    restored = StragglerMonitor(threshold=0.5, steps=3)
    restored.load_state_dict(json.loads(json.dumps(mon.state_dict())))
    third = records(range(12, 13))
    assert [(f.step, f.rank) for f in restored.update(third)] == [(12, 1)]
    assert [(f.step, f.rank) for f in mon.update(third)] == [(12, 1)]
    again = StragglerMonitor(threshold=0.5, steps=3)
    again.load_state_dict(json.loads(json.dumps(mon.state_dict())))
    assert again.update(records(range(13, 15))) == []  # flagged survives: one episode
    old = StragglerMonitor()
    old.load_state_dict({"history": {"0": [0.02]}, "flagged": [1]})  # before version 2
    assert old.flagged == set() and old.behind == {}
    with pytest.raises(ValueError):
        StragglerMonitor(threshold=0.0)


def test_phase_timer_records_wall_and_cpu_per_phase_and_step() -> None:
    cpu, wall = [0.0], [0.0]
    timer = PhaseTimer(cpu_clock=lambda: cpu[0], wall_clock=lambda: wall[0])

    def spend(busy: float, waited: float = 0.0) -> None:
        cpu[0] += busy
        wall[0] += busy + waited

    timer.mark("data")
    spend(0.01, waited=0.2)  # asleep on storage
    timer.mark("forward")
    spend(0.05)
    timer.mark("backward")
    spend(0.10, waited=0.30)  # the all-reduce wait
    timer.mark("checkpoint")
    spend(3.0)  # not a step phase: paused
    timer.mark("optimizer")
    spend(0.02)
    timer.end_step(7)
    spend(5.0)  # evaluation, logging: outside the step, not booked
    timer.end_step(7)  # nothing entered since: no second record
    timer.mark("data")
    spend(0.01)
    timer.end_step(8, keep=False)  # a warm-up step
    (rec,) = timer.take()
    assert rec["step"] == 7
    assert rec["wall"] == pytest.approx([0.21, 0.05, 0.40, 0.02])
    assert rec["cpu"] == pytest.approx([0.01, 0.05, 0.10, 0.02])
    assert timer.take() == []


# -- the part's state -------------------------------------------------------------------------
def test_the_parts_state_travels_in_the_guards_state() -> None:
    """Straggler windows and the replica rollback count are saved with the guard (checkpoints)
    and restored with it; with one process every guard call is a no-op."""
    part = DistributedGuards(group=None)
    assert not part.active
    rng = random.Random(0)
    for step in range(2):
        walls, cpus = ddp_step(2, rng, {1: ("forward", 0.2, True)})
        assert part.stragglers.observe(step, walls, cpus, HOSTS[:2]) == []
    part.replica_rollbacks = 2
    state = json.loads(json.dumps(Guard(distributed=part).state_dict()))
    restored = Guard(distributed=DistributedGuards(group=None))
    restored.load_state_dict(state)
    assert restored.distributed is not None
    assert restored.distributed.replica_rollbacks == 2
    assert restored.distributed.stragglers.state_dict() == part.stragglers.state_dict()
    assert len(restored.distributed.stragglers.behind[1]) == 2
    end = restored.end_step(3, tiny_model())
    assert (end.action, end.findings) == ("apply", [])
    assert "distributed" not in Guard().state_dict()


# -- hung ranks (R301) ---------------------------------------------------------------------------
def test_missing_ranks_parses_gloo_messages() -> None:
    assert missing_ranks("[Rank 0]: Ranks 1 failed to pass monitoredBarrier in 3000 ms") == [1]
    assert missing_ranks("[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 3000 ms") == [
        1,
        3,
    ]
    assert missing_ranks("Rank 2 successfully reached monitoredBarrier, but received errors") == []


# -- per-rank faults -----------------------------------------------------------------------------
def test_fault_plan_rank_suffix() -> None:
    text = "bitflip@5/r1,slow@9/r2,sleep@13/r1,kill@7:data,nan@3/r0"
    r0, r1, r2 = (FaultPlan.parse(text, rank=r) for r in range(3))
    assert r0.kills == r1.kills == r2.kills == {7: "data"}  # no suffix: every rank
    assert r0.nan_steps == {3} and not r1.nan_steps
    assert r1.replica_bitflip_steps == {5} and r1.sleep_steps == {13} and r1.burn_from is None
    assert r2.burn_from == 9 and not r2.replica_bitflip_steps and not r2.sleep_steps
    assert not r0.replica_bitflip_steps and r0.burn_from is None
    # The transient forms: a low mantissa bit by default, the exponent's top bit on request.
    assert FaultPlan.parse("bitflip@5").bitflip_steps == {5: 12}
    assert FaultPlan.parse("bitflip@5:exponent").bitflip_steps == {5: 30}
    for bad in ("slow@5/1", "slow@5/rx", "sleep@x/r1", "bitflip@5:sign"):
        with pytest.raises(BadInputError):
            FaultPlan.parse(bad, rank=0)


# -- launcher and config -------------------------------------------------------------------------
def test_launch_argv_is_a_loopback_torchrun() -> None:
    argv = launch_argv(2, ["run", "r.yaml", "--json"], max_restarts=1, python="py")
    assert argv[:3] == ["py", "-m", "torch.distributed.run"]
    joined = " ".join(argv)
    assert "--nproc-per-node 2" in joined and "--rdzv-endpoint 127.0.0.1:0" in joined
    assert "--local-addr 127.0.0.1" in joined and "--max-restarts 1" in joined
    assert argv[-5:] == ["-m", "trainguard", "run", "r.yaml", "--json"]
    with pytest.raises(BadInputError):
        launch_argv(0, [])


def test_distributed_config_section() -> None:
    recipe = load_recipe("default", ["distributed.straggler_threshold=0.4"])
    assert recipe.distributed.straggler_threshold == 0.4
    with pytest.raises(ConfigError):
        load_recipe("default", ["distributed.no_such_key=1"])
    with pytest.raises(ConfigError):
        load_recipe("default", ["distributed.straggler_threshold=1.5"])
    assert DistributedConfig.model_fields["hang_timeout_s"].description  # documented field


def test_indivisible_batch_is_a_config_error() -> None:
    env = {"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0"}
    with pytest.raises(ConfigError, match="not divisible by the 3 processes"):
        init_distributed(DistributedConfig(), batch_size=8, env=env)
    one = init_distributed(DistributedConfig(), batch_size=8, env={})
    assert not one.active and one.world.size == 1


def test_bf16_registers_the_fp32_accumulating_hook() -> None:
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        for precision, fp32_reduce, expected in (
            ("bf16", True, [fp32_accumulate_hook]),
            ("bf16", False, []),
            ("fp32", True, []),
        ):
            ddp = wrap_ddp(tiny_model(), torch.device("cpu"), precision, fp32_reduce)
            assert [hook for hook, _ in ddp._comm_hooks] == expected
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = ddp(torch.ones(3, 8))
            out.float().sum().backward()  # gradients flow through the hook
            assert all(p.grad is not None and p.grad.isfinite().all() for p in ddp.parameters())
    finally:
        dist.destroy_process_group()


def test_nproc_not_dividing_the_batch_is_refused_before_launch(tiny_recipe) -> None:
    from typer.testing import CliRunner

    from trainguard.cli import app

    res = CliRunner().invoke(app, ["run", str(tiny_recipe), "--nproc", "3"])
    assert res.exit_code == 2
    assert "not divisible by --nproc 3" in res.output
