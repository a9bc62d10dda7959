"""`trainguard plan`: the checkpoint interval that maximises goodput, its expected ETTR at N
GPUs, what the rest of the wall time goes to, and the simulation that checks the closed form.

`resolve_inputs` merges the flags with what a run dir measured (flags win) and says where each
number came from; `make_plan` is a pure function of those numbers and a seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.errors import BadInputError
from trainguard.findings import Finding
from trainguard.goodput import model, simulate
from trainguard.goodput.model import Costs, Expected

# A restart longer than this many job MTBFs almost never completes: ETTR is below exp(-3) = 5%,
# and the simulation would draw e^3 = 20 restart attempts per failure, more beyond.
MAX_RESTARTS_PER_MTBF = 3.0
YOUNG_DALY_SLACK = 1e-3  # ETTR Young/Daly's interval may lose before the model's optimum is used
SWEEP_OCTAVES = np.linspace(-3.0, 3.0, 13)  # the simulated intervals: 1/8x to 8x the plan's

FLAGS = {  # input name -> its flag, for messages
    "step_time_s": "--step-time",
    "checkpoint_stall_s": "--checkpoint-stall",
    "checkpoint_write_s": "--checkpoint-write",
    "restart_s": "--restart",
    "gpus": "--gpus",
    "gpu_mtbf_hours": "--gpu-mtbf-hours",
}


@dataclass(frozen=True)
class Input:
    value: float
    source: str  # "flag", "run", "assumed" or "default"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "source": self.source}
        if self.note:
            out["note"] = self.note
        return out


def _positive(name: str, value: float, unit: str = "seconds") -> float:
    if not math.isfinite(value) or value <= 0:
        raise BadInputError(
            f"{FLAGS[name]} {value:g} is not a positive number of {unit}",
            f"give {FLAGS[name]} a number above 0 (e.g. {FLAGS[name]} 1.5)",
        )
    return value


def resolve_inputs(
    flags: dict[str, float | None],
    measured: dict[str, tuple[float, str]],
    run_given: bool,
) -> dict[str, Input]:
    """Each input from its flag, else the run's measurement, else its default; BadInputError
    naming every number that is missing or out of range."""
    out: dict[str, Input] = {}
    for name in FLAGS:
        if flags.get(name) is not None:
            out[name] = Input(float(flags[name]), "flag")  # type: ignore[arg-type]
        elif name in measured:
            value, note = measured[name]
            out[name] = Input(float(value), "run", note)
    if "gpu_mtbf_hours" not in out:
        out["gpu_mtbf_hours"] = Input(model.LLAMA3_GPU_MTBF_HOURS, "default", model.LLAMA3_SOURCE)
    required = {
        "step_time_s": ("SECONDS", "no step row with a step_time_s"),
        "checkpoint_stall_s": ("SECONDS", "no checkpoint step followed by a timed step"),
        "restart_s": (
            "SECONDS",
            "no restart time (the run was never restarted, or its record has no timing rows)",
        ),
        "gpus": ("N", "no world size in a start event"),
    }
    missing = [n for n in required if n not in out]
    if missing:
        names = ", ".join(FLAGS[n] for n in missing)
        if run_given:
            lacks = "; ".join(required[n][1] for n in missing)
            problem = f"missing {names}: the run dir has {lacks}"
        else:
            problem = f"missing {names}: give them as flags, or --run to measure them"
        raise BadInputError(
            problem,
            "give "
            + " ".join(f"{FLAGS[n]} {required[n][0]}" for n in missing)
            + ("" if run_given else ", or --run RUN_DIR (a `trainguard run` dir)"),
        )
    if "checkpoint_write_s" not in out:
        out["checkpoint_write_s"] = Input(
            out["checkpoint_stall_s"].value,
            "assumed",
            "equal to the stall (a synchronous save, durable when the stall ends); give "
            "--checkpoint-write for an asynchronous save",
        )
    for name in ("step_time_s", "checkpoint_stall_s", "checkpoint_write_s", "restart_s"):
        _positive(name, out[name].value)
    _positive("gpu_mtbf_hours", out["gpu_mtbf_hours"].value, "hours")
    gpus = out["gpus"].value
    if not math.isfinite(gpus) or gpus < 1 or gpus != int(gpus):
        raise BadInputError(f"--gpus {gpus:g} is not a whole number >= 1", "give --gpus 1 or more")
    if out["checkpoint_write_s"].value < out["checkpoint_stall_s"].value:
        raise BadInputError(
            f"--checkpoint-write {out['checkpoint_write_s'].value:g} s is shorter than the "
            f"checkpoint stall {out['checkpoint_stall_s'].value:g} s: the write is counted "
            "from the save's start, so it includes the stall",
            "give --checkpoint-write at least the stall (equal for a synchronous save)",
        )
    return out


@dataclass
class Plan:
    costs: Costs
    gpus: int
    gpu_mtbf_hours: float
    mtbf_s: float
    young_steps: int
    daly_steps: int
    optimum_steps: int
    interval_steps: int
    interval_source: str
    expected: Expected
    simulated: list[simulate.Simulated] = field(default_factory=list)
    not_simulated: str = ""
    current: Expected | None = None

    @property
    def sim(self) -> simulate.Simulated | None:
        return next((s for s in self.simulated if s.interval_steps == self.interval_steps), None)

    def gpu_curve(self, gpus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ETTR against the number of GPUs: at each N's own optimum, and at this interval."""
        best, fixed = [], []
        for n in gpus:
            m = model.job_mtbf_s(self.gpu_mtbf_hours, int(n))
            best.append(model.expected_at(self.costs, model.best_interval(self.costs, m), m).ettr)
            fixed.append(model.expected_at(self.costs, self.interval_steps, m).ettr)
        return np.array(best), np.array(fixed)

    def to_dict(self) -> dict[str, Any]:
        e, sim = self.expected, self.sim
        out: dict[str, Any] = {
            "interval_steps": self.interval_steps,
            "interval_s": self.interval_steps * self.costs.step_s,
            "interval_source": self.interval_source,
            "ettr": e.ettr,
            "losses": e.losses,
            "dominant_loss": e.dominant,
            "job_mtbf_hours": self.mtbf_s / 3600.0,
            "young_daly": {
                "young_tau_s": model.young_tau_s(self.costs.stall_s, self.mtbf_s),
                "young_steps": self.young_steps,
                "daly_tau_s": model.daly_tau_s(self.costs.stall_s, self.mtbf_s),
                "daly_steps": self.daly_steps,
                "ettr": model.expected_at(self.costs, self.young_steps, self.mtbf_s).ettr,
            },
            "optimum_steps": self.optimum_steps,
            "current": None if self.current is None else _expected_dict(self.current),
        }
        if sim is None:
            out["simulation"] = {"skipped": self.not_simulated}
        else:
            best = max(self.simulated, key=lambda s: s.ettr)
            half = (sim.ci95[1] - sim.ci95[0]) / 2
            out["simulation"] = {
                **sim.to_dict(),
                # 4 standard errors: a closed form outside that is a bug, not bad luck.
                "agrees": abs(sim.ettr - e.ettr) <= 4 * half / simulate.Z95 + 1e-12,
                "best_interval_steps": best.interval_steps,
                "sweep": [s.to_dict(losses=False) for s in self.simulated],
            }
        return out


