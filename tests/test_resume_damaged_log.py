"""A resume reads back the rows of the steps it recomputes (issue 26): damaged rows among them
(no batch hash, a 400-digit loss, values nested 100,000 deep) never stop it with a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from runhelpers import invoke_cli
from trainguard.metrics.jsonl import read_metrics

DEEP = '{"kind": "step", "step": 11, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"


def test_resume_over_damaged_rows_of_the_lost_steps(tiny_recipe: Path, tiny_run_copy: Path) -> None:
    run = tiny_run_copy
    shutil.rmtree(run / "checkpoints" / "step-12")  # the resume starts at checkpoint 8
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "step" and row["step"] == 9:
            del row["batch_hash"]  # a row written by something else, or damaged
            line = json.dumps(row)
        elif row.get("kind") == "step" and row["step"] == 10:
            line = line.replace(f'"loss": {json.dumps(row["loss"])}', '"loss": ' + "9" * 400)
        out.append(line)
        if row.get("kind") == "step" and row["step"] == 10:
            out.append(DEEP)
    (run / "metrics.jsonl").write_text("\n".join(out) + "\n")

    res = invoke_cli("run", str(tiny_recipe), "--run-dir", str(run), "-q")
    assert res.returncode == 0, res.stdout + res.stderr
    text = (run / "metrics.jsonl").read_text()
    assert DEEP in text.splitlines()  # unreadable, but the log's own line: kept, not dropped
    rows = read_metrics(run)
    steps = [r for r in rows if r.get("kind") == "step"]
    assert [r["step"] for r in steps] == list(range(12))  # the lost steps, recomputed once
    assert all(isinstance(r["batch_hash"], str) for r in steps)
    codes = {r.get("code") for r in rows if r.get("kind") == "finding"}
    assert "C150" in codes and "D110" not in codes  # no hash to compare is no mismatch
