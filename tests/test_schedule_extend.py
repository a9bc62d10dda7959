"""Resuming with another `train.max_steps` (issue 14, item 8): the LR schedule keeps its
decay and appends `train.schedule_on_extend`'s segment, says so (R620), and refuses to go
back below the checkpoint's step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runhelpers import invoke_cli
from trainguard.train.schedule import LrSchedule, lr_at


def _rows(run: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == kind]


def _lr(run: Path) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in _rows(run, "step")}


def _resume(recipe: Path, run: Path, *sets: str):
    args = [a for s in sets for a in ("--set", s)]
    return invoke_cli("run", str(recipe), "--run-dir", str(run), "-q", "--no-evals", *args)


def test_the_planned_schedule_is_the_cosine_bitwise() -> None:
    plan = LrSchedule.planned(50, 0.1, 500)
    assert all(plan.factor(s) == lr_at(s, 1.0, 50, 500, 0.1) for s in range(0, 520))


def test_extension_segments_continue_from_the_last_planned_lr() -> None:
    plan = LrSchedule.planned(2, 0.1, 12)
    const = plan.extended(16, "constant")
    assert [const.factor(s) for s in range(12, 16)] == [plan.factor(11)] * 4
    assert [const.factor(s) for s in range(12)] == [plan.factor(s) for s in range(12)]
    re = const.extended(20, "rewarm")
    climb = [re.factor(s) for s in range(15, 20)]
    assert climb[0] == plan.factor(11)  # step 15 (0-based) is still the constant segment
    assert climb[1] == pytest.approx(plan.factor(11) + (1 - plan.factor(11)) / 2)
    assert climb[2] == 1.0 and climb[3] == 1.0 and 0.1 < climb[4] < 1.0
    assert LrSchedule.from_list(2, 0.1, re.to_list()).to_list() == re.to_list()
    with pytest.raises(ValueError, match="chain"):
        LrSchedule.from_list(2, 0.1, [{"start": 0, "end": 4, "kind": "rewarm"}])


def test_a_larger_max_steps_holds_the_lr_and_says_so(tiny_run_copy: Path, tiny_recipe) -> None:
    before = _lr(tiny_run_copy)
    res = _resume(tiny_recipe, tiny_run_copy, "train.max_steps=16")
    assert res.returncode == 0, res.stderr[-3000:]
    lr = _lr(tiny_run_copy)
    assert sorted(lr) == list(range(16))  # steps count from 0
    assert [lr[s] for s in range(12)] == [before[s] for s in range(12)]
    # Constant: every added step trains at the LR of the last planned step, no jump.
    assert [lr[s] for s in range(12, 16)] == [before[11]] * 4
    (r620,) = [f for f in _rows(tiny_run_copy, "finding") if f["code"] == "R620"]
    assert r620["step"] == 12 and "12 -> 16" in r620["message"]  # at checkpoint 12
    assert r620["data"]["lr_before"] == r620["data"]["lr_after"] == before[11]
    assert r620["data"]["schedule_on_extend"] == "constant"


def test_rewarm_after_a_constant_extension(tiny_run_copy: Path, tiny_recipe) -> None:
    res = _resume(tiny_recipe, tiny_run_copy, "train.max_steps=14")
    assert res.returncode == 0, res.stderr[-3000:]
    res = _resume(
        tiny_recipe, tiny_run_copy, "train.max_steps=18", "train.schedule_on_extend=rewarm"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lr = _lr(tiny_run_copy)
    assert lr[12] == lr[13] == lr[11]  # the constant segment of the first extension
    peak = 3e-3  # tiny recipe's train.lr; warm-up 2 steps
    assert lr[14] == pytest.approx(lr[13] + (peak - lr[13]) / 2)
    assert lr[15] == pytest.approx(peak) and lr[16] == pytest.approx(peak)
    assert lr[17] < peak
    found = [f for f in _rows(tiny_run_copy, "finding") if f["code"] == "R620"]
    assert [f["data"]["schedule_on_extend"] for f in found] == ["constant", "rewarm"]
    assert found[1]["data"]["lr_before"] == lr[13] and found[1]["data"]["lr_after"] == lr[14]


def test_max_steps_below_the_checkpoint_is_refused(tiny_run_copy: Path, tiny_recipe) -> None:
    files = {p: p.read_bytes() for p in tiny_run_copy.rglob("*") if p.is_file()}
    res = _resume(tiny_recipe, tiny_run_copy, "train.max_steps=8")
    assert res.returncode == 2, res.stderr[-3000:]
    assert "train.max_steps=8 is below the step of the checkpoint" in " ".join(res.stderr.split())
    assert "Traceback" not in res.stderr
    for path, data in files.items():  # recipe, metrics, checkpoints untouched
        if path.name not in (".lock", "report.html", "report.md"):  # the report says why
            assert path.read_bytes() == data, path