def _expected_dict(e: Expected) -> dict[str, Any]:
    return {"interval_steps": e.interval_steps, "ettr": e.ettr, "losses": e.losses}


def make_plan(
    inputs: dict[str, Input], *, seed: int, cycles: int, current_steps: int | None = None
) -> Plan:
    """The plan for `inputs` (from `resolve_inputs`); the simulation draws `cycles` failures."""
    costs = Costs(
        step_s=inputs["step_time_s"].value,
        stall_s=inputs["checkpoint_stall_s"].value,
        write_s=inputs["checkpoint_write_s"].value,
        restart_s=inputs["restart_s"].value,
    )
    gpus = int(inputs["gpus"].value)
    gpu_mtbf_hours = inputs["gpu_mtbf_hours"].value
    mtbf_s = model.job_mtbf_s(gpu_mtbf_hours, gpus)
    young = model.to_steps(model.young_tau_s(costs.stall_s, mtbf_s), costs.step_s)
    daly = model.to_steps(model.daly_tau_s(costs.stall_s, mtbf_s), costs.step_s)
    optimum = model.best_interval(costs, mtbf_s)
    at_young = model.expected_at(costs, young, mtbf_s)
    at_optimum = model.expected_at(costs, optimum, mtbf_s)
    if at_optimum.ettr - at_young.ettr < YOUNG_DALY_SLACK:
        chosen, source, expected = young, "young-daly", at_young
    else:
        chosen, source, expected = optimum, "model-optimum", at_optimum
    plan = Plan(
        costs=costs,
        gpus=gpus,
        gpu_mtbf_hours=gpu_mtbf_hours,
        mtbf_s=mtbf_s,
        young_steps=young,
        daly_steps=daly,
        optimum_steps=optimum,
        interval_steps=chosen,
        interval_source=source,
        expected=expected,
        current=None if current_steps is None else model.expected_at(costs, current_steps, mtbf_s),
    )
    if costs.restart_s / mtbf_s > MAX_RESTARTS_PER_MTBF:
        plan.not_simulated = (
            f"the restart ({costs.restart_s:g} s) is over {MAX_RESTARTS_PER_MTBF:g} job MTBFs "
            f"({mtbf_s:g} s): restarts almost never complete"
        )
        return plan
    draws = simulate.draw(costs, mtbf_s, cycles, seed)
    ks = np.round(chosen * 2.0**SWEEP_OCTAVES).astype(np.int64)
    intervals = sorted({int(k) for k in np.maximum(ks, 1)} | {chosen, young, optimum})
    plan.simulated = simulate.sweep(costs, intervals, draws)
    return plan


