"""The drill table: one small function per fault, every drill registered, and `run_drills`.

A drill takes a `DrillContext` (how to launch real runs at drill settings) and returns a
`DrillRow`. Adding one is a decorated function (`registry.py`); most are a fault plan
(`TRAINGUARD_INJECT`, see `faults.py`) plus the codes that must catch it:

    @drill("straggler", "one rank 0.2 s slower per step")
    def straggler(ctx):
        return guarded_drill(ctx, "straggler", f"slow@{ctx.plan.fault_step}/r1", ["H202"])
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from trainguard.drills.matrix import DrillRow
from trainguard.drills.registry import (
    DRILLS,
    actions_taken,
    drill,
    finish,
    guarded_drill,
    present,
    relaunch_drill,
)
from trainguard.drills.runner import DrillContext, RunOutcome
from trainguard.errors import BadInputError, ExitStatus
from trainguard.util.processes import check_local_processes


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
    saved = step + 1  # the checkpoint saved after step `step` holds step + 1 completed steps

    def flip_a_byte(out: RunOutcome) -> None:
        path = out.run_dir / "checkpoints" / f"step-{saved}" / "state.safetensors"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF  # inside the tensor payload: the file still parses
        path.write_bytes(bytes(data))

    # Killed as the next step starts, right after checkpoint `saved` was committed, so it is
    # the newest one.
    inject = f"kill@{step + 1}:data"
    row = relaunch_drill(
        ctx, "corrupt_checkpoint", inject, ["C101", "C102"], ("C150",), between=flip_a_byte
    )
    row.inject = f"{inject}, then a byte of step-{saved}/state.safetensors flipped"
    return row


@drill("hang", "hang in the forward pass")
def hang(ctx: DrillContext) -> DrillRow:
    from trainguard.guard.hang_report import read_hang_reports

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


# The other scenario modules' drills, registered here (and only here) after this module's, so
# that the table's order never depends on which module was imported first.
from trainguard.drills.doctor_scenarios import DOCTOR_DRILLS  # noqa: E402
from trainguard.drills.doctor_scenarios import PROCESSES as DOCTOR_PROCESSES  # noqa: E402
from trainguard.drills.multiproc_scenarios import MULTIPROC_DRILLS  # noqa: E402
from trainguard.drills.multiproc_scenarios import PROCESSES as MULTIPROC_PROCESSES  # noqa: E402
from trainguard.drills.reference_scenarios import REFERENCE_DRILLS  # noqa: E402

# In the order of the table (docs/drills.md's matrix follows it). A drill of several local
# processes says how many (`drill` counts them against the cores).
for _name, (_fault, _fn) in DOCTOR_DRILLS.items():
    drill(_name, _fault, DOCTOR_PROCESSES)(_fn)
for _name, (_fault, _fn) in REFERENCE_DRILLS.items():
    drill(_name, _fault)(_fn)
for _name, (_fault, _fn) in MULTIPROC_DRILLS.items():
    drill(_name, _fault, MULTIPROC_PROCESSES[_name])(_fn)


def run_drills(
    ctx: DrillContext, names: list[str] | None = None, jobs: int = 1, oversubscribe: bool = False
) -> list[DrillRow]:
    """Run the named drills (all by default), the clean one first in the table.

    Each drill's final loss is compared with the clean run's. `jobs` > 1 runs drills side by
    side (each drill's own runs stay sequential). Up to `jobs` times the largest drill's
    processes run at once: more than the machine holds is bad input unless `oversubscribe`.
    """
    names = list(names or DRILLS)
    unknown = [n for n in names if n not in DRILLS]
    if unknown:
        raise BadInputError(
            f"unknown drill(s) {unknown}", f"use names among {', '.join(DRILLS)} with --only"
        )
    from trainguard.config.load import load_recipe

    # Every drill runs this recipe with these settings: a missing recipe or a bad --set is bad
    # input (exit 2) here, not one failed drill per fault.
    load_recipe(ctx.recipe, ctx.settings())
    widest = max(DRILLS[n].processes for n in names)

    def fewer(fits: int) -> str:
        if fits >= widest:
            return f"use --jobs {fits // widest}"
        wide = [n for n in names if DRILLS[n].processes > fits]
        return f"leave out {', '.join(wide)} (--only the other drills)"

    check_local_processes(
        jobs * widest,
        f"--jobs {jobs}" + (f" with drills of {widest} processes" if widest > 1 else ""),
        fewer,
        oversubscribe,
    )
    # The clean run is the baseline of every loss comparison: always run it.
    if "clean" not in names:
        names.insert(0, "clean")
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        rows = list(pool.map(lambda n: DRILLS[n].run(ctx), names))
    clean = next(r for r in rows if r.name == "clean")
    for r in rows:
        r.compare_with(clean)
    return rows
