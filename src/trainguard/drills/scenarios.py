"""The drill registry: one small function per fault.

A drill takes a `DrillContext` (how to launch real runs at drill settings) and returns a
`DrillRow`. Adding one is a decorated function; most are a fault plan (`TRAINGUARD_INJECT`,
see `faults.py`) plus the codes that must catch it:

    @drill("straggler", "one rank 0.2 s slower per step")
    def straggler(ctx):
        return guarded_drill(ctx, "straggler", f"slow@{ctx.plan.fault_step}/r1", ["H202"])
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

from trainguard.drills.matrix import DrillRow
from trainguard.drills.runner import DrillContext, RunOutcome
from trainguard.errors import ExitStatus


@dataclass(frozen=True)
class Drill:
    name: str
    fault: str
    fn: Callable[[DrillContext], DrillRow]
    processes: int = 1
    """Local processes the drill runs at once (`trainguard run --nproc N`: N)."""

    def run(self, ctx: DrillContext) -> DrillRow:
        try:
            row = self.fn(ctx)
        except Exception as e:  # a broken drill is a failed row, not a crashed command
            row = DrillRow(self.name, self.fault, [], note=f"drill crashed: {e!r}")
        row.name, row.fault = self.name, self.fault
        return row


DRILLS: dict[str, Drill] = {}


def drill(
    name: str, fault: str, processes: int = 1
) -> Callable[[Callable[[DrillContext], DrillRow]], Drill]:
    """Register a drill under `name`; the table shows `fault` as its first column. A drill of
    several local processes says how many (`drill` counts them against the cores)."""

    def register(fn: Callable[[DrillContext], DrillRow]) -> Drill:
        DRILLS[name] = Drill(name, fault, fn, processes)
        return DRILLS[name]

    return register


# --- reading a run's outcome --------------------------------------------------------------------
def present(out: RunOutcome, codes: tuple[str, ...] | list[str]) -> list[str]:
    """The codes among `codes` that `out` reported, in order of first appearance."""
    seen: list[str] = []
    for c in out.codes():
        if c in codes and c not in seen:
            seen.append(c)
    return seen


def actions_taken(out: RunOutcome) -> tuple[str, int]:
    """A summary of the guard's actions, and the steps of work they threw away."""
    codes = out.codes()
    parts, lost = [], 0
    if (n := codes.count("R201")) > 0:
        parts.append(f"skipped {n} update{'s' * (n > 1)}")
        lost += n
    for ev in out.rows("event"):
        if ev.get("event") == "rollback":
            parts.append(f"rolled back {ev['from_step']}->{ev['to_step']}")
            lost += int(ev["from_step"]) - int(ev["to_step"])
    if "R203" in codes:
        parts.append("halted")
    if "R205" in codes:
        parts.append("rerun: hardware")
    elif "R206" in codes:
        parts.append("rerun: data/software")
    return "; ".join(parts), lost


def finish(row: DrillRow, out: RunOutcome, ctx: DrillContext) -> DrillRow:
    """Fill in whether the (last) run completed and its final loss."""
    row.finished = out.returncode == 0 and out.final_step == ctx.plan.max_steps
    row.final_loss = out.final_loss
    if not row.finished:
        row.note = (row.note + "; " if row.note else "") + (
            f"run exited {out.returncode} at step {out.final_step}: {out.tail()}"
        )
    return row


# --- the two drill shapes ---------------------------------------------------------------------
def guarded_drill(
    ctx: DrillContext,
    name: str,
    inject: str,
    expected: list[str],
    related: tuple[str, ...] = (),
    fault_step: int | None = None,
) -> DrillRow:
    """A fault the in-run guard must catch and act on, within one process."""
    fault_step = ctx.plan.fault_step if fault_step is None else fault_step
    out = ctx.launch(name, inject=inject)
    row = DrillRow(name, "", expected, inject=inject)
    row.detected = present(out, (*expected, *related))
    first = out.first_step(tuple(expected))
    row.steps_to_detect = None if first is None else first - fault_step
    row.action, row.steps_lost = actions_taken(out)
    return finish(row, out, ctx)


