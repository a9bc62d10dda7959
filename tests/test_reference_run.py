"""Reference curves in real runs: `trainguard reference record` and its refusals, and runs of the
tiny recipe compared with the recorded reference: a clean rerun (bitwise equal, operational keys
changed), another thread count (the band), planted changes (an attention scale, an initialisation, a
tokenizer merge, a schedule stepped twice under another torch: caught), another recipe's reference
(refused; --force), a truncated reference, and the comparison's state across a kill and
resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import trainguard.data.prepare as prepare
import trainguard.model.gpt as gpt
import trainguard.train.guarded_run as run_module
import trainguard.train.schedule as schedule
from runhelpers import run_cli, tiny_recipe_dict
from trainguard.cli import app
from trainguard.config.load import apply_override, validate_recipe
from trainguard.drills import planted
from trainguard.findings import Finding
from trainguard.reference.curve import load_reference
from trainguard.reference.record import record_reference
from trainguard.train.envinfo import environment_fingerprint
from trainguard.train.guarded_run import run_recipe

runner = CliRunner()
WARNINGS = ("R501", "R502", "R503", "R504", "R505", "H101")


@pytest.fixture(scope="module")
def reference_file(finished_tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished 12-step tiny run, recorded with the real command."""
    out = tmp_path_factory.mktemp("reference") / "tiny.ref.json"
    res = runner.invoke(app, ["reference", "record", str(finished_tiny_run), "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def run_tiny(corpus: Path, cache: Path, run_dir: Path, *overrides: str, evals: bool = False):
    raw = tiny_recipe_dict(corpus, cache)
    for o in overrides:
        apply_override(raw, o)
    recipe = validate_recipe(raw)
    result = run_recipe(recipe, run_dir, progress=False, report=False, evals=evals)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    event = next(r for r in rows if r.get("event") == "reference")
    return result, event


def by_code(findings, code: str):
    return [f for f in findings if f.code == code]


def test_record_writes_the_curve_and_refuses_bad_runs(
    reference_file: Path, finished_tiny_run: Path, tiny_run_copy: Path, tmp_path: Path
) -> None:
    curve = load_reference(reference_file)
    metrics = [
        json.loads(x) for x in (finished_tiny_run / "metrics.jsonl").read_text().split("\n") if x
    ]
    steps = [r for r in metrics if r.get("kind") == "step"]
    assert curve.steps == list(range(12)) and curve.loss == [r["loss"] for r in steps]
    assert curve.batch_hash == [r["batch_hash"] for r in steps]
    assert [e["step"] for e in curve.evals] == [6, 12]
    assert curve.single_environment and curve.data_identity is not None
    assert curve.env["torch_threads"] == 1  # the recipe's train.threads, not torch's default

    def record(run_dir: Path, out: Path):
        return runner.invoke(app, ["reference", "record", str(run_dir), "--out", str(out)])

    # An output over an input, or inside the run dir: refused before anything is read or
    # written (util/paths.refuse_overwrite, the project's one check); the run is untouched.
    before = (tiny_run_copy / "metrics.jsonl").read_bytes()
    for out, says in (
        (tiny_run_copy / "metrics.jsonl", "inside the input folder"),
        (tiny_run_copy, "is the input"),
        (tiny_run_copy / "checkpoints" / "ref.json", "inside the input folder"),
        (tiny_run_copy / "ref.json", "inside the input folder"),
    ):
        res = record(tiny_run_copy, out)
        assert res.exit_code == 2 and says in " ".join(res.output.split()), res.output
    assert (tiny_run_copy / "metrics.jsonl").read_bytes() == before
    assert not (tiny_run_copy / "ref.json").exists()

    # An unfinished run: its log ends at step 7, the eighth (a crash), no end event.
    lines = before.decode().splitlines()
    kept = [x for x in lines if (json.loads(x).get("step") or 0) <= 7 and "end" not in x]
    (tiny_run_copy / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    res = record(tiny_run_copy, tmp_path / "a.json")
    assert res.exit_code == 2 and "unfinished (step 8 of 12)" in res.output, res.output
    assert not (tmp_path / "a.json").exists()
    res = record(tmp_path / "nowhere", tmp_path / "b.json")
    assert res.exit_code == 2 and "does not exist" in res.output
    (tmp_path / "folder").mkdir()
    res = record(tmp_path / "folder", tmp_path / "c.json")
    assert res.exit_code == 2 and "not a run dir" in res.output


def test_record_warns_when_the_run_was_not_clean(tiny_run_copy: Path) -> None:
    """A reference recorded from a run whose guards skipped updates or rolled back: R507, naming
    what happened; the clean run gives none."""
    _, clean = record_reference(tiny_run_copy)
    assert clean == []
    log = tiny_run_copy / "metrics.jsonl"
    skipped = {"kind": "finding", **Finding.of("R201", "update skipped", step=5).to_dict()}
    rollback = {"kind": "event", "event": "rollback", "step": 9}
    with log.open("a") as f:
        f.write(json.dumps(skipped) + "\n" + json.dumps(rollback) + "\n")
    _, findings = record_reference(tiny_run_copy)
    assert [f.code for f in findings] == ["R507"], findings
    # The run's rows count steps from 0 (run.json schema 2), as the finding's step does.
    assert findings[0].data == {"skipped_steps": [5], "rollbacks": 1, "drift": False}
    assert "skipped 1 update(s) (first at step 5)" in findings[0].message


def test_clean_rerun_is_bitwise_equal_with_operational_keys_changed(
    reference_file: Path, small_corpus: Path, cache_dir: Path, tmp_path: Path, torch_globals
) -> None:
    result, event = run_tiny(
        small_corpus,
        cache_dir,
        tmp_path / "run",
        f"reference.path={reference_file}",
        "train.eval_interval=5",
        "train.log_interval=1",
        "checkpoint.interval=3",
        "checkpoint.keep=1",
        "evals.interval=5",  # use-case evals between steps (the reference ran without)
        "evals.max_examples=10",
        evals=True,
    )
    assert event["bitwise_expected"], event
    assert not [f for f in result.findings if f.code in WARNINGS], result.findings
    (summary,) = by_code(result.findings, "R506")
    assert summary.data["bitwise_equal"] and summary.data["compared"] == 12


def test_another_thread_count_stays_in_the_band(
    reference_file: Path, tiny_recipe: Path, tmp_path: Path
) -> None:
    # A process of its own: the CLI sets OpenMP's passive wait before torch starts its threads
    # (two spinning threads in this test process would crawl on a busy machine).
    res = run_cli(
        "run", str(tiny_recipe), "--run-dir", str(tmp_path / "run"), "--json", "-q",
        "--no-evals", "--set", f"reference.path={reference_file}", "--set", "train.threads=2",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    event = next(r for r in rows if r.get("event") == "reference")
    assert not event["bitwise_expected"]
    assert event["not_bitwise_because"] == {"torch_threads": {"then": 1, "now": 2}}
    findings = json.loads(res.stdout)["findings"]
    assert not [f for f in findings if f["code"] in WARNINGS], findings
    (summary,) = [f["data"] for f in findings if f["code"] == "R506"]
    assert summary["compared"] == 12 and summary["band_departure"] is None


@pytest.mark.parametrize("plant", ["attention_scale", "init_unscaled"])
def test_planted_model_change_is_caught_with_the_revision_that_changed(
    plant: str,
    reference_file: Path,
    small_corpus: Path,
    cache_dir: Path,
    tmp_path: Path,
    torch_globals,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Attention logits scaled by 1/d, or residual projections initialised without GPT-2's
    1/sqrt(2 n_layers): the first step (step 0) already departs bitwise."""
    monkeypatch.setattr(gpt, "F", gpt.F)  # both undone after the test
    monkeypatch.setattr(gpt.GPT, "__init__", gpt.GPT.__init__)
    planted.PLANTS[plant]()
    # The code change came with a new revision of the checkout: H101 names it.
    env = {**environment_fingerprint(), "git_revision": "f" * 40}
    monkeypatch.setattr(run_module, "environment_fingerprint", lambda: dict(env))
    result, event = run_tiny(
        small_corpus, cache_dir, tmp_path / "run", f"reference.path={reference_file}"
    )
    assert event["bitwise_expected"]  # the revision is what is tested, not a reason to give up
    (departure,) = by_code(result.findings, "R502")
    (drift,) = by_code(result.findings, "H101")
    assert departure.step == 0 and drift.step == 0
    assert "git_revision" in drift.data["changed"] and "f" * 40 in drift.message
    (summary,) = by_code(result.findings, "R506")
    assert not summary.data["bitwise_equal"] and summary.data["bitwise_departure"] == 0


def test_planted_schedule_under_other_torch_leaves_the_band_with_the_drift_next_to_it(
    reference_file: Path,
    small_corpus: Path,
    cache_dir: Path,
    tmp_path: Path,
    torch_globals,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another torch version (no bitwise expectation: the band alone decides) and a
    learning-rate schedule stepped twice per step: R501 names the first step of departure and
    H101, listing the torch change, comes at that step."""
    monkeypatch.setattr(schedule, "lr_at", schedule.lr_at)  # undone after the test
    planted.lr_schedule_2x()
    env = {**environment_fingerprint(), "torch": "9.9.9"}
    monkeypatch.setattr(run_module, "environment_fingerprint", lambda: dict(env))
    result, event = run_tiny(
        small_corpus, cache_dir, tmp_path / "run", f"reference.path={reference_file}"
    )
    assert not event["bitwise_expected"] and "torch" in event["not_bitwise_because"]
    assert not by_code(result.findings, "R502")
    (band,) = by_code(result.findings, "R501")
    (drift,) = by_code(result.findings, "H101")
    assert band.step == band.data["first_step"] == drift.step
    # every reference.interval steps done (step 9: ten done), and the last step (11)
    assert band.data["verdict_step"] in (9, 11)
    assert "torch" in drift.data["changed"] and "9.9.9" in drift.message
    (summary,) = by_code(result.findings, "R506")
    assert summary.data["band_departure"] == band.step


def test_planted_tokenizer_merge_is_other_data(
    reference_file: Path,
    small_corpus: Path,
    tmp_path: Path,
    torch_globals,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prepare, "train_tokenizer", prepare.train_tokenizer)
    planted.tokenizer_merge()
    result, _ = run_tiny(  # its own cache: the cached tokenizer would be reused
        small_corpus, tmp_path / "cache", tmp_path / "run", f"reference.path={reference_file}"
    )
    (other,) = by_code(result.findings, "R503")
    assert "the tokenizer" in other.message
    assert not by_code(result.findings, "R506")  # nothing compared across different data


def test_reference_of_another_recipe_or_truncated_is_refused(
    reference_file: Path, tiny_recipe: Path, tmp_path: Path, torch_globals
) -> None:
    base = ["run", str(tiny_recipe), "--run-dir", str(tmp_path / "run"), "-q", "--no-evals"]
    res = runner.invoke(
        app, [*base, "--set", f"reference.path={reference_file}", "--set", "train.lr=0.001"]
    )
    assert res.exit_code == 2, res.output
    assert "train.lr: 0.003 in the reference, 0.001 here" in res.output
    assert "--force" in res.output
    assert not (tmp_path / "run").exists()  # refused before anything was written

    truncated = tmp_path / "truncated.json"
    truncated.write_text(reference_file.read_text()[:-200])
    res = runner.invoke(app, [*base, "--set", f"reference.path={truncated}"])
    assert res.exit_code == 2 and "is truncated" in res.output, res.output

    # --force: compared anyway, the differences reported, never bitwise.
    res = runner.invoke(
        app,
        [
            *base,
            "--json",
            "--force",
            "--set",
            f"reference.path={reference_file}",
            "--set",
            "train.lr=0.001",
        ],
    )
    assert res.exit_code == 0, res.output
    findings = json.loads(res.stdout)["findings"]
    (forced,) = [f for f in findings if f["code"] == "R505"]
    assert "train.lr" in forced["data"]["differences"]
    recipe = yaml.safe_load((tmp_path / "run" / "recipe.yaml").read_text())
    assert recipe["reference"]["force"] is True  # the decision is recorded with the run
    summary = next(f for f in findings if f["code"] == "R506")["data"]
    assert not summary["bitwise_expected"]


@pytest.mark.slow  # two processes; the state's round trip is unit-tested in test_reference.py
def test_comparison_state_survives_a_kill_and_resume(
    reference_file: Path, tiny_recipe: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    args = [
        "run",
        str(tiny_recipe),
        "--run-dir",
        str(run_dir),
        "--json",
        "-q",
        "--no-evals",
        "--set",
        f"reference.path={reference_file}",
    ]
    killed = run_cli(*args, env={"TRAINGUARD_INJECT": "kill@5:backward"})
    assert killed.returncode == -9, killed.stderr
    resumed = run_cli(*args)
    assert resumed.returncode == 0, resumed.stderr
    payload = json.loads(resumed.stdout)
    assert payload["resumed_from"] == 4
    codes = [f["code"] for f in payload["findings"]]
    assert not set(codes) & set(WARNINGS), codes
    summary = next(f for f in payload["findings"] if f["code"] == "R506")["data"]
    # Steps 0-3 were compared before the kill (their state came back with checkpoint 4).
    assert summary["compared"] == 12 and summary["bitwise_equal"]
    shutil.rmtree(run_dir)
