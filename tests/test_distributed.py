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
from trainguard.train.distributed import init_distributed, wrap_ddp
from trainguard.train.launch import launch_argv

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
def timing(busy_ms: float, steps: int = 4, comm: float = 0.0) -> dict[str, float]:
    b = busy_ms * steps / 1e3
    return {"data": 0.1 * b, "fwd_bwd": 0.7 * b, "optimizer": 0.2 * b, "comm": comm, "steps": steps}


def test_straggler_fires_on_the_slowed_rank_only() -> None:
    mon = StragglerMonitor(threshold=0.5, history=8)
    rng = random.Random(0)
    for k in range(6):  # noisy but healthy ranks build their history
        assert mon.update(k, [timing(20 * rng.uniform(0.8, 1.25)) for _ in range(4)], HOSTS) == []
    found = mon.update(6, [timing(20), timing(21), timing(90), timing(19)], HOSTS)
    assert [f.code for f in found] == ["H202"]
    assert found[0].rank == 2 and found[0].where == "node-b" and found[0].severity == "warning"
    assert found[0].data["score_vs_fastest"] < 0.5 and found[0].data["score_vs_history"] < 0.5
    # Still slow: reported once per episode; recovered, then slow again: reported again.
    assert mon.update(7, [timing(20), timing(21), timing(95), timing(19)], HOSTS) == []
    assert mon.update(8, [timing(20)] * 4, HOSTS) == []
    assert [f.rank for f in mon.update(9, [timing(20), timing(80), timing(20), timing(20)])] == [1]


def test_straggler_needs_both_scores() -> None:
    mon = StragglerMonitor(threshold=0.5)
    # The first interval has no history: never fires, however uneven.
    assert mon.update(1, [timing(20), timing(200)], HOSTS[:2]) == []
    # A rank that was always 3x slower is a placement fact, not a failing chip.
    for k in range(2, 6):
        assert mon.update(k, [timing(20), timing(60)], HOSTS[:2]) == []
    # The whole job slowing down together is not a straggler either.
    mon2 = StragglerMonitor(threshold=0.5)
    for k in range(4):
        mon2.update(k, [timing(20), timing(20)])
    assert mon2.update(5, [timing(80), timing(85)]) == []


def test_straggler_degenerate_input_and_state_round_trip() -> None:
    mon = StragglerMonitor(threshold=0.5)
    assert mon.update(1, [timing(20)]) == []  # one rank: nothing to compare
    assert mon.update(2, [timing(20), timing(20, steps=0)]) == []  # an empty interval
    assert mon.update(3, [timing(0.0), timing(0.0)]) == []  # zero busy time
    for k in range(4, 8):
        mon.update(k, [timing(20), timing(20)])
    restored = StragglerMonitor(threshold=0.5)
    restored.load_state_dict(mon.state_dict())
    slow = [timing(20), timing(70)]
    assert [f.rank for f in restored.update(9, slow)] == [f.rank for f in mon.update(9, slow)]
    assert [f.rank for f in mon.update(9, slow)] == []  # flagged state survives too
    with pytest.raises(ValueError):
        StragglerMonitor(threshold=0.0)


def test_phase_timer_books_busy_and_waited_time() -> None:
    cpu, wall = [0.0], [0.0]
    timer = PhaseTimer(cpu_clock=lambda: cpu[0], wall_clock=lambda: wall[0])

    def spend(busy: float, waited: float = 0.0) -> None:
        cpu[0] += busy
        wall[0] += busy + waited

    timer.mark("data")
    spend(0.01)
    timer.mark("forward")
    spend(0.05)
    timer.mark("backward")
    spend(0.10, waited=0.30)  # the all-reduce wait hides in backward
    timer.mark("optimizer")
    spend(0.02)
    timer.end_step()
    spend(5.0)  # evaluation, logging: outside the step, not booked
    t = timer.take()
    assert t["steps"] == 1
    assert t["data"] == pytest.approx(0.01) and t["fwd_bwd"] == pytest.approx(0.15)
    assert t["optimizer"] == pytest.approx(0.02) and t["comm"] == pytest.approx(0.30)
    assert timer.take()["steps"] == 0


# -- the part's state -------------------------------------------------------------------------
def test_the_parts_state_travels_in_the_guards_state() -> None:
    """Straggler windows and the replica rollback count are saved with the guard (checkpoints)
    and restored with it; with one process every guard call is a no-op."""
    part = DistributedGuards(group=None)
    assert not part.active
    for k in range(4):
        part.stragglers.update(k, [timing(20), timing(22)], HOSTS[:2])
    part.replica_rollbacks = 2
    state = json.loads(json.dumps(Guard(distributed=part).state_dict()))
    restored = Guard(distributed=DistributedGuards(group=None))
    restored.load_state_dict(state)
    assert restored.distributed is not None
    assert restored.distributed.replica_rollbacks == 2
    assert restored.distributed.stragglers.state_dict() == part.stragglers.state_dict()
    assert len(restored.distributed.stragglers.history[1]) == 4
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
