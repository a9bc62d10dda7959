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

from s3_server import storage_options

# timing-based (stragglers, hangs, watchdogs, doctor): one after the other on one worker under xdist
pytestmark = pytest.mark.xdist_group("timing-serial")


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


def test_an_unreachable_store_and_more_threads_than_cores_in_one_run(tmp_path: Path) -> None:
    """One process, two faults: the object store does not answer (an error finding, exit 1,
    no traceback, no hang) and two threads share one core (a warning; the run goes on)."""
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
    core = min(os.sched_getaffinity(0))
    res = subprocess.run(
        [sys.executable, "-m", "trainguard", "doctor", str(recipe), "--quick", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "2", "CI": "1"},
        cwd=tmp_path,
        timeout=180,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),  # one core for two threads
    )
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    out = json.loads(res.stdout)
    by_code = {f["code"]: f for f in out["findings"]}
    assert sorted(by_code) == ["H413", "H417"]
    store = by_code["H413"]
    assert store["severity"] == "error" and store["rank"] == 0
    assert "s3://nobucket/run" in store["message"]
    threads = by_code["H417"]
    assert threads["severity"] == "warning"
    assert (threads["data"]["threads"], threads["data"]["cores"]) == (2, 1)
    assert out["rounds"][0]["ranks"][0]["matmul_gflops"] > 0  # the other checks ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml"]  # nothing left behind
