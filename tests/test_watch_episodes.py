"""`trainguard watch` on a real Hugging Face Trainer's NaN run, and findings as episodes.

The Trainer (transformers 5.x) logs a NaN loss as 0.0 (`logging_nan_inf_filter`), beside a NaN
gradient norm; the poisoned update makes every later step NaN too: 50 non-finite steps, which
are one R101 episode per metric, not 50 lines. A loss of exactly 0.0 beside a finite gradient
norm (a guarded Trainer's skipped step) is R107; a clean log gives nothing.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runhelpers import random_token_dataset
from trainguard.cli import app
from trainguard.cli.watch import watch_log
from trainguard.findings import Finding, group_episodes, step_interval

runner = CliRunner()
NAN = 7  # the logged step (the Trainer's global_step after the update) whose loss is NaN
STEPS = NAN + 49  # 50 non-finite steps: NAN..STEPS
CLEAN = 5  # a checkpoint saved before the NaN: its trainer_state.json is a clean log


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real transformers Trainer on CPU (tiny GPT-2, random tokens, no download), logging
    every step, whose update ending at step NAN has a NaN loss; saved at CLEAN and STEPS."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    class Poisoned(transformers.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return loss * math.nan if self.state.global_step + 1 == NAN else loss

    class SaveAt(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_save = state.global_step in (CLEAN, STEPS)
            return control

    out = tmp_path_factory.mktemp("hf_nan")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=8, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=4, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = Poisoned(
        model=transformers.GPT2LMHeadModel(config), args=args,
        train_dataset=random_token_dataset(32, 8),
        callbacks=[SaveAt()],
    )  # fmt: skip
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return out


def state_of(run: Path, step: int) -> Path:
    return run / f"checkpoint-{step}" / "trainer_state.json"


def test_nan_step_is_r101_at_its_step_and_50_steps_are_one_episode(nan_run: Path) -> None:
    # What the real Trainer logged: the NaN loss as 0.0, beside a NaN gradient norm.
    doc = json.loads(state_of(nan_run, STEPS).read_text())
    logged = {e["step"]: e for e in doc["log_history"] if "loss" in e}
    assert logged[NAN]["loss"] == 0.0 and math.isnan(logged[NAN]["grad_norm"])
    assert logged[NAN - 1]["loss"] > 1 and math.isfinite(logged[NAN - 1]["grad_norm"])
    findings, summary = watch_log(state_of(nan_run, STEPS))
    loss = [f for f in findings if f.metric == "loss"]
    assert {f.code for f in loss} == {"R101"}  # the 0.0 is a non-finite loss, not a dip
    assert [f.step for f in loss] == list(range(NAN, STEPS + 1))
    assert "logging_nan_inf_filter" in loss[0].message
    episodes = group_episodes(findings, summary["log_interval_steps"])
    assert [(e.code, e.first.metric, e.first_step, e.last_step, e.count) for e in episodes] == [
        ("R101", "grad_norm", NAN, STEPS, 50),
        ("R101", "loss", NAN, STEPS, 50),
    ]
    # The command: one line per episode in text, `episodes` beside every finding in JSON.
    result = runner.invoke(app, ["watch", str(state_of(nan_run, STEPS)), "--json"])
    assert result.exit_code == 1, result.output
    payload = json.loads(result.output)
    assert len(payload["findings"]) == 100
    shown = [(e["code"], e["first_step"], e["last_step"], e["count"]) for e in payload["episodes"]]
    assert shown == [("R101", NAN, STEPS, 50), ("R101", NAN, STEPS, 50)]
    assert payload["episodes"][0]["worst_value"] == "nan"
    assert payload["episodes"][0]["worst_step"] == NAN
    text = runner.invoke(app, ["watch", str(state_of(nan_run, STEPS))])
    assert text.exit_code == 1
    table_rows = [line for line in text.output.splitlines() if line.startswith("│ R101")]
    assert len(table_rows) == 2, text.output
    assert "2 error and 0 warning episodes, from 100 findings" in text.output


def test_a_clean_trainer_log_gives_nothing(nan_run: Path) -> None:
    findings, summary = watch_log(state_of(nan_run, CLEAN))
    assert summary["rows"] == CLEAN
    assert findings == []


def test_trainer_log_without_grad_norm(nan_run: Path, tmp_path: Path) -> None:
    """A Trainer that logs no gradient norm (older versions): a 0.0 loss is still R101 in its
    trainer_state.json; in a generic log the same row is the warning R107."""
    doc = json.loads(state_of(nan_run, STEPS).read_text())
    for entry in doc["log_history"]:
        entry.pop("grad_norm", None)
    state = tmp_path / "trainer_state.json"
    state.write_text(json.dumps(doc))
    found = {(f.code, f.step) for f in watch_log(state)[0]}
    assert ("R101", NAN) in found and ("R101", STEPS) in found
    rows = [e for e in doc["log_history"] if "loss" in e]
    jsonl = tmp_path / "log.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert {(f.code, f.severity) for f in watch_log(jsonl)[0]} == {("R107", "warning")}


def test_loss_of_exactly_zero_with_a_finite_grad_norm_is_r107(tmp_path: Path) -> None:
    """A GuardedTrainer's skipped NaN step logs loss 0.0 with grad_norm 0.0 (its gradients
    were dropped); any log's 0.0 loss with a NaN norm is R101."""
    log = tmp_path / "log.jsonl"
    rows = [{"step": s, "loss": 3.0, "grad_norm": 1.0} for s in range(1, 12)]
    rows[5] |= {"loss": 0.0, "grad_norm": 0.0}
    rows[8] |= {"loss": 0.0, "grad_norm": "nan"}
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = {(f.code, f.step, f.metric) for f in watch_log(log)[0]}
    assert found == {("R107", 6, "loss"), ("R101", 9, "loss"), ("R101", 9, "grad_norm")}


