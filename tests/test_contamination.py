"""Train/eval contamination (D250): planted leaks are found with the right rule, document ids
and overlap; clean evals, and the shipped demo's incidental overlap, are not blocked."""

from __future__ import annotations

import json
import time
import weakref
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainguard.cli import app
from trainguard.config.schema import PreflightConfig
from trainguard.data.corpus import Document, split_of
from trainguard.dedup.contamination import EvalTask, find_contamination
from trainguard.dedup.planted import Generator
from trainguard.evals.builtin import python_next_line
from trainguard.evals.contamination import check_contamination

G = Generator(seed=11, words=300)
BACKGROUND = [G.doc() for _ in range(30)]
LEAKED = G.doc(words=40)  # an eval text copied verbatim into a training document
SHORT = G.doc(words=8)  # shorter than 13 words: only containment can see it
ONE_GRAM = G.doc(words=40)  # shares exactly one 13-gram with training
CLEAN = [G.doc(words=40) for _ in range(3)]


def training_records() -> list[dict]:
    recs = [{"id": f"bg-{i}", "text": t} for i, t in enumerate(BACKGROUND)]
    recs[3]["text"] = BACKGROUND[3] + " " + LEAKED + " " + G.doc(words=50)
    recs[7]["text"] = G.doc(words=100) + " " + SHORT + " " + BACKGROUND[7]
    recs[9]["text"] += " " + " ".join(ONE_GRAM.split()[10:23])
    # A common phrase shorter than 13 words in every clean example and in training: incidental.
    recs[12]["text"] += " " + " ".join(CLEAN[0].split()[5:15])
    return recs


def write_jsonl(path: Path, rows: list[dict], blank_after: int | None = None) -> Path:
    lines = [json.dumps(r) + "\n" for r in rows]
    if blank_after is not None:
        lines.insert(blank_after + 1, "\n")  # blank lines are not examples
    path.write_text("".join(lines))
    return path


def eval_spec(tmp_path: Path) -> Path:
    # A perplexity task: clean, leaked, clean, short, one-13-gram, clean (with a blank line).
    texts = [CLEAN[0], LEAKED, CLEAN[1], SHORT.upper(), ONE_GRAM, CLEAN[2]]
    write_jsonl(tmp_path / "texts.jsonl", [{"text": t} for t in texts], blank_after=1)
    # A generation task whose answer completes a leaked sentence, and a clean one.
    words = LEAKED.split()
    gen = [
        {"prompt": " ".join(words[:20]), "answer": " " + " ".join(words[20:30])},
        {"prompt": " ".join(CLEAN[1].split()[:20]), "answer": " x"},
        {"prompt": " ".join(CLEAN[2].split()[:20]), "answer": " y"},
    ]
    write_jsonl(tmp_path / "gen.jsonl", gen)
    spec = {
        "name": "leaky",
        "tasks": [
            {"name": "texts", "type": "perplexity", "data": "texts.jsonl"},
            {"name": "gen", "type": "generation", "data": "gen.jsonl"},
        ],
    }
    path = tmp_path / "leaky.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_planted_leaks_are_found_with_rule_ids_and_overlap(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", training_records())
    report = check_contamination([str(eval_spec(tmp_path))], str(train))
    texts, gen = report.tasks
    assert (texts.task, texts.examples, gen.task, gen.examples) == ("texts", 6, "gen", 3)
    found = {c.example: c for c in texts.contaminated}
    assert sorted(found) == [1, 3, 4]  # the clean examples 0, 2, 5 pass
    assert (found[1].match, found[1].train_ids, found[1].overlap) == ("ngram", ["bg-3"], 1.0)
    # Eight words inside a long document: no 13-gram, but all of its 5-grams are there.
    assert (found[3].match, found[3].train_ids, found[3].overlap) == ("minhash", ["bg-7"], 0.0)
    # One shared 13-gram is enough for GPT-3's rule; overlap is 1 of its 28 13-grams.
    assert (found[4].match, found[4].train_ids) == ("ngram", ["bg-9"])
    assert found[4].overlap == pytest.approx(1 / 28, abs=1e-6)
    assert [(c.example, c.match, c.train_ids) for c in gen.contaminated] == [(0, "ngram", ["bg-3"])]
    (f_texts, f_gen) = report.findings()
    assert (f_texts.code, f_texts.severity, f_texts.metric) == ("D250", "error", "texts")
    assert f_texts.data["contaminated"] == 3 and f_texts.data["examples"] == 6
    assert "bg-3" in f_texts.message
    # Pre-flight: a warning at or below the allowed share, an error above it.
    assert [f.severity for f in report.findings(max_fraction=0.5)] == ["warning", "warning"]
    assert [f.severity for f in report.findings(max_fraction=0.4)] == ["error", "warning"]