def relaunch_drill(
    ctx: DrillContext,
    name: str,
    inject: str,
    expected: list[str],
    related: tuple[str, ...] = (),
    exit_status: int = -signal.SIGKILL,
    between: Callable[[RunOutcome], None] | None = None,
) -> DrillRow:
    """A fault that ends the process: run with the fault, check it died as expected, let
    `between` tamper with what it left, then relaunch without the fault (the launcher's
    restart) and check that auto-resume brings the run to its end."""
    first = ctx.launch(name, inject=inject)
    row = DrillRow(name, "", expected, inject=inject)
    if first.returncode != exit_status:
        row.note = f"the faulty run exited {first.returncode}, expected {exit_status}"
        return finish(row, first, ctx)
    logged = first.last_logged_step()
    if between is not None:
        between(first)
    second = ctx.launch(name)
    row.detected = present(second, (*expected, *related))
    resumed = (second.payload or {}).get("resumed_from") or 0
    row.steps_to_detect = 0  # the crash is the detection: the launcher sees it at once
    row.steps_lost = max(0, logged - resumed)
    row.action = f"relaunch; auto-resume from step {resumed}"
    return finish(row, second, ctx)


# --- the drills ---------------------------------------------------------------------------------
@drill("clean", "none (clean run)")
def clean(ctx: DrillContext) -> DrillRow:
    out = ctx.launch("clean")
    row = DrillRow("clean", "", [])
    row.alarms = sorted({f["code"] for f in out.findings if f["severity"] in ("warning", "error")})
    row.weights = out.weights_checksum()  # what a blind-spot drill's weights are compared with
    row.action, row.steps_lost = actions_taken(out)
    return finish(row, out, ctx)


@drill("nan", "NaN batch")
def nan_batch(ctx: DrillContext) -> DrillRow:
    return guarded_drill(ctx, "nan", f"nan@{ctx.plan.fault_step}", ["R101"], ("R206",))


@drill("spike", "loss-spike batch (x50)")
def spike_batch(ctx: DrillContext) -> DrillRow:
    return guarded_drill(ctx, "spike", f"spike@{ctx.plan.fault_step}", ["R102"], ("R103", "R206"))


@drill("kill_step", "SIGKILL mid-step (backward)")
def kill_mid_step(ctx: DrillContext) -> DrillRow:
    step = ctx.plan.fault_step + ctx.plan.interval // 2
    return relaunch_drill(ctx, "kill_step", f"kill@{step}:backward", ["C150"], ("D110",))


@drill("kill_checkpoint", "SIGKILL mid-checkpoint-write")
def kill_mid_checkpoint(ctx: DrillContext) -> DrillRow:
    inject = f"kill@{ctx.plan.fault_step}:checkpoint_write"
    return relaunch_drill(ctx, "kill_checkpoint", inject, ["C150"], ("C104", "C107", "D110"))


@drill("corrupt_checkpoint", "corrupted checkpoint file")
def corrupt_checkpoint(ctx: DrillContext) -> DrillRow:
    step = ctx.plan.fault_step

    def flip_a_byte(out: RunOutcome) -> None:
        path = out.run_dir / "checkpoints" / f"step-{step}" / "model.safetensors"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF  # inside the tensor payload: the file still parses
        path.write_bytes(bytes(data))

    # Killed right after checkpoint `step` was committed, so it is the newest one.
    inject = f"kill@{step + 1}:data"
    row = relaunch_drill(
        ctx, "corrupt_checkpoint", inject, ["C101", "C102"], ("C150",), between=flip_a_byte
    )
    row.inject = f"{inject}, then a byte of step-{step}/model.safetensors flipped"
    return row


@drill("hang", "hang in the forward pass")
def hang(ctx: DrillContext) -> DrillRow:
    from trainguard.monitors.hang_report import read_hang_reports

    step = ctx.plan.fault_step + ctx.plan.interval // 2
    row = relaunch_drill(
        ctx, "hang", f"hang@{step}", ["R210"], ("C150",), exit_status=ExitStatus.HANG
    )
    reports = read_hang_reports(ctx.run_dir("hang"))
    if reports:
        row.detected = ["R210", *[c for c in row.detected if c != "R210"]]
        r = reports[0]
        row.action = f"stacks dumped, exit 3 ({r.where}, {r.data.get('elapsed_s')}s); " + row.action
    return row


