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

from trainguard.doctor.inject import Injection, parse_rounds
from trainguard.doctor.plan import DoctorPlan, plan_for
from trainguard.doctor.runner import DoctorReport, run_doctor
from trainguard.doctor.team import Team

__all__ = [
    "DoctorPlan",
    "DoctorReport",
    "Injection",
    "Team",
    "parse_rounds",
    "plan_for",
    "run_doctor",
]
