"""`trainguard doctor` as a user runs it, one process: bad input exits 2 with the problem and
the fix, an unreachable object store is a finding (exit 1, no traceback, no hang), and more
threads than cores is a warning that does not stop the run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runhelpers import run_cli
from s3_server import storage_options


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--nproc", "0"], "--nproc 0"),
        (["--inject", "bitflop/r1"], "not a fault the doctor knows"),
        (["--inject", "slow/1"], "not a fault the doctor knows"),
        (["--inject", "hang/r0"], "rank 0 gathers and reports"),
        (["--inject", "slow/r1"], "no rank 1 in a job of 1"),
        (["--nproc", "2", "--inject", "hang/r1", "--inject", "hang/r1"], "hang"),
        (["--set", "checkpoint.dir=nosuchfs://bucket/x"], "nosuchfs"),
        (["--repeat", "0"], "greater than or equal to 1"),  # typer's own check
    ],
)
def test_bad_input_exits_2_with_the_problem_and_the_fix(args: list[str], says: str) -> None:
    from typer.testing import CliRunner

    from trainguard.cli import app

    # In this process (the command's own code, without an interpreter start per case); bad
    # input is refused before any process is launched or any check runs.
    res = CliRunner().invoke(app, ["doctor", "--quick", *args])
    assert res.exit_code == 2, res.output
    assert says in res.output
    assert "fix:" in res.output or "Invalid value for '--repeat'" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_store_is_a_finding_and_exit_1(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "checkpoint": {
                    "dir": "s3://nobucket/run",
                    "storage_options": storage_options(f"http://127.0.0.1:{closed_port()}"),
                },
                "distributed": {"hang_timeout_s": 3},
            }
        )
    )
    res = run_cli("doctor", str(recipe), "--quick", "--json", timeout=180)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    out = json.loads(res.stdout)
    assert [f["code"] for f in out["findings"]] == ["H413"]
    assert out["findings"][0]["rank"] == 0 and "s3://nobucket/run" in out["findings"][0]["message"]
    assert out["rounds"][0]["ranks"][0]["matmul_gflops"] > 0  # the other checks ran


def test_more_threads_than_cores_warns_and_runs(tmp_path: Path) -> None:
    core = min(os.sched_getaffinity(0))
    env = {**os.environ, "OMP_NUM_THREADS": "2", "CI": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "trainguard", "doctor", "--quick", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),  # one core for two threads
    )
    out = json.loads(res.stdout)
    warned = [f for f in out["findings"] if f["code"] == "H417"]
    assert (
        len(warned) == 1 and warned[0]["data"]["threads"] == 2 and warned[0]["data"]["cores"] == 1
    )
    assert res.returncode == 0 and out["ok"], res.stdout  # a warning: the doctor ran to the end
    assert list(tmp_path.iterdir()) == []  # the storage probe left nothing behind
