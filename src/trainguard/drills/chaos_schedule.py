"""The fault schedule of a chaos soak (`trainguard drill --chaos`): seeded, a function of the seed,
the round, the run's length and checkpoint interval, the fault count and kinds; nothing else.

Each fault lands where the run can recover from it, as it would in a real job:
- `kill` (SIGKILL of the job mid-step) after the first checkpoint: a job killed before it has
  none, and its relaunch refuses to start over (C107);
- `corrupt` (the job killed, then a byte of the newest checkpoint's weights flipped) once two
  checkpoints exist, so that the resume has one to fall back to (C101/C102);
- `hang` (a forward pass that never returns: the hang watchdog exits 3) neither in the first
  step after a checkpoint nor after a resume, whose larger start-up floor would slow it;
- `nan` (a NaN batch: the guard skips its update, R101) anywhere after the first step.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from trainguard.errors import BadInputError

KINDS = {
    "kill": "SIGKILL of the job mid-step (of every rank)",
    "corrupt": "the newest checkpoint corrupted (the job killed, a byte of its weights flipped)",
    "hang": "a hang in the forward pass (the watchdog stops the job, exit 3)",
    "nan": "a NaN batch (the guard skips its update)",
    "rank_kill": "SIGKILL of rank 1 mid-step (--nproc 2 or more)",
    "hung_rank": "rank 1 sleeps in a forward pass while the others wait (--nproc 2 or more)",
    "slow_rank": "rank 1 computes slower from a step on (--nproc 2 or more)",
}
PROCESS_KINDS = ("kill", "corrupt", "hang", "rank_kill", "hung_rank")  # the job ends: relaunch
RANK_KINDS = ("rank_kill", "hung_rank", "slow_rank")  # on rank 1: need several processes
HANGS = ("hang", "hung_rank")  # the job exits 3 for them; the others end it with a kill
DEFAULT_KINDS = ("kill", "corrupt", "hang", "nan")
# With several processes the single-process hang waits out a 30 s floor (the multi-process
# drills' watchdog floor); a hung rank is the collective's timeout instead.
DEFAULT_KINDS_NPROC = ("kill", "corrupt", "nan", "rank_kill", "hung_rank", "slow_rank")
DETECTED_BY = {
    "kill": (),
    "corrupt": ("C101", "C102"),
    "hang": ("R210",),
    "nan": ("R101",),
    "rank_kill": ("R302",),
    "hung_rank": ("R301",),
    "slow_rank": ("H202",),
}

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(s|sec|m|min|h)?")
_UNIT = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int  # the step the fault lands in (as the run's step rows number it)

    @property
    def inject(self) -> str:
        """Its TRAINGUARD_INJECT item (faults.py)."""
        return {
            "kill": f"kill@{self.step}:backward",
            "corrupt": f"kill@{self.step}:data",  # the kill waits for the writes: all committed
            "hang": f"hang@{self.step}",
            "nan": f"nan@{self.step}",
            "rank_kill": f"kill@{self.step}:backward/r1",
            "hung_rank": f"sleep@{self.step}/r1",
            "slow_rank": f"slow@{self.step}/r1",
        }[self.kind]

    @property
    def label(self) -> str:
        return f"{self.kind}@{self.step}"

    @property
    def ends_process(self) -> bool:
        return self.kind in PROCESS_KINDS

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "step": self.step, "label": self.label, "inject": self.inject}


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "10m", "1.5h"; BadInputError for anything else or zero."""
    m = _DURATION.fullmatch(text.strip().lower())
    seconds = float(m.group(1)) * _UNIT[m.group(2)] if m else 0.0
    if not m or not seconds > 0:
        raise BadInputError(
            f"--chaos {text!r} is not a duration",
            "give the soak's length as a positive number with a unit: 90s, 10m or 2h",
        )
    return seconds


def parse_kinds(values: list[str] | None, nproc: int = 1) -> tuple[str, ...]:
    """The fault kinds to draw from (each --fault-kind may list several, comma-separated)."""
    if not values:
        return DEFAULT_KINDS if nproc < 2 else DEFAULT_KINDS_NPROC
    kinds = [k.strip() for v in values for k in v.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise BadInputError(
            f"--fault-kind {', '.join(unknown) or '(empty)'}: not a chaos fault kind",
            f"choose among {', '.join(KINDS)} (comma-separated or repeated)",
        )
    ranked = [k for k in kinds if k in RANK_KINDS]
    if ranked and nproc < 2:
        raise BadInputError(
            f"--fault-kind {', '.join(ranked)} needs a job of several processes",
            "add --nproc 2 (the fault lands on rank 1), or choose kill, corrupt, hang or nan",
        )
    return tuple(dict.fromkeys(kinds))


def _candidates(kind: str, steps: int, interval: int) -> list[int]:
    last = steps - 1  # the last step ends the run: a fault there leaves nothing to watch
    if kind == "kill":
        return list(range(interval + 1, last + 1))
    if kind == "corrupt":
        return list(range(2 * interval + 1, last + 1))
    if kind in HANGS:
        return [s for s in range(interval + 2, last + 1) if s % interval not in (0, 1)]
    if kind == "rank_kill":
        return list(range(interval + 1, last + 1))
    return list(range(2, last + 1))  # nan


def check_room(steps: int, interval: int, count: int, kinds: tuple[str, ...]) -> None:
    """BadInputError when `count` faults of `kinds` do not fit a run of `steps` steps."""
    room: set[int] = set()
    for kind in kinds:
        if kind != "slow_rank":  # one at most: it lasts from its step on
            room |= set(_candidates(kind, steps, interval))
    size = len(room) + ("slow_rank" in kinds)
    if size < count or not all(_candidates(k, steps, interval) for k in kinds):
        raise BadInputError(
            f"{count} faults of {', '.join(kinds)} do not fit a run of {steps} steps that saves "
            f"every {interval}: a kill needs a checkpoint before it, a corrupted checkpoint two",
            "give more --steps, fewer --faults, or other --fault-kind",
        )


def schedule(
    seed: int, round_no: int, steps: int, interval: int, count: int, kinds: tuple[str, ...]
) -> list[Fault]:
    """`count` faults at distinct steps, kinds drawn uniformly, in step order. The same
    arguments give the same schedule on every machine (a string seed: SHA-512 in `random`)."""
    check_room(steps, interval, count, kinds)
    rng = random.Random(f"trainguard-chaos:{seed}:{round_no}")
    used: set[int] = set()
    faults = []
    while len(faults) < count and kinds:
        kind = rng.choice(kinds)
        free = [s for s in _candidates(kind, steps, interval) if s not in used]
        if not free:
            kinds = tuple(k for k in kinds if k != kind)  # this kind has no room left
            continue
        step = rng.choice(free)
        used.add(step)
        faults.append(Fault(kind, step))
        if kind == "slow_rank":  # slow from its step on: a second one would change nothing
            kinds = tuple(k for k in kinds if k != kind)
    return sorted(faults, key=lambda f: f.step)
