"""What one rank found: who it is, its findings, its figures and its timings.

A rank's report travels to rank 0 as JSON (through the process group's store), so everything
here is plain data.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainguard.doctor.inject import SLOW_FACTOR, Injection
from trainguard.doctor.plan import DoctorPlan, Sizes
from trainguard.findings import Finding


@dataclass(frozen=True)
class Who:
    """The rank a finding names: rank, host and device."""

    rank: int
    host: str
    device: str

    def finding(self, code: str, message: str, severity: str | None = None, **data: Any) -> Finding:
        """A finding of `code` naming this rank; `severity` overrides the registry's."""
        extra = {"severity": severity} if severity else {}
        return Finding.of(
            code,
            f"rank {self.rank} ({self.host}, {self.device}): {message}",
            rank=self.rank,
            where=self.host,
            data={"host": self.host, "device": self.device, **data},
            **extra,
        )


@dataclass
class LocalResult:
    """One local check's answer: findings, figures to show, timings to compare across ranks
    (seconds per fixed unit of work: larger is slower)."""

    findings: list[Finding] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def merge(self, other: LocalResult) -> None:
        self.findings += other.findings
        self.figures |= other.figures
        self.timings |= other.timings


MIN_TIMING_S = 0.01
"""The shortest work `Stopwatch.fastest` times at once."""


class Stopwatch:
    """Times work on a device: the process's CPU time on CPU (a rank that waits for a shared
    core is not blamed for it, a slower or throttled core is), synchronised wall time on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return time.perf_counter()
        return time.process_time()

    def time(self, fn: Callable[[], Any], repeat: int = 1) -> float:
        """Seconds for `repeat` calls of `fn`."""
        start = self.now()
        for _ in range(repeat):
            fn()
        return self.now() - start

    def fastest(self, fn: Callable[[], Any], reps: int, repeat: int = 1) -> float:
        """The fastest of `reps` timings of `repeat` calls: the intrinsic time, least touched by
        anything else running. Each timing covers at least `MIN_TIMING_S` of work (the calls
        repeated k times, the time divided by k): a healthy rank's 1-2 ms matmul or attention
        block, timed once per repetition, was once 2.1-2.7x the other rank's on a 2-core machine
        (a false H403); the 10 ms burn chunks never were."""
        once = self.time(fn, repeat)
        k = max(1, math.ceil(MIN_TIMING_S / max(once, 1e-9)))
        return min(self.time(fn, repeat * k) for _ in range(reps)) / k


@dataclass(frozen=True)
class RankContext:
    """What a local check needs: who runs it, on which device, with which plan and fault."""

    who: Who
    device: torch.device
    plan: DoctorPlan
    injection: Injection = field(default_factory=Injection)

    @property
    def sizes(self) -> Sizes:
        return self.plan.sizes(self.device)

    @property
    def dtype(self) -> torch.dtype:
        return self.plan.torch_dtype

    @property
    def stopwatch(self) -> Stopwatch:
        return Stopwatch(self.device)

    @property
    def slowdown(self) -> int:
        """How many times each timed computation runs (`slow/rR` on this rank: 3)."""
        return SLOW_FACTOR if self.injection.on("slow", self.who.rank) else 1

    def planted(self, kind: str) -> bool:
        return self.injection.on(kind, self.who.rank)
