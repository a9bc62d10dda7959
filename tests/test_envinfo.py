"""H101, software drift: the environment fingerprint (with CUDA, cuDNN, NCCL and driver
versions, None on CPU), the drift comparison, and H101 on a real resume under other software."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import trainguard.train.guarded_run as run_module
from trainguard.config.load import validate_recipe
from trainguard.train.envinfo import (
    BITWISE_KEYS,
    DRIFT_KEYS,
    drift_findings,
    environment_changes,
    environment_fingerprint,
)
from trainguard.train.guarded_run import run_recipe

GPU_KEYS = ("cuda", "cudnn", "nccl", "driver")


def test_fingerprint_records_the_gpu_stack_and_what_changes_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    env = environment_fingerprint()
    assert set(GPU_KEYS) <= set(env) and set(GPU_KEYS) <= set(DRIFT_KEYS)
    if not torch.cuda.is_available():
        assert all(env[k] is None for k in GPU_KEYS), {k: env[k] for k in GPU_KEYS}
        assert env["device"].startswith("cpu:")
    assert env["torch"] == torch.__version__ and env["torch_threads"] == torch.get_num_threads()
    assert env["world_size"] == 4 and env["cpu"]
    # Bits depend on the CPU, threads and processes, not on trainguard's own revision.
    assert {"cpu", "torch_threads", "world_size"} <= set(BITWISE_KEYS)
    assert "git_revision" not in BITWISE_KEYS and "trainguard" not in BITWISE_KEYS


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fingerprint_on_cuda_has_every_gpu_version() -> None:
    env = environment_fingerprint()
    assert all(env[k] for k in GPU_KEYS), {k: env[k] for k in GPU_KEYS}
    assert env["device"].startswith("cuda:")


def test_drift_lists_each_changed_component_old_and_new() -> None:
    saved = environment_fingerprint()
    assert drift_findings(saved, dict(saved), 40) == []
    # An env.json from before CUDA versions were recorded: missing keys read as None.
    old = {k: v for k, v in saved.items() if k not in GPU_KEYS}
    if not torch.cuda.is_available():
        assert drift_findings(old, saved, 40) == []
    now = {**saved, "torch": "9.9.9", "driver": "555.42.06", "torch_threads": 64}
    (finding,) = drift_findings(saved, now, 40)
    assert finding.code == "H101" and finding.severity == "warning" and finding.step == 40
    assert set(finding.data["changed"]) == {"torch", "driver"}  # threads are not software
    assert f"torch {saved['torch']} -> 9.9.9" in finding.message
    assert f"driver {saved['driver']} -> 555.42.06" in finding.message
    assert "the checkpoint of step 40" in finding.message
    (against,) = drift_findings(saved, now, None, against="the reference was recorded")
    assert "since the reference was recorded" in against.message and against.step is None
    assert environment_changes(saved, now, BITWISE_KEYS).keys() == {
        "torch",
        "driver",
        "torch_threads",
    }


def test_resume_under_other_software_reports_h101(
    tiny_run_copy: Path, monkeypatch: pytest.MonkeyPatch, torch_globals
) -> None:
    """The finished tiny run resumed by a process whose torch and driver differ from the
    checkpoint's env.json (planted: the fingerprint this process reports)."""
    drifted = {**environment_fingerprint(), "torch": "9.9.9", "driver": "555.42.06"}
    monkeypatch.setattr(run_module, "environment_fingerprint", lambda: dict(drifted))
    recipe = validate_recipe(yaml.safe_load((tiny_run_copy / "recipe.yaml").read_text()))
    result = run_recipe(recipe, tiny_run_copy, progress=False, report=False, evals=False)
    assert result.resumed_from == 12
    (h101,) = [f for f in result.findings if f.code == "H101"]
    assert set(h101.data["changed"]) == {"torch", "driver"}
    assert h101.data["changed"]["driver"] == {"then": None, "now": "555.42.06"}