def f(code: str, step: int | None, value: object = None, **kw: object) -> Finding:
    data = {} if value is None else {"value": value}
    return Finding.of(code, f"{code} at {step}", step=step, data=data, **kw)


def test_episodes_group_consecutive_findings_of_one_code_and_place() -> None:
    findings = [
        f("R102", 10, 5.0, metric="loss"),
        f("R102", 11, 9.0, metric="loss"),
        f("R103", 11, 2.0, metric="grad_norm"),  # another code between them: still one episode
        f("R102", 12, 7.0, metric="loss"),
        f("R102", 20, 6.0, metric="loss"),  # a gap: a new episode
        f("R102", 12, 8.0, metric="loss", rank=1),  # another rank: its own
        f("C101", None),  # no step: its own
        f("C101", None),
    ]
    eps = group_episodes(findings)
    assert [(e.code, e.first_step, e.last_step, e.count, e.first.rank) for e in eps] == [
        ("R102", 10, 12, 3, None),
        ("R103", 11, 11, 1, None),
        ("R102", 20, 20, 1, None),
        ("R102", 12, 12, 1, 1),
        ("C101", None, None, 1, None),
        ("C101", None, None, 1, None),
    ]
    assert (eps[0].worst_value, eps[0].worst_step) == (9.0, 11)
    assert eps[0].to_dict()["message"] == "R102 at 10"  # the first finding's
    # The log interval is the gap allowed: findings 10 steps apart in a log written every 10.
    spaced = [f("R101", s, "nan", metric="loss") for s in range(10, 60, 10)]
    assert len(group_episodes(spaced)) == 5
    assert [e.count for e in group_episodes(spaced, step_interval([0, 10, 20, 30]))] == [5]


def test_worst_value_is_the_non_finite_or_furthest_from_the_median() -> None:
    drops = [
        Finding.of("R106", "d", step=s, metric="tps", data={"value": v, "median": 100.0})
        for s, v in ((1, 60.0), (2, 20.0), (3, 50.0))
    ]
    (e,) = group_episodes(drops)
    assert (e.worst_value, e.worst_step) == (20.0, 2)  # lowest throughput, furthest below
    mixed = [f("R101", 1, "inf", metric="loss"), f("R101", 2, "nan", metric="loss")]
    assert group_episodes(mixed)[0].worst_step == 1


