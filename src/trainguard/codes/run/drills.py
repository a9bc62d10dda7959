"""Run codes R401-R499: fire drills (`trainguard drill`) whose fault was missed, and R619, a
drill's documented blind spot.
"""

from trainguard.codes import Code, register

register(
    Code(
        code="R401",
        title="Fire drill: the injected fault was not detected",
        severity="error",
        catches="A drill injected a fault into a real run and none of the codes that should "
        "catch it appeared.",
        why="A guard that misses a drilled fault will miss the real one: the run goes on with a "
        "poisoned update, a corrupt weight or a stuck process, and nobody is told.",
        fix="Read the drill's run dir (kept with --keep): its metrics.jsonl shows what the "
        "detectors saw. Tune the guards section of the recipe (thresholds, actions) or fix the "
        "detector.",
        false_positives="A fault that truly has no effect (a bit flip in a weight the step "
        "never reads) cannot be detected; the drills inject faults that always matter.",
        references=("docs/drills.md",),
    ),
    Code(
        code="R402",
        title="Fire drill: the run did not recover from the injected fault",
        severity="error",
        catches="After the fault (and a relaunch where the drill needs one, as a launcher "
        "would do), the run did not finish all its steps, or its final validation loss is "
        "far from the clean run's.",
        why="Detection without recovery still loses the run: a rollback loop, a resume from the "
        "wrong step or a corrupt checkpoint chosen over a good one.",
        fix="Read the drill's run dir (kept with --keep) and the row's note; check the actions "
        "(guards.actions, guards.max_rollbacks) and the checkpoint interval.",
        false_positives="A recipe whose final loss is very noisy at drill settings can differ "
        "from the clean run by more than the tolerance after a skipped batch.",
        references=("docs/drills.md",),
    ),
    Code(
        code="R403",
        title="Fire drill: the clean run raised an alarm",
        severity="error",
        catches="The drill's fault-free run produced a warning or error finding.",
        why="False alarms train people to ignore the guards, and an action taken on a false "
        "alarm (a skipped or rolled-back step) costs work for nothing.",
        fix="Look at the finding: a real event at drill settings (an early gradient spike at a "
        "high learning rate) is fixed by the recipe; a false alarm by the detector's thresholds.",
        false_positives="Early training at a high learning rate has real gradient-norm spikes; "
        "the drill settings use a gentler schedule for that reason.",
        references=("docs/drills.md",),
    ),
    Code(
        code="R619",
        title="Fire drill: a documented blind spot did not behave as documented",
        severity="error",
        catches="A drill that demonstrates what the guards cannot see (a low mantissa bit "
        "flipped in one process's weight) either raised a code that claims to catch it, or "
        "left the final weights bitwise equal to the clean run's (the fault never took "
        "effect, so the row proves nothing).",
        why="The drill matrix states what one process can and cannot see. If a detector starts "
        "to fire on the blind-spot fault, or the fault stops landing, the documented limitation "
        "is no longer true and docs/drills.md would mislead.",
        fix="If a code now catches the fault, turn the drill into a detection drill (expected "
        "codes, recovery) and update the drill matrix in docs/drills.md; if the fault did not "
        "land, check that the flipped weight is still read by every step "
        "(faults.py).",
        false_positives="None known: the clean run and the drill run are bitwise deterministic "
        "on CPU, so equal weights mean the fault had no effect.",
        references=("docs/drills.md",),
    ),
)
