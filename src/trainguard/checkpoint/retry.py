"""Be gentle with shared storage: backoff with jitter, a byte-rate limit, rank staggering.

Many ranks hitting an object store or NFS server at the same instant is how a healthy store
gets throttled (503 SlowDown) into failing whole runs. Three standard remedies, all here:
- exponential backoff with *full jitter* (Brooker, "Exponential Backoff And Jitter", 2015):
  sleep uniform(0, min(cap, base * 2**attempt)), which spreads retrying clients apart;
- a token bucket on bytes per second, so one checkpoint cannot saturate the link;
- a start offset of `rank * stagger_s`, so ranks do not all start transferring together.
"""

from __future__ import annotations

import errno
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from trainguard.findings import Finding

T = TypeVar("T")

# Errors that retrying cannot fix: wrong credentials, missing bucket, full disk.
_PERMANENT_ERRNOS = {
    errno.ENOSPC,
    errno.EFBIG,
    errno.EROFS,
    errno.EDQUOT,
    errno.EACCES,
    errno.EPERM,
    errno.ENAMETOOLONG,
    errno.EINVAL,
    errno.ENOTDIR,
    errno.EISDIR,
}
_PERMANENT_TYPES = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)


class VerifyMismatch(OSError):
    """An uploaded object differs from its source; uploading again usually fixes it."""


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: timeouts, dropped connections, throttling, EIO."""
    if isinstance(exc, TimeoutError | ConnectionError | VerifyMismatch):
        return True
    if isinstance(exc, _PERMANENT_TYPES):
        return False
    if isinstance(exc, OSError):
        return exc.errno not in _PERMANENT_ERRNOS
    try:  # botocore is only present with the s3 extra
        import botocore.exceptions as bce

        if isinstance(exc, bce.ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            return code in {"SlowDown", "ServiceUnavailable", "RequestTimeout", "500", "503"}
        if isinstance(exc, bce.BotoCoreError):
            # connection, read-timeout and endpoint errors; not credential or parameter errors
            return not isinstance(exc, bce.NoCredentialsError | bce.ParamValidationError)
    except ImportError:
        pass
    return False


@dataclass
class RetryPolicy:
    """How transfers to shared storage are retried, spread out and verified."""

    attempts: int = 5
    """Tries per operation before giving up with StorageError."""
    base_delay_s: float = 0.5
    """Backoff scale: the n-th retry sleeps uniform(0, min(max_delay_s, base_delay_s * 2**n))."""
    max_delay_s: float = 30.0
    """Cap on one backoff sleep."""
    stagger_s: float = 0.5
    """Rank r waits r * stagger_s before its first transfer of a save or load."""
    verify_checksums: bool = True
    """After an upload, read each object back and compare checksums (else sizes only)."""
    seed: int | None = None
    """Seed of the jitter RNG (tests); None: fresh entropy."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be >= 1")
        self._rng = random.Random(self.seed)

    def backoff(self, retry: int) -> float:
        """Full-jitter sleep before retry number `retry` (0-based)."""
        return self._rng.uniform(0.0, min(self.max_delay_s, self.base_delay_s * 2.0**retry))


class RetryStats:
    """Counts retries across one save or load, for the C203 finding."""

    def __init__(self) -> None:
        self.retries = 0
        self.mismatches = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def record(self, what: str, exc: BaseException) -> None:
        with self._lock:
            self.retries += 1
            if isinstance(exc, VerifyMismatch):
                self.mismatches += 1
            if len(self.errors) < 10:
                self.errors.append(f"{what}: {type(exc).__name__}: {exc}")

    def findings(self, step: int, what: str, where: str) -> list[Finding]:
        """C202 for re-uploads after a verification mismatch, C203 for any retries."""
        out = []
        if self.mismatches:
            out.append(
                Finding.of(
                    "C202",
                    f"{what} of step {step}: {self.mismatches} uploaded object(s) did not match "
                    "and were uploaded again",
                    step=step,
                    where=where,
                    data={"errors": [e for e in self.errors if "VerifyMismatch" in e]},
                )
            )
        if self.retries:
            out.append(
                Finding.of(
                    "C203",
                    f"{what} of step {step} needed {self.retries} retries",
                    step=step,
                    where=where,
                    data={"retries": self.retries, "errors": self.errors},
                )
            )
        return out


def retry_call(
    fn: Callable[[], T],
    policy: RetryPolicy,
    what: str,
    stats: RetryStats | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `fn` until it succeeds, retrying transient errors with full-jitter backoff.

    Permanent errors and the last transient one propagate unchanged; the caller turns them into
    a StorageError that names the operation.
    """
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc) or attempt == policy.attempts - 1:
                raise
            if stats is not None:
                stats.record(what, exc)
            sleep(policy.backoff(attempt))
    raise AssertionError("unreachable")  # the loop returns or raises


class TokenBucket:
    """Limits throughput to `rate` bytes/s on average, with bursts up to one second's worth.

    Thread-safe, so a background upload and a foreground download share one budget.
    """

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0:
            raise ValueError("rate_limit_bytes_per_s must be > 0")
        self.rate = float(rate)
        self.capacity = float(rate)  # one second of burst
        self._tokens = self.capacity
        self._clock, self._sleep = clock, sleep
        self._last = clock()
        self._lock = threading.Lock()

    def acquire(self, n: int) -> None:
        """Block until `n` bytes may pass. Large requests are paid in capacity-sized pieces."""
        remaining = float(n)
        while remaining > 0:
            piece = min(remaining, self.capacity)
            with self._lock:
                now = self._clock()
                self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
                self._last = now
                wait = 0.0 if self._tokens >= piece else (piece - self._tokens) / self.rate
                # Pay now (tokens may go negative): later callers queue behind this debt.
                self._tokens -= piece
            if wait > 0:
                self._sleep(wait)
            remaining -= piece
