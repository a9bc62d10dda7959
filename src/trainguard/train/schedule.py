"""Learning-rate schedule: linear warm-up, then cosine decay to lr * min_lr_ratio, and what a
resume with a larger `train.max_steps` appends to it (`train.schedule_on_extend`).

The schedule is a list of segments over 0-based optimizer steps. A run that is never extended
has one, the cosine of its recipe (`lr_at`, unchanged: bitwise resume stays exact). Resuming
with a larger `train.max_steps` keeps that decay where it was planned and appends a segment up
to the new end: `constant` holds the LR of the last planned step, `rewarm` climbs back from it
to the peak over `warmup_steps` and decays by cosine to the new end. The segments travel in
the checkpoints (`trainer.json`), so later resumes and rollbacks keep them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainguard.errors import ConfigError
from trainguard.findings import Finding

SEGMENT_KINDS = ("cosine", "constant", "rewarm")


def lr_at(
    step: int, peak_lr: float, warmup_steps: int, max_steps: int, min_lr_ratio: float
) -> float:
    """The learning rate for optimizer step `step` (0-based).

    A pure function of the step, so a resumed run needs no scheduler state.
    """
    min_lr = peak_lr * min_lr_ratio
    if warmup_steps > 0 and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    if step >= max_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class Segment:
    """Steps [start, end) (0-based) of one `kind` of SEGMENT_KINDS."""

    start: int
    end: int
    kind: str

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "kind": self.kind}


class LrSchedule:
    """The LR factor (of each group's peak) at every step: segments of SEGMENT_KINDS."""

    def __init__(self, warmup_steps: int, min_lr_ratio: float, segments: list[Segment]) -> None:
        self.warmup_steps = warmup_steps
        self.min_lr_ratio = min_lr_ratio
        self.segments = list(segments)

    @classmethod
    def planned(cls, warmup_steps: int, min_lr_ratio: float, max_steps: int) -> LrSchedule:
        """The recipe's schedule: warm-up and cosine to `max_steps`."""
        return cls(warmup_steps, min_lr_ratio, [Segment(0, max_steps, "cosine")])

    @classmethod
    def from_list(cls, warmup_steps: int, min_lr_ratio: float, doc: Any) -> LrSchedule:
        """Segments as `to_list` wrote them; ValueError when they are not."""
        if not isinstance(doc, list) or not doc:
            raise ValueError("schedule is not a non-empty list of segments")
        segments = []
        for s in doc:
            ok = isinstance(s, dict) and s.get("kind") in SEGMENT_KINDS
            bounds = [s.get("start"), s.get("end")] if ok else []
            if not ok or not all(type(x) is int and x >= 0 for x in bounds):
                raise ValueError(f"schedule segment {s!r} is not {{start, end, kind}}")
            segments.append(Segment(s["start"], s["end"], s["kind"]))
        pairs = zip(segments, segments[1:], strict=False)
        chained = all(a.end == b.start < b.end for a, b in pairs)
        if segments[0].start != 0 or segments[0].kind != "cosine" or not chained:
            raise ValueError("schedule segments do not start with the cosine and chain up")
        return cls(warmup_steps, min_lr_ratio, segments)

    def to_list(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.segments]

    @property
    def end(self) -> int:
        """The step (count) where the schedule's last segment ends."""
        return self.segments[-1].end

    def factor(self, step: int) -> float:
        """The LR factor of optimizer step `step` (0-based)."""
        w, r = self.warmup_steps, self.min_lr_ratio
        base = self.segments[0]
        if step < base.end or len(self.segments) == 1:
            return lr_at(step, 1.0, w, base.end, r)
        seg = next((s for s in self.segments if s.start <= step < s.end), None)
        if seg is None:  # past the end: hold the last step's value
            return self.factor(self.end - 1)
        before = self.factor(seg.start - 1)  # the LR the segment continues from
        if seg.kind == "constant":
            return before
        k, n = step - seg.start, seg.end - seg.start  # rewarm: climb back, then decay
        warm = min(w, n)
        if k < warm:
            return before + (1.0 - before) * (k + 1) / warm
        progress = (k - warm) / max(1, n - warm)
        return r + 0.5 * (1.0 - r) * (1.0 + math.cos(math.pi * progress))

    def extended(self, max_steps: int, kind: str) -> LrSchedule:
        """This schedule with a `kind` segment appended up to `max_steps` (itself when it
        reaches that far already)."""
        if max_steps <= self.end:
            return self
        added = Segment(self.end, max_steps, kind)
        return LrSchedule(self.warmup_steps, self.min_lr_ratio, [*self.segments, added])


def resumed_schedule(
    train: Any, step: int, saved: list[dict[str, Any]] | None, planned_max_steps: int | None
) -> tuple[LrSchedule, list[Finding]]:
    """The schedule a run resumed at checkpoint `step` trains on, and R620 when
    `train.max_steps` changed since that checkpoint. `train` is the recipe's TrainConfig;
    `saved` the checkpoint's segments (None for one written before they were saved, whose
    plan was `planned_max_steps`, its recipe's max_steps). ConfigError (exit 2) when
    `train.max_steps` is below `step`."""
    t = train
    if t.max_steps < step:
        raise ConfigError(
            f"train.max_steps={t.max_steps} is below the step of the checkpoint this run "
            f"resumes from ({step}): the run cannot go back in steps",
            f"set train.max_steps to {step} or more (the checkpoint's step; more to train on), "
            "or start a new run with --run-dir NEW_DIR or --fresh",
        )
    if saved:
        before = LrSchedule.from_list(t.warmup_steps, t.min_lr_ratio, saved)
    else:
        end = planned_max_steps if planned_max_steps is not None else t.max_steps
        before = LrSchedule.planned(t.warmup_steps, t.min_lr_ratio, end)
    after = before.extended(t.max_steps, t.schedule_on_extend)
    if t.max_steps == before.end:
        return after, []
    lr_before, lr_next = t.lr * before.factor(step - 1), t.lr * after.factor(step)
    if t.max_steps > before.end:
        what = (
            f"the schedule keeps its decay to step {before.end} and appends a "
            f"{t.schedule_on_extend} segment for steps {before.end + 1}-{t.max_steps} "
            f"(train.schedule_on_extend={t.schedule_on_extend})"
        )
    else:
        what = (
            f"the schedule keeps its decay planned to step {before.end}: the run stops at "
            f"step {t.max_steps} at lr {t.lr * after.factor(t.max_steps - 1):.4g}, above "
            "the decay's end"
        )
    finding = Finding.of(
        "R620",
        f"train.max_steps changed on resume from checkpoint step {step}: {before.end} -> "
        f"{t.max_steps}; {what}; lr of step {step} {lr_before:.6g}, of step {step + 1} "
        f"{lr_next:.6g}",
        step=step,
        data={
            "from_max_steps": before.end,
            "to_max_steps": t.max_steps,
            "schedule_on_extend": t.schedule_on_extend,
            "lr_before": lr_before,
            "lr_after": lr_next,
            "segments": after.to_list(),
        },
    )
    return after, [finding]
