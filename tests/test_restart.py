"""What a restart pays for (issue 15, item 4; `benchmarks/bench_restart.py` times it): a resume of
a single-process run imports neither `torch._dynamo` (torch's optimizers import it on first use;
the run's are `Eager`, train/optim.py) nor `torch.distributed.checkpoint` (only a sharded
checkpoint needs it, checkpoint/dcp_files.py): each costs about as much as `import torch`. Nor
the doctor's runner (only `run --doctor` needs it; the run's software fingerprint imports
`doctor.environment`). Counted in a real resume through the command line, never timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_run_resume import step_rows

# Runs `trainguard run` as `python -m trainguard` does, then reports which of these modules
# the process imported (the whole run: the resume, its step, the final evaluation, the report).
_RESUME = """
import json, runpy, sys
watched = sys.argv[1].split(",")
sys.argv = ["trainguard", *sys.argv[2:]]
try:
    runpy.run_module("trainguard", run_name="__main__")
except SystemExit as e:
    status = e.code
print(json.dumps({"status": status, "imported": [m for m in watched if m in sys.modules]}))
"""

UNNEEDED = (
    "torch._dynamo",
    "torch.distributed.checkpoint",
    "torch.distributed.tensor",
    "trainguard.doctor.runner",
)


def _resume(run_dir: Path, steps: int) -> dict:
    args = ["run", str(run_dir / "recipe.yaml"), "--run-dir", str(run_dir)]
    args += ["--set", f"train.max_steps={steps}", "-q"]
    res = subprocess.run(
        [sys.executable, "-c", _RESUME, ",".join(UNNEEDED), *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_resume_imports_neither_dynamo_nor_dcp_nor_the_doctor(tiny_run_copy: Path) -> None:
    out = _resume(tiny_run_copy, 13)
    assert out["status"] == 0
    assert [r["step"] for r in step_rows(tiny_run_copy)] == list(range(13))  # steps count from 0
    events = [json.loads(line) for line in (tiny_run_copy / "metrics.jsonl").open()]
    assert [e["event"] for e in events if e.get("event") == "start"] == ["start"]  # resumed
    assert out["imported"] == []
