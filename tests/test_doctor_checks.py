"""Each rank's local checks, run in this process on the CPU against known answers: compute
(with the planted bit flip and slowdown), memory, storage (a local folder, a real S3
endpoint, an unreachable one), the environment."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
import torch

from s3_server import make_bucket, s3_server, storage_options
from trainguard.doctor.compute import (
    attention_bound,
    check_attention,
    check_burn,
    check_matmul,
    matmul_bound,
)
from trainguard.doctor.inject import Injection
from trainguard.doctor.memory import check_memory, verify_buffer
from trainguard.doctor.plan import DoctorPlan
from trainguard.doctor.report import RankContext, Who
from trainguard.doctor.runner import run_local
from trainguard.doctor.storage import check_storage

WHO = Who(0, "testhost", "cpu")


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread, as each rank of `--nproc` runs: CPU time is then the work itself
    (idle OpenMP workers spinning between matmuls would add to it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def ctx(inject: str | None = None, **plan) -> RankContext:
    injection = Injection(inject, 0) if inject else Injection()
    return RankContext(WHO, torch.device("cpu"), DoctorPlan(quick=True, **plan), injection)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_clean_compute_is_within_the_dtype_bound_and_repeatable(dtype: str) -> None:
    for check in (check_matmul, check_attention):
        out = check(ctx(dtype=dtype))
        assert out.findings == [], [str(f) for f in out.findings]
    c = ctx(dtype=dtype)
    n, shape = c.sizes.matmul_n, c.sizes.attention
    assert 0 < check_matmul(c).figures["matmul_error"] <= matmul_bound(c.dtype, n)
    bound = attention_bound(c.dtype, shape[2], shape[3])
    assert 0 < check_attention(c).figures["attention_error"] <= bound


def test_the_bounds_are_tight_enough_to_matter() -> None:
    # fp32 at K=768 allows ~5e-5 of |A||B|: a flipped exponent bit is orders of magnitude out.
    assert matmul_bound(torch.float32, 768) < 1e-4
    assert matmul_bound(torch.bfloat16, 768) < 0.01
    assert matmul_bound(torch.float32, 768, tf32=True) > 2**-11


def test_a_flipped_bit_in_the_matmul_is_a_wrong_result_naming_the_rank() -> None:
    out = check_matmul(ctx("bitflip"))
    assert [f.code for f in out.findings] == ["H401"]
    f = out.findings[0]
    assert (f.rank, f.where, f.data["device"]) == (0, "testhost", "cpu")
    assert f.data["error"] > 1000 * f.data["bound"]


def test_the_planted_slowdown_triples_the_timed_work() -> None:
    clean, slow = check_burn(ctx()), check_burn(ctx("slow"))
    # The same GFLOP counted, three times the matmuls done: CPU time per GFLOP about 3x.
    assert slow.timings["burn"] > 2 * clean.timings["burn"]
    assert clean.findings == []


def test_memory_patterns_read_back() -> None:
    out = check_memory(ctx())
    assert out.findings == [] and out.figures["host_memory_gib"] == pytest.approx(1 / 32)
    buf = torch.empty(1000, dtype=torch.int64)
    assert verify_buffer(buf) == 0


def test_storage_in_a_local_folder_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "not" / "yet" / "checkpoints"  # tested at its nearest existing parent
    out = check_storage(ctx(checkpoint_dir=str(target)))
    assert out.findings == []
    assert out.figures["storage_path"] == str(tmp_path)
    assert out.figures["storage_write_mbps"] > 0 and out.figures["storage_read_mbps"] > 0
    assert list(tmp_path.iterdir()) == [] and not target.exists()


def test_storage_that_cannot_be_written_is_a_finding(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = check_storage(ctx(checkpoint_dir=str(blocker / "checkpoints")))
    assert [f.code for f in out.findings] == ["H413"]
    assert "NotADirectoryError" in out.findings[0].message
    assert blocker.read_text() == "not a folder"  # the input is untouched


def test_storage_on_a_real_s3_endpoint() -> None:
    bucket = f"doctor-{uuid.uuid4().hex[:8]}"  # moto's store is shared by this process's tests
    with s3_server() as endpoint:
        fs = make_bucket(endpoint, bucket)
        url = f"s3://{bucket}/run1"
        out = check_storage(ctx(checkpoint_dir=url, storage_options=storage_options(endpoint)))
        assert out.findings == [], [str(f) for f in out.findings]
        assert out.figures["storage_read_mbps"] > 0
        fs.invalidate_cache()
        assert fs.find(bucket) == []  # the probe object was deleted


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


@pytest.mark.timeout(120)  # the probe has a 2 s deadline: a hang fails here, not forever
def test_an_unreachable_store_is_a_finding_not_a_hang() -> None:
    options = storage_options(f"http://127.0.0.1:{closed_port()}")
    c = ctx(checkpoint_dir="s3://ckpt/run1", storage_options=options, hang_timeout_s=2.0)
    out = check_storage(c)
    assert [f.code for f in out.findings] == ["H413"]
    assert out.findings[0].data["path"] == "s3://ckpt/run1"


def test_a_check_that_raises_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    c = ctx(checkpoint_dir=str(tmp_path), dtype="int8")  # no such dtype: every compute raises
    out = run_local(c)
    failed = sorted(f.data["check"] for f in out.findings if f.code == "H428")
    assert failed == ["attention", "burn", "matmul"]
    assert "storage_write_mbps" in out.figures  # the other checks still ran


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("world", [2, 3, 64, 300])
def test_known_collective_tensors_sum_exactly_in_the_dtype(dtype, world) -> None:
    from trainguard.doctor.collectives import exact_dtype, expected_sum, known

    cpu = torch.device("cpu")
    tested, m = exact_dtype(dtype, world)
    acc = torch.zeros(257, dtype=tested)
    for q in range(world):  # a ring's partial sums, in the tested dtype
        acc += known(q, 257, m, tested, cpu)
    assert torch.equal(acc.double(), expected_sum(world, 257, m, cpu))
    assert tested == (torch.float32 if (dtype, world) == (torch.bfloat16, 300) else dtype)


def test_short_work_is_timed_over_at_least_ten_milliseconds() -> None:
    """A 1 ms call is repeated within each timing (what keeps a healthy rank's 1-2 ms matmul
    from looking 2.5x slower than the other's); the time returned is still per call."""
    import time

    from trainguard.doctor.report import MIN_TIMING_S, Stopwatch

    calls = 0

    def one_millisecond() -> None:  # of this process's CPU time
        nonlocal calls
        calls += 1
        end = time.process_time() + 0.001
        while time.process_time() < end:
            pass

    seconds = Stopwatch(torch.device("cpu")).fastest(one_millisecond, reps=3)
    assert MIN_TIMING_S == 0.01
    assert calls >= 1 + 3 * 5, calls  # each of the 3 timings repeats the call (about 10 times)
    assert 0.001 <= seconds < 0.005  # per call