def test_watch_follow_prints_an_episode_once(tmp_path: Path) -> None:
    log = tmp_path / "live.jsonl"
    rows = [{"step": s, "loss": 3.0 if s < 10 else "nan"} for s in range(40)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["watch", str(log), "--follow", "--idle-timeout", "0.5"]
    text = runner.invoke(app, args)
    assert text.exit_code == 1
    assert text.output.count("│ R101") == 2  # when it opened, and in the closing table
    assert "40 rows, 1 error and 0 warning episodes, from 30 findings" in text.output
    lines = runner.invoke(app, [*args, "--json"]).output.splitlines()
    streamed = [json.loads(x) for x in lines if x.startswith('{"finding"')]
    assert len(streamed) == 30 and {s["episode"] for s in streamed} == {0}
    summary = json.loads(lines[-1])
    assert [(e["first_step"], e["last_step"], e["count"]) for e in summary["episodes"]] == [
        (10, 39, 30)
    ]


@pytest.mark.slow  # a real run (about 20 s on a loaded machine); the parts are tested below
def test_run_groups_its_findings_and_counts_its_skips(
    small_corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """`trainguard run` with two consecutive NaN batches: `--json` keeps every finding and
    adds their episodes and the skipped updates; report.md and report.html list one row per
    episode and say how many updates were skipped."""
    import yaml

    from runhelpers import invoke_cli, tiny_recipe_dict

    recipe = tiny_recipe_dict(small_corpus, cache_dir)
    recipe["train"]["max_steps"] = 8
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    run_dir = tmp_path / "run"
    args = ["run", str(tmp_path / "tiny.yaml"), "--run-dir", str(run_dir), "-q", "--json"]
    res = invoke_cli(*args, env={"TRAINGUARD_INJECT": "nan@4,nan@5"})
    assert res.returncode == 0, res.stderr
    payload = json.loads(res.stdout)
    skips = [f["step"] for f in payload["findings"] if f["code"] == "R201"]
    assert skips == [4, 5]  # every finding is kept
    episodes = {(e["code"], e["metric"]): e for e in payload["episodes"]}
    assert (episodes["R201", None]["first_step"], episodes["R201", None]["last_step"]) == (4, 5)
    assert episodes["R201", None]["count"] == 2
    assert episodes["R101", "loss"]["count"] == 2
    assert len(payload["episodes"]) < len(payload["findings"])
    assert payload["skipped_updates"]["count"] == 2
    assert payload["skipped_updates"]["steps"] == [4, 5]
    assert payload["skipped_updates"]["train_loss_average"].startswith("none")
    md = (run_dir / "report.md").read_text()
    assert "**R201** info (steps 4-5, 2 findings)" in md
    assert "| skipped updates | 2 (steps 4, 5) |" in md
    html = (run_dir / "report.html").read_text()
    assert "4-5 (2 findings)" in html and "skipped updates" in html


def test_run_result_json_has_episodes_and_skipped_updates(tmp_path: Path) -> None:
    from trainguard.train.outcome import RunResult

    result = RunResult(tmp_path, 8, 3.0, 1.2, 10, 100, skipped_steps=[6, 5])
    result.findings = [f("R101", s, "nan", metric="loss") for s in (5, 6)]
    result.findings += [f("R201", s) for s in (5, 6)]
    d = result.to_dict()
    assert len(d["findings"]) == 4
    assert [(e["code"], e["first_step"], e["last_step"], e["count"]) for e in d["episodes"]] == [
        ("R101", 5, 6, 2),
        ("R201", 5, 6, 2),
    ]
    assert d["skipped_updates"]["count"] == 2 and d["skipped_updates"]["steps"] == [5, 6]
    assert d["skipped_updates"]["train_loss_average"].startswith("none")
    assert RunResult.from_dict(d).skipped_steps == [5, 6]  # `run --nproc` reads it back


def test_report_lists_episodes_and_skipped_updates(tmp_path: Path) -> None:
    from trainguard.report.build import write_report

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows: list[dict] = []
    for s in range(1, 41):
        bad = 10 <= s < 30
        action = "skip" if s in (10, 11) else "apply"
        rows.append({"kind": "step", "step": s, "loss": "nan" if bad else 3.0, "action": action})
        if bad:
            rows.append({"kind": "finding", **f("R101", s, "nan", metric="loss").to_dict()})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html_path, md_path = write_report(run_dir)
    md = md_path.read_text()
    # The previous release's rows (no run.json) count completed steps: the report's are 0-based.
    assert md.count("**R101**") == 1 and "(steps 9-28, 20 findings)" in md
    assert "| skipped updates | 2 (steps 9, 10) |" in md
    assert "| train loss average | none:" in md
    html = html_path.read_text()
    assert html.count("<td>R101</td>") == 1 and "9-28 (20 findings)" in html


def test_run_prints_one_line_per_episode_and_its_skips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainguard.cli.run import _RunOutput
    from trainguard.train.outcome import RunResult

    result = RunResult(tmp_path, 40, 3.0, 1.2, 10, 100, skipped_steps=[5, 6])
    result.findings = [f("R201", s) for s in range(5, 35)]
    _RunOutput(as_json=False, quiet=False).end(result)
    out = capsys.readouterr().out
    assert sum(line.startswith("│ R201 ") for line in out.splitlines()) == 1, out
    assert "skipped updates: 2 (steps 5, 6)" in out