@drill("bitflip", "bit flip in a weight's low mantissa, one process (silent corruption)")
def bitflip(ctx: DrillContext) -> DrillRow:
    """What one process cannot see. Mantissa bit 12 of a weight every token reads flips for one
    step: the loss moves inside its noise (no NaN, no spike), so no detector fires and the
    rerun check, which runs only after a NaN or a spike, never runs; with one process there is
    no second replica to compare (the `replica` drill's H201 needs 2+). The row passes when
    nothing claims to catch it and the final weights differ bitwise from the clean run's."""
    inject = f"bitflip@{ctx.plan.fault_step}"
    out = ctx.launch("bitflip", inject=inject)
    row = DrillRow("bitflip", "", [], inject=inject, blind=BLIND_ONE_PROCESS)
    row.detected = present(out, ("R101", "R102", "R103", "R104", "R205", "R206"))
    row.weights = out.weights_checksum()
    row.action = BLIND_ONE_PROCESS
    row.steps_lost = 0
    return finish(row, out, ctx)


BLIND_ONE_PROCESS = (
    "none: inside the loss noise (no NaN, no spike), so the rerun check (R205, run only after "
    "a NaN or spike) never runs, and one process has no replica to compare (H201 needs 2+)"
)


@drill("bitflip_exponent", "bit flip in a weight's top exponent bit (loud: NaN)")
def bitflip_exponent(ctx: DrillContext) -> DrillRow:
    """The flip one process can see: the exponent's top bit makes the weight ~1e37 and the loss
    NaN; the guard skips the update and the rerun (clean weights) says hardware (R205)."""
    inject = f"bitflip@{ctx.plan.fault_step}:exponent"
    return guarded_drill(ctx, "bitflip_exponent", inject, ["R205"], ("R101", "R102", "R103"))


@drill("shuffle", "poorly shuffled order (sequential)")
def poor_shuffle(ctx: DrillContext) -> DrillRow:
    import numpy as np

    from trainguard.checks.shuffle_quality import order_shuffle_quality, sequential_order
    from trainguard.config.load import load_recipe
    from trainguard.data.order import ElasticOrder
    from trainguard.data.prepare import prepare_data

    recipe = load_recipe(ctx.recipe, ctx.settings())
    data = prepare_data(recipe.data, recipe.tokenizer, progress=False)
    seq_len = recipe.data.seq_len
    n = int(data.train.num_samples(seq_len))

    class Sequential:  # a naive loader: files read in sequence, no shuffle
        def sample_ids(self, start: int, count: int) -> np.ndarray:
            return sequential_order(n)[start : start + count]

    bad, stats = order_shuffle_quality(data.train, Sequential(), seq_len)
    good, _ = order_shuffle_quality(data.train, ElasticOrder(n, recipe.train.seed), seq_len)
    row = DrillRow("shuffle", "", ["D301"], detected=[f.code for f in bad], trains=False)
    row.steps_to_detect = 0  # pre-flight: before the first step
    row.steps_lost = 0
    row.action = "pre-flight flags the order; trainguard's keyed permutation passes"
    row.finished = not good
    if good:
        row.note = "the keyed permutation was flagged too: " + "; ".join(str(f) for f in good)
    row.note = (row.note + "; " if row.note else "") + (
        f"mean chi2 ratio {stats.get('mean_chi2_ratio')} over {stats.get('windows')} windows"
    )
    return row


@drill("precision", "bf16 gradient all-reduce, 512 ranks")
def low_precision_reduction(ctx: DrillContext) -> DrillRow:
    from trainguard.checks.precision_reduction import check_reduction

    bad, audit = check_reduction("bf16", 512, "ring")
    good, fixed = check_reduction("bf16", 512, "fp32-accumulate")
    row = DrillRow("precision", "", ["N101"], detected=[f.code for f in bad], trains=False)
    row.steps_to_detect = 0  # pre-flight `check-precision`
    row.steps_lost = 0
    row.action = "fp32-accumulate reduction (the remedy) passes"
    row.finished = not good
    row.note = f"slope {audit.slope:.4f} in bf16 ring, {fixed.slope:.5f} with fp32 accumulation"
    return row


from trainguard.drills.doctor_scenarios import DOCTOR_DRILLS  # noqa: E402
from trainguard.drills.doctor_scenarios import PROCESSES as DOCTOR_PROCESSES  # noqa: E402
from trainguard.drills.reference_scenarios import REFERENCE_DRILLS  # noqa: E402

for _name, (_fault, _fn) in DOCTOR_DRILLS.items():
    drill(_name, _fault, DOCTOR_PROCESSES)(_fn)
for _name, (_fault, _fn) in REFERENCE_DRILLS.items():
    drill(_name, _fault)(_fn)
import trainguard.drills.multiproc_scenarios  # noqa: E402, F401  (registers the --nproc drills)
