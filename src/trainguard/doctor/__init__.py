"""`trainguard doctor`: find the bad node before (or after) it costs a run.

Every rank tests itself against known answers in the recipe's dtype (compute, memory,
storage, environment, GPU health), the ranks test the collectives together, and rank 0
gathers every report and names the ranks that are wrong, slow or missing. It runs on its own
(`trainguard doctor`, `--nproc N`, or under an external torchrun) and before training
(`trainguard run --doctor`, recipe key `preflight.doctor`).

Modules: plan (sizes and timeouts), inject (`--inject KIND/rR`), report (a rank's answer),
compute, memory, storage, environment, nvml (the local checks), team (meeting through the
store with deadlines), collectives, outliers and fleet (rank 0's analysis), runner.
See docs/doctor.md.
"""

from __future__ import annotations

from trainguard.util.lazy import lazy_getattr

# Loaded on first use, as trainguard's own public names: every run imports
# `doctor.environment` (the software fingerprint, train/envinfo.py), and with it this package,
# but only `run --doctor` and `trainguard doctor` need the runner and the team.
_LAZY = {
    "DoctorPlan": "trainguard.doctor.plan",
    "DoctorReport": "trainguard.doctor.runner",
    "Injection": "trainguard.doctor.inject",
    "Team": "trainguard.doctor.team",
    "parse_rounds": "trainguard.doctor.inject",
    "plan_for": "trainguard.doctor.plan",
    "run_doctor": "trainguard.doctor.runner",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
