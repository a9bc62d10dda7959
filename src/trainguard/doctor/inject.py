"""`--inject KIND/rR`: the faults the doctor must find, in the drills' rank syntax.

- `bitflip/rR`        rank R's matmul result has its top exponent bit flipped (a wrong result)
- `slow/rR`           rank R does every timed computation three times (a device 3x slower;
                      real work, not a sleep, so it shows in CPU time as a slow chip would)
- `bad-allreduce/rR`  rank R contributes a perturbed tensor to the all-reduce
- `hang/rR`           rank R (R >= 1) never joins: it sleeps instead of running the round, the
                      others time out at the barrier and name it
- `kill/rR`           rank R (R >= 1) SIGKILLs itself at the start of the round: named dead
                      (R302, with the signal), not hung
- `none`              a round without a fault (to loop clean and faulty rounds in one job)

Several `--inject` values run one round each, in one process group; a hang or a kill ends
the group, so it always runs last.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainguard.errors import BadInputError

KINDS = ("bitflip", "slow", "bad-allreduce", "hang", "kill")
ENDS_GROUP = ("hang", "kill")  # the round after which the group cannot meet again
SLOW_FACTOR = 3
_SYNTAX = re.compile(r"^(?P<kind>[a-z-]+)/r(?P<rank>\d+)$")


@dataclass(frozen=True)
class Injection:
    """One round's fault (kind None: a clean round)."""

    kind: str | None = None
    rank: int = -1

    @property
    def label(self) -> str:
        return "none" if self.kind is None else f"{self.kind}/r{self.rank}"

    def on(self, kind: str, rank: int) -> bool:
        """True when this round plants `kind` on `rank`."""
        return self.kind == kind and self.rank == rank


def parse_injection(text: str) -> Injection:
    """One `--inject` value; BadInputError naming the syntax for anything else."""
    value = text.strip()
    if value == "none":
        return Injection()
    m = _SYNTAX.match(value)
    if not m or m["kind"] not in KINDS:
        raise BadInputError(
            f"--inject {text!r} is not a fault the doctor knows",
            f"use KIND/rRANK with KIND one of {', '.join(KINDS)} (e.g. slow/r1), or none",
        )
    rank = int(m["rank"])
    if m["kind"] in ENDS_GROUP and rank == 0:
        kind = m["kind"]
        raise BadInputError(
            f"--inject {kind}/r0: rank 0 gathers and reports, it cannot be the one that "
            f"{'hangs' if kind == 'hang' else 'is killed'}",
            f"use {kind}/rR with R >= 1 (and --nproc 2 or more)",
        )
    return Injection(m["kind"], rank)


def parse_rounds(values: list[str] | None, world_size: int | None = None) -> list[Injection]:
    """The rounds to run: one per `--inject` value (one clean round without any), the hang
    last. `world_size`, when known, must hold every named rank."""
    rounds = [parse_injection(v) for v in values or []] or [Injection()]
    if world_size is not None:
        for inj in rounds:
            if inj.kind is not None and inj.rank >= world_size:
                raise BadInputError(
                    f"--inject {inj.label}: there is no rank {inj.rank} in a job of "
                    f"{world_size} process(es)",
                    f"name a rank below {world_size}, or run more processes (--nproc)",
                )
    hangs = [r for r in rounds if r.kind in ENDS_GROUP]
    if len(hangs) > 1:
        raise BadInputError(
            f"--inject: {len(hangs)} hang or kill rounds; a hung or dead rank ends the process "
            "group",
            "inject at most one hang/rR or kill/rR per run",
        )
    return [r for r in rounds if r.kind not in ENDS_GROUP] + hangs
