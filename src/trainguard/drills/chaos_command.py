"""The command of a soak of a user's command (`trainguard drill --chaos D --command "..."`,
drills/chaos_external.py): its words, the processes it starts, and the fault kinds it can
take, each refused with its fix before anything starts."""

from __future__ import annotations

import re
import shlex

from trainguard.drills.chaos_schedule import RANK_KINDS, parse_kinds
from trainguard.errors import BadInputError

RUN_DIR = "{run_dir}"
COMMAND_KINDS = ("kill", "corrupt", "rank_kill", "hung_rank", "slow_rank")
INSIDE_ONLY = ("nan", "hang")  # need a hook inside the loop
_NPROC = re.compile(r"--nproc[-_]per[-_]node(?:=(.*))?")


def parse_command(text: str) -> list[str]:
    """The command's words (shlex, as a shell splits them; it runs without a shell)."""
    example = 'e.g. --command "torchrun --nproc-per-node 2 train.py --out {run_dir}"'
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise BadInputError(
            f"--command {text!r} cannot be split into words ({e})", f"close its quotes; {example}"
        ) from None
    if not argv:
        raise BadInputError("--command is empty", f"give the training command to soak, {example}")
    if not any(RUN_DIR in a for a in argv):
        raise BadInputError(
            f"--command {text!r} has no {RUN_DIR}: the reference run and the soak runs would "
            "write one folder",
            f"put {RUN_DIR} where the command takes its output folder (its Guard's run_dir and "
            f"its checkpoints), {example}; each run gets its own",
        )
    return argv


def command_nproc(argv: list[str]) -> int | None:
    """The processes the command's launcher starts (torchrun's --nproc-per-node N); None when
    the command does not say (no such option, or "auto")."""
    for i, word in enumerate(argv):
        if m := _NPROC.fullmatch(word):
            value = m.group(1) if m.group(1) is not None else " ".join(argv[i + 1 : i + 2])
            return int(value) if value.isdigit() else None
    return None


def command_kinds(values: list[str] | None, argv: list[str]) -> tuple[str, ...]:
    """The fault kinds to draw from for `argv`: `nan` and `hang` refused; a rank kind needs a
    command of several processes (checked again against the reference run's world size)."""
    nproc = command_nproc(argv)
    several = nproc is None or nproc >= 2
    if not values:
        return COMMAND_KINDS if nproc is not None and nproc >= 2 else ("kill", "corrupt")
    kinds = parse_kinds(values, nproc=2)  # unknown names, as for `trainguard run`
    inside = [k for k in kinds if k in INSIDE_ONLY]
    if inside:
        raise BadInputError(
            f"--fault-kind {', '.join(inside)} cannot be injected into a --command: a NaN batch "
            "and a one-process hang need a hook inside the loop, and a command's faults are "
            "sent from outside (signals)",
            f"choose among {', '.join(COMMAND_KINDS)}; or soak `trainguard run` (drop "
            "--command) for nan and hang",
        )
    ranked = [k for k in kinds if k in RANK_KINDS]
    if ranked and not several:
        raise BadInputError(
            f"--fault-kind {', '.join(ranked)} needs a command of several processes, and "
            f"--command starts {nproc} (--nproc-per-node)",
            "launch it with torchrun --nproc-per-node 2 or more (the fault lands on rank 1), "
            "or choose kill or corrupt",
        )
    return kinds