def test_clean_evals_raise_nothing(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", training_records()[:3])  # no planted leak
    report = check_contamination([str(eval_spec(tmp_path))], str(train))
    assert [t.contaminated for t in report.tasks] == [[], []]
    assert report.findings() == []
    assert report.documents == 3


def test_training_documents_are_streamed_not_loaded():
    """Each training document is released before the next is read: no whole-corpus load.
    (Documents hold no cycles, so reference counting frees them at once: no gc pass needed.)"""
    refs: list[weakref.ref] = []
    alive_behind = []

    def documents():
        for i in range(40):
            alive_behind.append(sum(r() is not None for r in refs[:-1]))
            doc = Document(f"d{i}", G.doc(words=60), "s")
            refs.append(weakref.ref(doc))
            yield doc

    report = find_contamination([EvalTask("s", "t", [LEAKED])], documents())
    assert report.documents == 40
    assert max(alive_behind) == 0


def test_builtin_task_from_a_held_out_file_copied_into_training(tmp_path):
    """A validation file duplicated under another name in the training split: the examples
    python_next_line builds from it are contaminated, and name the copy."""
    folder = tmp_path / "code"
    folder.mkdir()
    g = Generator(seed=5)
    for i in range(16):
        lines = [f"value_{j} = compute({g.doc(words=4).replace(' ', ', ')})" for j in range(40)]
        (folder / f"mod{i:02d}.py").write_text("\n".join(lines) + "\n")
    val_fraction = 0.3
    val = sorted(p.name for p in folder.iterdir() if split_of(p.name, val_fraction) == "val")
    assert len(val) >= 2
    source = val[0]
    copy = next(
        f"copy{k}_{source}" for k in range(100) if split_of(f"copy{k}_{source}", 0.3) == "train"
    )
    (folder / copy).write_text((folder / source).read_text())
    spec = tmp_path / "nl.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "nl",
                "tasks": [
                    {
                        "name": "next_line",
                        "type": "multiple_choice",
                        "builtin": "python_next_line",
                        "options": {"n_examples": 40},
                    }
                ],
            }
        )
    )
    from trainguard.config.schema import DataConfig

    rows = python_next_line(
        DataConfig(source=str(folder), val_fraction=val_fraction), n_examples=40
    )
    report = check_contamination([str(spec)], str(folder), val_fraction=val_fraction)
    (task,) = report.tasks
    assert task.examples == len(rows) == 40
    expected = {i for i, r in enumerate(rows) if r["doc"] == source}
    assert expected  # the duplicated file gave some examples
    assert {c.example for c in task.contaminated} == expected
    assert all(c.train_ids == [copy] for c in task.contaminated)
    # Examples near the top of the file have fewer than 13 words: containment finds those.
    assert {c.match for c in task.contaminated} == {"ngram", "minhash"}


