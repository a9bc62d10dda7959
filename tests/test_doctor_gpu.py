"""The doctor on a CUDA device: NVML's real record, compute and device memory on the GPU, and
the command end to end. Skipped without CUDA (the NVML judgements are tested on recorded
values in test_doctor_fleet.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runhelpers import run_cli

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def cuda_ctx(**plan):
    from trainguard.doctor.plan import DoctorPlan
    from trainguard.doctor.report import RankContext, Who
    from trainguard.doctor.team import device_label

    device = torch.device("cuda", 0)
    return RankContext(Who(0, "gpuhost", device_label(device)), device, DoctorPlan(**plan))


def test_nvml_reads_the_device_and_a_healthy_gpu_passes() -> None:
    pytest.importorskip("pynvml")
    from trainguard.doctor.nvml import assess, driver_version, read_device

    props = torch.cuda.get_device_properties(0)
    record = read_device(0, f"GPU-{props.uuid}")
    assert record is not None and record["name"]
    assert record["temperature_c"] is not None and 0 < record["temperature_c"] < 120
    assert record["pcie_width_max"] is None or record["pcie_width_max"] >= 1
    assert driver_version()
    print(json.dumps(record))  # kept in the test log: a recorded value for the pure tests
    assert [f.code for f in assess(record, cuda_ctx().who) if f.severity == "error"] == []


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_compute_and_device_memory_on_the_gpu(dtype: str) -> None:
    from trainguard.doctor.compute import check_attention, check_burn, check_matmul
    from trainguard.doctor.memory import check_memory

    ctx = cuda_ctx(dtype=dtype)
    for check in (check_matmul, check_attention, check_burn, check_memory):
        out = check(ctx)
        assert [f for f in out.findings if f.severity == "error"] == [], check.__name__
    assert check_memory(ctx).figures["device_memory_gib"] > 0


def test_a_planted_bitflip_is_found_on_the_gpu() -> None:
    from trainguard.doctor.compute import check_matmul
    from trainguard.doctor.inject import Injection
    from trainguard.doctor.report import RankContext

    ctx = cuda_ctx()
    ctx = RankContext(ctx.who, ctx.device, ctx.plan, Injection("bitflip", 0))
    assert [f.code for f in check_matmul(ctx).findings] == ["H401"]


def test_doctor_command_on_the_gpu(tmp_path: Path) -> None:
    res = run_cli("doctor", "--quick", "--json", "--set", f"checkpoint.dir={tmp_path}/ck")
    out = json.loads(res.stdout)
    rank = out["rounds"][0]["ranks"][0]
    assert rank["device"].startswith("cuda:0") and rank["matmul_gflops"] > 0
    assert res.returncode == (1 if not out["ok"] else 0)
    assert [f for f in out["findings"] if f["severity"] == "error"] == [], out["findings"]
