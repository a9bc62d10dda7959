"""Backoff with full jitter, transient/permanent classification, token bucket, rank stagger."""

from __future__ import annotations

import errno
import os
import tempfile
import uuid
from pathlib import Path

import pytest

from trainguard.checkpoint import CheckpointStore, RetryPolicy, TokenBucket, is_transient
from trainguard.checkpoint.retry import RetryStats, VerifyMismatch, retry_call
from trainguard.codes import all_codes


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


@pytest.mark.parametrize(
    "exc, transient",
    [
        (TimeoutError("read timed out"), True),
        (ConnectionResetError("reset by peer"), True),
        (OSError(errno.EBUSY, "SlowDown"), True),  # s3fs maps 503 SlowDown to EBUSY
        (OSError(errno.EIO, "internal error"), True),
        (VerifyMismatch("short upload"), True),
        (FileNotFoundError("NoSuchBucket"), False),
        (PermissionError("AccessDenied"), False),
        (OSError(errno.ENOSPC, "No space left on device"), False),
        (OSError(errno.EFBIG, "File too large"), False),
        (ValueError("bad argument"), False),
    ],
)
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_botocore_errors_classified() -> None:
    bce = pytest.importorskip("botocore.exceptions")
    assert is_transient(bce.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    assert is_transient(bce.ClientError({"Error": {"Code": "SlowDown"}}, "PutObject"))
    assert not is_transient(bce.ClientError({"Error": {"Code": "AccessDenied"}}, "PutObject"))
    assert not is_transient(bce.NoCredentialsError())


def test_retry_call_backs_off_with_full_jitter() -> None:
    policy = RetryPolicy(attempts=5, base_delay_s=1.0, max_delay_s=3.0, seed=1)
    clock, calls, stats = FakeClock(), [], RetryStats()

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionError("dropped")
        return "ok"

    assert retry_call(flaky, policy, "upload x", stats, clock.sleep) == "ok"
    assert len(calls) == 4 and stats.retries == 3 and len(clock.slept) == 3
    for i, s in enumerate(clock.slept):  # uniform(0, min(cap, base * 2**i))
        assert 0.0 <= s <= min(3.0, 1.0 * 2**i)
    # Full jitter spreads clients: many draws cover the range, not one fixed delay.
    draws = [policy.backoff(3) for _ in range(200)]
    assert max(draws) > 2.0 and min(draws) < 1.0 and max(draws) <= 3.0


def test_retry_call_gives_up_and_skips_permanent_errors() -> None:
    policy = RetryPolicy(attempts=3, base_delay_s=0.0, seed=0)
    calls = []

    def always(exc: BaseException):
        def fn() -> None:
            calls.append(1)
            raise exc

        return fn

    with pytest.raises(TimeoutError):
        retry_call(always(TimeoutError("t")), policy, "x", sleep=lambda s: None)
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(PermissionError):
        retry_call(always(PermissionError("denied")), policy, "x", sleep=lambda s: None)
    assert len(calls) == 1
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_token_bucket_meters_bytes_per_second() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000.0, clock=clock, sleep=clock.sleep)
    bucket.acquire(1000)  # the first second's burst is free
    assert clock.slept == []
    bucket.acquire(3500)  # 3.5 s worth, paid in 1000-byte pieces
    assert sum(clock.slept) == pytest.approx(3.5)
    clock.now += 10.0  # idle time refills at most one second of burst
    clock.slept.clear()
    bucket.acquire(1500)
    assert sum(clock.slept) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        TokenBucket(0)


def _payload(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(os.urandom(5000))


def test_remote_transfers_are_rate_limited_and_staggered() -> None:
    url = f"memory://tg-{uuid.uuid4().hex}/ckpt"
    cache = tempfile.mkdtemp()
    writer = CheckpointStore(url, cache_dir=cache, rate_limit_bytes_per_s=1000.0)
    clock = FakeClock()
    writer.backend.bucket = TokenBucket(1000.0, clock=clock, sleep=clock.sleep)
    info = writer.save(1, _payload)
    # upload + read-back verify of 5000 bytes, plus the manifest: ~10 s at 1000 B/s
    moved = 2 * info.bytes
    assert sum(clock.slept) >= (moved - 1000) / 1000.0
    reader = CheckpointStore(
        url, cache_dir=tempfile.mkdtemp(), rank=3, world_size=4, retry=RetryPolicy(stagger_s=0.5)
    )
    waits: list[float] = []
    reader.backend.sleep = waits.append
    assert reader.load_latest().step == 1
    assert waits and waits[0] == pytest.approx(1.5)  # rank 3 starts 3 * 0.5 s late


def test_checkpoint_codes_registered_with_docs() -> None:
    ours = [
        c
        for c in all_codes()
        if c.code[0] == "C" and c.code[1] in "12" and not c.code.startswith("C15")
    ]
    numbers = {c.code for c in ours}
    assert {"C101", "C102", "C103", "C104", "C105", "C106", "C107"} <= numbers
    assert {"C201", "C202", "C203", "C204", "C205"} <= numbers
    for c in ours:
        assert c.title and c.catches and c.why and c.fix and c.false_positives and c.references