def plan_findings(plan: Plan) -> list[Finding]:
    out: list[Finding] = []
    c = plan.costs
    checked = {plan.interval_steps: "the plan's"}
    if plan.current is not None:
        checked.setdefault(plan.current.interval_steps, "the current")
    for k, whose in checked.items():
        T = k * c.step_s
        if c.write_s <= T + c.stall_s:
            continue
        out.append(
            Finding.of(
                "R701",
                f"the checkpoint write ({c.write_s:.4g} s) outlasts {whose} {k}-step "
                f"interval ({T:.4g} s of training + {c.stall_s:.4g} s stall): every save "
                f"waits {c.write_s - T - c.stall_s:.4g} s for the previous write",
                data={"interval_steps": k, "write_s": c.write_s, "interval_s": T},
            )
        )
    if plan.expected.ettr < 0.5:
        out.append(
            Finding.of(
                "R702",
                f"expected ETTR {plan.expected.ettr:.3f} at {plan.gpus} GPUs: the job fails "
                f"every {plan.mtbf_s / 3600:.3g} h on average, and "
                f"{plan.expected.dominant.replace('_', ' ')} takes the largest share",
                data={"ettr": plan.expected.ettr, "job_mtbf_hours": plan.mtbf_s / 3600},
            )
        )
    if plan.interval_source == "model-optimum":
        young = model.expected_at(c, plan.young_steps, plan.mtbf_s)
        out.append(
            Finding.of(
                "R703",
                f"Young/Daly's interval ({plan.young_steps} steps) gives ETTR "
                f"{young.ettr:.4f}; the model's optimum ({k} steps) gives "
                f"{plan.expected.ettr:.4f}",
                data={"young_steps": plan.young_steps, "optimum_steps": k},
            )
        )
    return out


def out_paths(out_dir: Path) -> dict[str, Path]:
    """The plots `--out DIR` writes."""
    return {
        "ettr_vs_gpus": out_dir / "ettr_vs_gpus.png",
        "ettr_vs_interval": out_dir / "ettr_vs_interval.png",
    }