def test_cli_json_shape_exit_status_and_bad_input(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", training_records())
    spec = str(eval_spec(tmp_path))
    runner = CliRunner()
    res = runner.invoke(app, ["data", "contamination", str(train), "--evals", spec, "--json"])
    assert res.exit_code == 1, res.output
    payload = json.loads(res.stdout)
    assert set(payload) == {"ok", "findings", "tasks"}
    assert payload["ok"] is False
    assert [f["code"] for f in payload["findings"]] == ["D250", "D250"]
    first = payload["tasks"][0]
    assert set(first) == {"spec", "task", "examples", "contaminated"}
    assert first["spec"] == spec and first["task"] == "texts" and first["examples"] == 6
    assert first["contaminated"][0] == {
        "example": 1,
        "train_ids": ["bg-3"],
        "match": "ngram",
        "overlap": 1.0,
        "containment": 1.0,
    }
    clean = write_jsonl(tmp_path / "clean.jsonl", training_records()[:3])
    res = runner.invoke(app, ["data", "contamination", str(clean), "--evals", spec, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["findings"] == []
    for args, words in (
        ([str(tmp_path / "missing.jsonl"), "--evals", spec], "does not exist"),
        ([str(train), "--evals", str(tmp_path / "nope.yaml")], "does not exist"),
        ([str(train), "--evals", spec, "--containment", "1.5"], "outside (0, 1]"),
        ([str(train), "--evals", spec, "--val-fraction", "0.7"], "outside [0, 0.5)"),
        ([str(train), "--evals", "python_next_line"], "--val-fraction"),
    ):
        res = runner.invoke(app, ["data", "contamination", *args])
        assert res.exit_code == 2, (args, res.output)
        assert words in res.output, res.output


def test_default_recipe_demo_is_not_blocked(capsys):
    """The shipped demo's own data and eval: code shares idioms and licence headers, so some
    examples share a 13-gram with training; pre-flight warns and does not stop the run."""
    from trainguard.config.load import load_recipe

    recipe = load_recipe("default")
    t0 = time.perf_counter()
    report = check_contamination(
        recipe.evals.specs,
        recipe.data.source,
        recipe.data.text_field,
        recipe.data.val_fraction,
        recipe.evals.max_examples,
    )
    seconds = time.perf_counter() - t0
    (task,) = report.tasks
    limit = PreflightConfig().contamination_max
    assert 0 < task.fraction < limit
    assert all(f.severity == "warning" for f in report.findings(max_fraction=limit))
    with capsys.disabled():
        print(f"\n[default recipe contamination pre-flight: {seconds:.2f} s, {task.fraction:.1%}]")


def test_run_preflight_warns_or_stops_on_contamination(tiny_recipe, small_corpus, tmp_path):
    """In `trainguard run`: a contaminated share at or below preflight.contamination_max is a
    warning and training goes on (so is a trailing-space trap in a prompt); above it, pre-flight
    stops the run before the first step."""
    from runhelpers import invoke_cli

    train_file = next(
        p
        for p in sorted(small_corpus.rglob("*.py"))
        if split_of(p.relative_to(small_corpus).as_posix(), 0.1) == "train"
        and len(p.read_text().split()) > 200
    )
    copied = " ".join(train_file.read_text().split()[100:160])
    write_jsonl(tmp_path / "texts.jsonl", [{"text": copied}, {"text": CLEAN[0]}])
    write_jsonl(tmp_path / "gen.jsonl", [{"prompt": "result = ", "answer": "self"}])
    spec = tmp_path / "extra.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "extra",
                "tasks": [
                    {"name": "copied", "type": "perplexity", "data": "texts.jsonl"},
                    {"name": "prompt", "type": "generation", "data": "gen.jsonl"},
                ],
            }
        )
    )
    recipe = yaml.safe_load(tiny_recipe.read_text())
    recipe["preflight"] = {"enabled": True}
    recipe["evals"] = {"specs": ["python_next_line", str(spec)], "max_examples": 20}
    recipe["train"]["max_steps"] = 1
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))

    def findings(run_dir: Path) -> dict[str, str]:
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return {
            f"{r['code']}:{r['metric']}": r["severity"] for r in rows if r.get("kind") == "finding"
        }

    res = invoke_cli("run", str(path), "--run-dir", str(tmp_path / "a"), "-q")
    assert res.returncode == 0, res.stderr
    got = findings(tmp_path / "a")
    assert got["D250:copied"] == "warning"  # 1 of 2 examples: 0.5, not above 0.5
    assert got["E111:prompt"] == "warning"  # a real trap for this tokenizer, but never blocking
    res = invoke_cli(
        "run",
        str(path),
        "--run-dir",
        str(tmp_path / "b"),
        "-q",
        "--set",
        "preflight.contamination_max=0.4",
    )
    assert res.returncode == 1
    assert "D250" in res.stderr and "'copied'" in res.stderr
    assert findings(tmp_path / "b")["D250:copied"] == "error"
    assert not (tmp_path / "b" / "checkpoints").exists() or not any(
        (tmp_path / "b" / "checkpoints").iterdir()
    )
