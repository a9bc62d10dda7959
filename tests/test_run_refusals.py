"""A run dir with history is never restarted silently (issue 26): checkpoints that are gone while
the log records them stop the run (C107) with nothing changed, until `--fresh` sets the old run
aside. The byte-identical refusals of every other resume check are rows of the bad-input
matrix (tests/test_bad_input_matrix.py, `run-resume-*`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runhelpers import invoke_cli, tree_snapshot
from trainguard.errors import NoUsableCheckpoint


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_deleted_checkpoints_refuse_the_restart_until_fresh(
    tiny_recipe: Path, tiny_run_copy: Path
) -> None:
    run = tiny_run_copy
    for folder in (run / "checkpoints").glob("step-*"):
        shutil.rmtree(folder)
    before = tree_snapshot(run)
    res = invoke_cli("run", str(tiny_recipe), "--run-dir", str(run), "-q", "--json")
    assert res.returncode == 1, res.stderr[-2000:]
    payload = json.loads(res.stdout)
    assert payload["error"]["type"] == "NoUsableCheckpoint"
    assert "C107" in payload["error"]["message"] and "step 12" in payload["error"]["message"]
    assert "--fresh" in payload["error"]["fix"] and "attic" in payload["error"]["fix"]
    assert "C107" in [f["code"] for f in payload["findings"]]
    assert tree_snapshot(run) == before  # no restart from step 0: metrics.jsonl kept whole
    # Starting over on purpose: the old run goes to the attic, nothing is deleted.
    metrics = (run / "metrics.jsonl").read_bytes()
    res = invoke_cli(
        "run", str(tiny_recipe), "--run-dir", str(run), "-q", "--json", "--fresh", "--no-evals",
        "--set", "train.max_steps=2",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    payload = json.loads(res.stdout)
    assert payload["resumed_from"] is None and payload["final_step"] == 2
    assert "C113" in [f["code"] for f in payload["findings"]]
    (attic,) = (run / "attic").iterdir()
    assert (attic / "metrics.jsonl").read_bytes() == metrics


def test_the_log_records_each_committed_checkpoint(finished_tiny_run: Path) -> None:
    saved = [r for r in rows(finished_tiny_run) if r.get("event") == "checkpoint"]
    assert [r["step"] for r in saved] == [4, 8, 12]
    assert saved[-1]["path"].endswith("step-12")


@pytest.mark.parametrize(
    ("logged", "refused"),
    [
        # A crash before the first checkpoint: nothing to lose, it starts at step 0 again.
        ([{"kind": "event", "step": 0, "event": "start"}, {"kind": "step", "step": 3}], False),
        ([{"kind": "step", "step": 4}, {"kind": "event", "step": 4, "event": "checkpoint"}], True),
        ([{"kind": "step", "step": 8}, {"kind": "event", "step": 8, "event": "end"}], True),
        ([], False),
    ],
)
def test_history_is_what_the_log_says_was_committed(
    tmp_path: Path, logged: list[dict], refused: bool
) -> None:
    from trainguard.train.refusals import refuse_lost_history

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
    if not refused:
        refuse_lost_history(tmp_path, str(tmp_path / "checkpoints"))
        return
    with pytest.raises(NoUsableCheckpoint) as e:
        refuse_lost_history(tmp_path, str(tmp_path / "checkpoints"))
    assert "C107" in e.value.message and "--fresh" in e.value.fix
    assert [f.code for f in e.value.findings] == ["C107"]


def test_a_resume_stopped_by_pre_flight_keeps_the_recipe_it_did_not_extend(
    tiny_recipe: Path, tiny_run_copy: Path, torch_globals: None
) -> None:
    """Pre-flight (the last check, in `pre_train`) stops a resume that would extend the run
    to 16 steps: its verdict is logged, but recipe.yaml still says 12, so the finished run
    does not read as unfinished afterwards."""
    from trainguard.config.load import load_recipe
    from trainguard.errors import PreflightFailed
    from trainguard.train.callback import Callback, RunContext
    from trainguard.train.guarded_run import Run
    from trainguard.train.world import Dist

    class FailingPreflight(Callback):  # what pre-flight does on an error finding
        name, priority = "failing_preflight", 100

        def pre_train(self, ctx: RunContext) -> None:
            raise PreflightFailed("pre-flight found 1 error(s), training did not start")

    recipe = load_recipe(str(tiny_recipe), ["train.max_steps=16"])
    before = {
        name: (tiny_run_copy / name).read_bytes() for name in ("recipe.yaml", "tokenizer.json")
    }
    run = Run(
        recipe, tiny_run_copy, Dist(), progress=False, evals=False, callbacks=[FailingPreflight()]
    )
    run.setup()
    with pytest.raises(PreflightFailed) as e:
        run.train()
    run.close(report=True, primary=e.value)
    assert {name: (tiny_run_copy / name).read_bytes() for name in before} == before
    res = invoke_cli(
        "reference", "record", str(tiny_run_copy), "--out", str(tiny_run_copy.parent / "r.json")
    )
    assert res.returncode == 0, res.stderr[-2000:]


def test_fresh_refuses_an_attic_that_is_a_link_before_moving_anything(
    tiny_recipe: Path, tmp_path: Path
) -> None:
    """The run dir's attic is a matrix row; here a checkpoint.dir outside the run dir, whose
    steps --fresh moves to its own attic/: a symlink there would take them out of it."""
    from trainguard.config.load import load_recipe
    from trainguard.errors import BadInputError
    from trainguard.train.start import start_fresh

    run, ckpts, outside = tmp_path / "run", tmp_path / "ckpts", tmp_path / "outside"
    for folder in (run, ckpts / "step-4", outside):
        folder.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"kind": "step", "step": 4}\n')
    (ckpts / "attic").symlink_to(outside)
    before = tree_snapshot(tmp_path)
    recipe = load_recipe(str(tiny_recipe), [f"checkpoint.dir={ckpts}"])
    with pytest.raises(BadInputError) as e:
        start_fresh(recipe, run)
    assert str(ckpts / "attic") in e.value.message and "symbolic link" in e.value.message
    assert tree_snapshot(tmp_path) == before
