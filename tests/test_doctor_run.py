"""`trainguard run --doctor` and the recipe key `preflight.doctor`: the quick doctor runs on
every rank before anything else, its errors stop the run before data preparation, and
switching it on or off does not make a run dir "another recipe"."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from runhelpers import run_cli, tiny_recipe_dict
from s3_server import storage_options

# timing-based (stragglers, hangs, watchdogs, doctor): one after the other on one worker under xdist
pytestmark = pytest.mark.xdist_group("timing-serial")


def metric_rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_doctor_stops_the_run_before_data_preparation_on_an_error(
    small_corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    recipe = tiny_recipe_dict(small_corpus, cache_dir)
    recipe["checkpoint"] |= {
        "dir": "s3://nobucket/run",
        "storage_options": storage_options(f"http://127.0.0.1:{closed_port()}"),
    }
    recipe["distributed"] = {"hang_timeout_s": 3}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    run_dir = tmp_path / "run"
    res = run_cli("run", str(path), "--run-dir", str(run_dir), "-q", "--doctor")
    assert res.returncode == 1, res.stderr
    assert "pre-flight found 1 error(s)" in res.stderr and "H413" in res.stderr
    rows = metric_rows(run_dir)
    assert [r["code"] for r in rows if r["kind"] == "finding"] == ["H413"]
    assert [r["event"] for r in rows if r["kind"] == "event"] == ["doctor"]
    assert not [r for r in rows if r["kind"] == "step"]
    assert not (run_dir / "tokenizer.json").exists()  # stopped before data preparation


def test_resuming_with_the_doctor_runs_it_first_and_is_the_same_run(
    tiny_recipe: Path, tiny_run_copy: Path
) -> None:
    # The finished 12-step run was trained without the doctor; resuming it with --doctor
    # (preflight.doctor=true) is not "another recipe": the key only decides what runs first.
    before = len(metric_rows(tiny_run_copy))
    res = run_cli(
        "run",
        str(tiny_recipe),
        "--run-dir",
        str(tiny_run_copy),
        "-q",
        "--doctor",
        "--set",
        "train.max_steps=13",
    )
    assert res.returncode == 0, res.stderr
    rows = metric_rows(tiny_run_copy)[before:]
    kinds = [r.get("event") or r["kind"] for r in rows if r["kind"] in ("event", "step")]
    assert kinds.index("doctor") < kinds.index("step")  # before the resumed step
    assert [r["step"] for r in rows if r["kind"] == "step"] == [12]  # the 13th step
    doctor = next(r for r in rows if r.get("event") == "doctor")
    assert [r["rank"] for r in doctor["checks"]["ranks"]] == [0]
    assert not [r for r in rows if r["kind"] == "finding" and r["code"].startswith("H4")]
