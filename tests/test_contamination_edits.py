"""Contamination at scale: lightly edited copies of eval examples are found (the exact 5-gram
containment rule, match "edit"), text sharing only common phrases is not, and the Spark engine
gives the local engine's report (same examples, rules and document ids in order)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainguard.cli import app
from trainguard.data.corpus import Document
from trainguard.dedup.contamination import EvalTask, find_contamination
from trainguard.dedup.planted import Generator

G = Generator(seed=5, words=200)
PHRASES = [" ".join(G.rng.choices(G.vocab[:200], k=8)) for _ in range(6)]  # common phrases


def example(i: int) -> str:
    """A templated eval example: a common phrase, 50 words of its own, another phrase."""
    return f"{PHRASES[i % 6]} {G.doc(words=50)} {PHRASES[(i + 1) % 6]}"


EXAMPLES = {kind: example(i) for i, kind in enumerate(("exact", "change10", "insert12"))}
EXAMPLES["unrelated"] = example(3)
EXAMPLES["boilerplate"] = example(4)


def change_every_tenth(text: str) -> str:
    return " ".join(f"new{i}" if (i + 1) % 10 == 0 else w for i, w in enumerate(text.split()))


def insert_every_twelfth(text: str) -> str:
    out = []
    for i, w in enumerate(text.split()):
        out += [w, f"ins{i}"] if (i + 1) % 12 == 0 else [w]
    return " ".join(out)


def training_texts() -> list[str]:
    """Background documents (every one holding common phrases), and one host per planted kind."""
    bg = [f"{G.doc()} {PHRASES[i % 6]} {G.doc(words=50)} {PHRASES[(i + 2) % 6]}" for i in range(12)]
    words = EXAMPLES["boilerplate"].split()
    hosts = [
        f"{G.doc(words=60)} {EXAMPLES['exact']} {G.doc(words=60)}",
        f"{G.doc(words=60)} {change_every_tenth(EXAMPLES['change10'])} {G.doc(words=60)}",
        f"{G.doc(words=60)} {insert_every_twelfth(EXAMPLES['insert12'])} {G.doc(words=60)}",
        # the template of the example and a 10-word quote of it (shorter than 13 words)
        f"{words[0:8]} {G.doc(words=40)} {' '.join(words[20:30])} {' '.join(words[-8:])}",
    ]
    return bg[:4] + hosts[:2] + bg[4:8] + hosts[2:] + bg[8:]


def test_edited_copies_are_found_and_shared_phrases_are_not():
    docs = [Document(f"t{i}", t, "s") for i, t in enumerate(training_texts())]
    kinds = list(EXAMPLES)
    report = find_contamination([EvalTask("s", "planted", list(EXAMPLES.values()))], docs)
    found = {kinds[c.example]: c for c in report.tasks[0].contaminated}
    assert sorted(found) == ["change10", "exact", "insert12"]  # no negative flagged
    assert (found["exact"].match, found["exact"].train_ids) == ("ngram", ["t4"])
    # Every 13-gram and most 5-grams are broken: only the containment rule sees these.
    assert (found["change10"].match, found["change10"].train_ids) == ("edit", ["t5"])
    assert (found["insert12"].match, found["insert12"].train_ids) == ("edit", ["t10"])
    assert found["change10"].overlap == 0.0 and found["insert12"].overlap == 0.0
    # A word in ten changed leaves about half of the 5-grams; an insertion every 12 about 2/3.
    assert 0.4 < found["change10"].containment < 0.6
    assert 0.6 < found["insert12"].containment < 0.75


def test_the_threshold_is_a_setting():
    docs = [Document(f"t{i}", t, "s") for i, t in enumerate(training_texts())]
    task = EvalTask("s", "planted", list(EXAMPLES.values()))
    strict = find_contamination([task], docs, edit_containment=0.6)
    assert [c.example for c in strict.tasks[0].contaminated] == [0, 2]  # change10 (~0.5) not


def write_source(tmp_path: Path) -> tuple[Path, Path]:
    """A JSONL training file spanning several Spark parts (the exact example in 25 documents
    spread through it, more than the 20 ids listed), and a spec of the planted examples."""
    texts = training_texts()
    rows = [{"id": f"t{i}", "text": t} for i, t in enumerate(texts)]
    for i in range(25):
        rows.insert(2 + 3 * i, {"id": f"copy{i}", "text": f"{G.doc()} {EXAMPLES['exact']}"})
    rows += [{"id": f"pad{i}", "text": G.doc()} for i in range(20)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "ex.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in EXAMPLES.values())
    )
    spec = {"name": "planted", "tasks": [{"name": "t", "type": "perplexity", "data": "ex.jsonl"}]}
    (tmp_path / "planted.yaml").write_text(yaml.safe_dump(spec))
    return train, tmp_path / "planted.yaml"


@pytest.mark.xdist_group("spark")
def test_spark_engine_gives_the_local_report(tmp_path, spark):
    train, spec = write_source(tmp_path)
    runner = CliRunner()
    out = {}
    for engine in ("local", "spark"):
        res = runner.invoke(
            app,
            [
                "data",
                "contamination",
                str(train),
                "--evals",
                str(spec),
                "--engine",
                engine,
                "--json",
            ],
        )
        assert res.exit_code == 1, res.output
        out[engine] = json.loads(res.stdout)
    assert out["spark"]["tasks"] == out["local"]["tasks"]
    assert out["spark"]["findings"] == out["local"]["findings"]
    rows = {c["example"]: c for c in out["local"]["tasks"][0]["contaminated"]}
    assert sorted(rows) == [0, 1, 2]
    holders = [json.loads(line)["id"] for line in train.read_text().splitlines()]
    holders = [i for i in holders if i.startswith("copy") or i == "t4"]
    assert rows[0]["train_ids"] == holders[:20]  # the first 20 of 26, in training order
    assert (rows[1]["match"], rows[2]["match"]) == ("edit", "edit")
    # Held-out documents are left out by the executors as the local engine leaves them out.
    held = {}
    for engine in ("local", "spark"):
        args = [str(train), "--evals", str(spec), "--val-fraction", "0.3", "--json"]
        res = runner.invoke(app, ["data", "contamination", *args, "--engine", engine])
        assert res.exit_code in (0, 1), res.output
        held[engine] = json.loads(res.stdout)
    assert held["spark"] == held["local"]
    assert held["local"]["tasks"][0]["contaminated"][0]["train_ids"] != holders[:20]
