"""`trainguard drill --chaos` (issue 24 item 2): the seeded fault schedule, the verdict, and a
short real soak that fails if anything was lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runhelpers import run_cli
from trainguard.drills.chaos import FaultResult, Launch, Round
from trainguard.drills.chaos_schedule import Fault, parse_duration, schedule
from trainguard.drills.chaos_verdict import summary, verdict
from trainguard.errors import BadInputError

KINDS = ("kill", "corrupt", "hang", "nan")


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    a = schedule(7, 1, 60, 10, 4, KINDS)
    assert a == schedule(7, 1, 60, 10, 4, KINDS)
    others = {tuple(schedule(s, 1, 60, 10, 4, KINDS)) for s in range(8)}
    assert len(others) > 1
    assert schedule(7, 2, 60, 10, 4, KINDS) != a  # each round draws its own


@pytest.mark.parametrize("seed", range(20))
def test_every_fault_lands_where_the_run_can_recover(seed: int) -> None:
    faults = schedule(seed, 1, 30, 5, 5, KINDS)
    steps = [f.step for f in faults]
    assert len(set(steps)) == 5 and steps == sorted(steps) and max(steps) < 30
    for f in faults:
        if f.kind == "kill":
            assert f.step > 5  # a checkpoint before it
        if f.kind == "corrupt":
            assert f.step > 10  # two checkpoints: one to fall back to
        if f.kind == "hang":
            assert f.step > 5 and f.step % 5 not in (0, 1)


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1.5h", 5400.0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "10x", "0", "-5s", "1e3"])
def test_not_durations(text: str) -> None:
    with pytest.raises(BadInputError, match="not a duration"):
        parse_duration(text)


def _round(results: list[FaultResult], finished=True, equal=True) -> Round:
    goodput = {"seconds": {"productive": 1.0}, "wall_s": 2.0, "restarts": [], "goodput": 0.5}
    return Round(1, Path("r"), results, [Launch("", 0, 0.0, 1.0)], 30, finished, equal, goodput)


def test_the_verdict_names_a_missed_fault_a_run_that_did_not_end_and_lost_work() -> None:
    caught = FaultResult(Fault("nan", 12), detected=True, detect_steps=0, steps_lost=1)
    missed = FaultResult(Fault("corrupt", 17))
    assert verdict([_round([caught])]) == []
    (f,) = verdict([_round([caught, missed])])
    assert f.code == "R401" and "corrupt@17" in f.message
    assert [f.code for f in verdict([_round([caught], finished=False)])] == ["R402"]
    (lost,) = verdict([_round([caught], equal=False)])
    assert lost.code == "R402" and "differ" in lost.message
    kinds = summary([_round([caught, missed])])["kinds"]
    assert kinds["nan"]["detected"] == 1 and kinds["corrupt"]["detected"] == 0


@pytest.mark.slow  # a reference run and a soak run relaunched twice: about 30-60 s on 2 cores
def test_a_short_soak_loses_nothing(small_corpus: Path, cache_dir: Path, tmp_path: Path) -> None:
    sets = [
        f"data.source={small_corpus}",
        f"data.cache_dir={cache_dir}",
        "tokenizer.vocab_size=512",
        "data.seq_len=32",
    ]
    args = ["drill", "--chaos", "1s", "--json", "--steps", "30", "--faults", "3", "--seed", "6"]
    args += ["--fault-kind", "kill,corrupt,nan", "--workdir", str(tmp_path / "soak")]
    res = run_cli(*args, *[a for s in sets for a in ("--set", s)], timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    (r,) = out["rounds"]  # a 1 s budget: one round
    assert [f["label"] for f in r["faults"]] == ["nan@4", "kill@12", "corrupt@19"]
    assert r["finished"] and r["final_step"] == 30
    assert r["bitwise_equal"] is True  # nothing lost: the reference run's weights, bit for bit
    assert all(f["detected"] for f in r["faults"])
    nan, kill, corrupt = r["faults"]
    # kill@12 (steps count from 0): steps 10 and 11, done after checkpoint 10, are recomputed.
    assert kill["steps_lost"] == 2 and kill["codes"] == ["exit -9"]
    # corrupt@19: checkpoint 15 is damaged, the resume falls back to 10: steps 10-18 redone.
    assert corrupt["steps_lost"] == 9 and set(corrupt["codes"]) & {"C101", "C102"}
    assert nan["detect_steps"] == 0 and nan["steps_lost"] == 1
    g = r["goodput"]
    assert g["redone_steps"] == 2 + 9 and len(g["restarts"]) == 2
    assert sum(g["seconds"].values()) == pytest.approx(g["wall_s"])
    assert Path(out["plot"]).is_file()


def test_rank_faults_need_several_processes_and_a_slow_rank_comes_once() -> None:
    from trainguard.drills.chaos_schedule import parse_kinds

    with pytest.raises(BadInputError, match="several processes"):
        parse_kinds(["kill,slow_rank"], nproc=1)
    assert "hung_rank" in parse_kinds(None, nproc=2) and "hang" not in parse_kinds(None, nproc=2)
    assert "hung_rank" not in parse_kinds(None)
    for seed in range(20):
        faults = schedule(seed, 1, 30, 5, 4, ("slow_rank", "rank_kill", "hung_rank"))
        assert sum(f.kind == "slow_rank" for f in faults) <= 1
        assert all(f.inject.endswith("/r1") for f in faults)


@pytest.mark.slow  # two-process jobs, a hung rank's collective timeout: about 2-3 minutes
def test_a_two_process_soak_survives_the_faults_of_one_rank(
    small_corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    sets = [
        f"data.source={small_corpus}",
        f"data.cache_dir={cache_dir}",
        "tokenizer.vocab_size=512",
        "data.seq_len=32",
    ]
    args = ["drill", "--chaos", "1s", "--json", "--steps", "30", "--seed", "6", "--nproc", "2"]
    args += ["--fault-kind", "rank_kill,hung_rank,slow_rank", "--workdir", str(tmp_path / "s")]
    res = run_cli(*args, *[a for s in sets for a in ("--set", s)], timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    (r,) = json.loads(res.stdout)["rounds"]
    assert [f["label"] for f in r["faults"]] == ["slow_rank@4", "rank_kill@12", "hung_rank@13"]
    slow, kill, hung = r["faults"]
    assert slow["codes"] == ["H202"] and slow["steps_lost"] == 0
    # Steps count from 0: after checkpoint 10, steps 10 and 11 again; then 10, 11 and 12.
    assert "R302" in kill["codes"] and kill["steps_lost"] == 2
    assert "R301" in hung["codes"] and hung["steps_lost"] == 3
    assert r["finished"] and r["bitwise_equal"] is True
    assert [x["lost_steps"] for x in r["goodput"]["restarts"]] == [2, 3]


def test_each_launch_keeps_what_its_resume_logged() -> None:
    """A launch killed later prints no result: the findings its resume logged (C101 for the
    corrupt checkpoint it passed over) are read from the record, split at each launch's
    `attempt` row."""
    from trainguard.drills.chaos import _findings_by_launch

    attempt = {"kind": "timing", "what": "attempt", "time": 0.0}
    rows = [
        attempt,
        {"kind": "step", "step": 0},
        {"kind": "finding", "code": "R101", "step": 4},
        attempt,
        {"kind": "finding", "code": "C101", "step": 50},
        {"kind": "finding", "code": "C150", "step": 40},
        attempt,
    ]
    assert [[f["code"] for f in launch] for launch in _findings_by_launch(rows)] == [
        ["R101"],
        ["C101", "C150"],
        [],
    ]
