"""Checkpoint resume codes owned by the run orchestration (C150-C159). Never renumber."""

from trainguard.codes import Code, register

register(
    Code(
        code="C150",
        title="Resumed from a checkpoint",
        severity="info",
        catches="The run found a valid checkpoint in its run dir and continued from it.",
        why="Auto-resume is how a crashed or preempted run gets back without lost work; the "
        "finding records where it picked up so the metric log and report can be audited.",
        fix="Nothing to do. Start a fresh run with a new --run-dir if this was not intended.",
    ),
)
