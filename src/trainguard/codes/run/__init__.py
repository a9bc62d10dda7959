"""Run layer codes (R): what goes wrong while a run trains.

One file per range of numbers: R101-R199 in-run detectors (detectors.py); R201-R299 actions
and the hang watchdog (actions.py); R301-R399 multi-process hangs (hangs.py); R401-R499 fire
drills, and R619, a drill's documented blind spot (drills.py); R501-R509 reference curves: a run
compared with a known-good run of its recipe (reference.py); R601-R605 MoE router health and
data-loader stalls (moe_loader.py); R620-R629 the learning-rate schedule across resumes
(schedule.py); R701-R709 goodput planning (goodput.py).

A code is never reused or renumbered; a renamed one gets a redirect in `codes/__init__.py`
(REDIRECTS). `docs/codes.md` is generated from these entries.
"""

# Each file registers its range's codes on import.
from . import (  # noqa: F401
    actions,
    detectors,
    drills,
    goodput,
    hangs,
    moe_loader,
    reference,
    schedule,
)
