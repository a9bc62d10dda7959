"""`trainguard run`: prepare data -> pre-flight -> guarded training with verified checkpoints
and auto-resume -> evaluation -> report.

This module composes the run from its parts and is imported by nothing in `train/` (the CLI,
`scale run` and the public `trainguard.run_recipe` call it):

    ElasticSampler        the data order, skipped ranges after a rollback, batch hashes
    Checkpointer          verified checkpoints in the format every loop gets (run_state.py)
    Guard                 the detectors and their actions, with its DistributedGuards part
    StepMath              the arithmetic of a step and of an evaluation (train/compute.py)
    callbacks             pre-flight, the resume's record, step rows, the multi-process
                          guards' wiring, the hang watchdog, validation loss, use-case evals,
                          the drills' faults, and the user's own (`run_recipe(callbacks=...)`)

and `train/spine.py` runs them: `train_step` is one step, top to bottom.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from trainguard.config.load import recipe_to_dict
from trainguard.config.schema import Recipe
from trainguard.data.prepare import prepare_data
from trainguard.faults import FaultPlan
from trainguard.findings import Finding
from trainguard.metrics.sinks import open_run_sinks
from trainguard.model.gpt import GPT
from trainguard.reference.select import select_reference
from trainguard.train import refusals, rundir
from trainguard.train.callback import Callback, RunContext
from trainguard.train.callbacks.preflight import doctor_preflight, stop_on_errors
from trainguard.train.callbacks.runfiles import RunFilesCallback
from trainguard.train.callbacks.validation import ValidationCallback
from trainguard.train.callbacks.watchdog import WatchdogCallback
from trainguard.train.compose import compose
from trainguard.train.envinfo import environment_fingerprint
from trainguard.train.loop import Loop
from trainguard.train.optim import build_optimizer
from trainguard.train.outcome import RunResult, close_run, hang_outcome
from trainguard.train.progress import ProgressDisplay
from trainguard.train.run_state import RunState
from trainguard.train.spine import train
from trainguard.train.start import (
    checkpoint_root,
    load_or_refuse,
    open_checkpointer,
    probe_store,
    refuse_changed_data,
    resumed_findings,
    schedule_to_resume,
    start_fresh,
)
from trainguard.train.world import Dist, init_distributed

__all__ = ["run_recipe"]


def set_determinism(recipe: Recipe) -> None:
    """Same recipe and seed give bitwise the same weights on CPU."""
    if recipe.train.threads:
        torch.set_num_threads(recipe.train.threads)
    use_deterministic_algorithms()
    torch.manual_seed(recipe.train.seed)


def use_deterministic_algorithms() -> None:
    """`torch.use_deterministic_algorithms(True, warn_only=True)` without importing Inductor.

    The torch function also sets Inductor's `deterministic` flag, and importing Inductor (with
    dynamo) takes as long as `import torch` itself: a third of a restart. The run never
    compiles, so the flag is set the way Inductor reads it when it is first imported (the
    environment variable), or directly when something already imported it."""
    if "torch._inductor.config" in sys.modules or not hasattr(
        torch._C, "_set_deterministic_algorithms"
    ):
        torch.use_deterministic_algorithms(True, warn_only=True)
        return
    os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1"
    torch._C._set_deterministic_algorithms(True, warn_only=True)


def build_model(recipe: Recipe, vocab_size: int, device: torch.device) -> GPT:
    torch.manual_seed(recipe.train.seed)  # initialisation depends on the seed alone
    return GPT(recipe.model, vocab_size=vocab_size, seq_len=recipe.data.seq_len).to(device)


class Run:
    """One invocation of `trainguard run`: builds the parts, restores, trains, closes."""

    def __init__(
        self,
        recipe: Recipe,
        run_dir: Path,
        dist: Dist,
        *,
        progress: bool = True,
        faults: FaultPlan | None = None,
        evals: bool = True,
        accept_data_change: bool = False,
        on_end: Callable[[RunResult], None] | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        """`callbacks`: more callbacks beside the run's own (tests, tools embedding a run)."""
        self.recipe, self.run_dir, self.dist = recipe, Path(run_dir), dist
        self.extra_callbacks = list(callbacks)
        self.recipe_dict = recipe_to_dict(recipe)
        self.faults = faults if faults is not None else FaultPlan.from_env()
        self.evals = evals
        if evals:  # evaluation first: a recipe without a use-case eval is refused at once
            from trainguard.evals.spec import require_use_case_eval

            require_use_case_eval(recipe.evals)
        self.accept_data_change, self.on_end = accept_data_change, on_end
        self.env = environment_fingerprint()
        # Before any expensive work: an unreadable reference, or another recipe's, is exit 2.
        self.reference = select_reference(self.recipe_dict)
        self.resumed_from: int | None = None
        self.begun = False  # the run dir was written to (`_begin`): no refusal after that
        self.held: list[Finding] = []  # findings of a run not begun: its result lists them
        self.loop: Loop | None = None
        self.validation: ValidationCallback | None = None
        self.watchdog: WatchdogCallback | None = None
        t, world = recipe.train, dist.world
        self.ctx = RunContext(
            recipe,
            self.run_dir,
            world,
            dist.device,
            # metrics.jsonl plus the recipe's viewers (TensorBoard, W&B): every row to each.
            metrics=open_run_sinks(self.run_dir, recipe.metrics),
            display=ProgressDisplay(t.max_steps, t.log_interval, progress and world.rank == 0),
            progress=RunState(),
        )

    # -- building ---------------------------------------------------------------------------
    def setup(self, fresh: bool = False) -> None:
        """Everything up to the first step. The run dir is proven writable and locked.

        Every check that can refuse the run (the recipe, the doctor, the store, the checkpoint
        and its data, the schedule, the paths the run will write) comes before its first
        write (`_begin`): a refused run leaves the run dir as it found it. recipe.yaml and
        tokenizer.json are written once pre-flight passed (`RunFilesCallback`)."""
        r, ctx, dist = self.recipe, self.ctx, self.dist
        held = self.held  # found before the first write; logged by `_begin`
        if fresh:  # rank 0 sets the previous run aside; no rank looks at it before that
            refusals.on_main(dist, lambda: held.extend(start_fresh(r, self.run_dir)))
        rundir.check_resume_recipe(self.run_dir, self.recipe_dict)
        doctor: dict[str, Any] | None = None
        if r.preflight.doctor:  # first: a bad node is found before anything is spent
            found, doctor = doctor_preflight(r, self.run_dir, dist)
            held += found
            if any(f.severity == "error" for f in found) and r.preflight.fail_on_error:
                # The doctor's verdict is the run's record (its findings and event are logged,
                # as pre-flight's are); nothing else was written.
                self._begin(doctor)
            stop_on_errors(found, r)
        # A local checkpoint folder that is gone is checked before opening one creates it.
        root = checkpoint_root(r, self.run_dir)
        refusals.on_main(dist, lambda: refusals.refuse_missing_root(self.run_dir, root))
        checkpointer = open_checkpointer(r, self.run_dir, self._checkpoint_phase)
        probe_store(checkpointer, checkpointer.root)
        set_determinism(r)
        self.env["torch_threads"] = torch.get_num_threads()  # train.threads, now applied
        data = prepare_data(r.data, r.tokenizer, progress=ctx.display.enabled)
        ctx.model = model = build_model(r, data.vocab_size, ctx.device)
        ctx.optimizer = build_optimizer(r, model)
        parts = compose(
            ctx,
            dist,
            data,
            checkpointer,
            faults=self.faults,
            evals=self.evals,
            env=self.env,
            reference=self.reference,
            on_hang=self._hang_diagnosed,
            on_timeout=self._hang_reported,
            extra=[
                RunFilesCallback(self.recipe_dict, data.tokenizer_path, _samples(r, data)),
                *self.extra_callbacks,
            ],
        )
        loop, self.loop = parts.loop, parts.loop
        self.validation, self.watchdog = parts.validation, parts.watchdog
        # C107: none of them can be used; exit 2 for a step of the earlier format
        step = load_or_refuse(checkpointer, loop.state, self.run_dir)
        if step is not None:  # D104: the checkpoint's data is not the data prepared now
            meta, prepared = checkpointer.last_meta, loop.checkpoint_meta["data_identity"]
            held += refuse_changed_data(step, meta, prepared, self.accept_data_change)
        # A max_steps below the checkpoint's step stops here (ConfigError).
        schedule, schedule_found = schedule_to_resume(
            r, step, ctx.progress.loaded_schedule, checkpointer.last_meta
        )
        # C107 for a history without checkpoints; a symlink or file where the run will write.
        refusals.on_main(dist, lambda: refusals.refuse_to_start(r, self.run_dir, root, step))
        self._begin(doctor)  # nothing refused: the run dir is written from here on
        loop.math.schedule = ctx.progress.schedule = schedule
        found = list(checkpointer.last_findings)  # damaged steps passed over, junk, C121
        if step is not None:
            self.resumed_from = step
            saved_env = checkpointer.last_meta.get("env")
            found += resumed_findings(step, checkpointer.last_path, saved_env, self.env)
            found += schedule_found  # R620: max_steps changed, the LR before and after
        parts.resume.restored(found, fresh=step is None)
        if ctx.is_main:  # lets `trainguard watch` match a wave to the epoch length
            period = loop.sampler.num_samples / loop.sampler.global_batch_size
            ctx.metrics.write({"kind": "meta", "data_period_steps": period})

    def _begin(self, doctor: dict[str, Any] | None) -> None:
        """The run's first write: what was found before it (C113 of --fresh, the doctor's
        findings and its event), once every check that could refuse the run has passed."""
        self.begun = True
        self.ctx.record(self.held)
        self.held = []
        if doctor is not None:
            self.ctx.log_event("doctor", checks=doctor)

    # -- hangs: the process is about to exit 3 for a restart ------------------------------------
    def _checkpoint_phase(self, phase: str, step: int) -> None:
        """The Checkpointer's phases: at "payload_written" the payload of checkpoint `step` is
        on disk, its checksums, manifest and rename not yet; the callbacks hear of it there
        (fire drills kill the process: `kill@N:checkpoint_write`)."""
        if phase == "payload_written" and self.loop is not None:
            self.loop.callbacks.on_checkpoint_write(self.ctx, step)

    def _hang_reported(self, finding: Finding) -> None:
        """Hand `on_end` the outcome first (the watchdog's thread, or the diagnosis)."""
        if self.on_end is not None:
            self.on_end(hang_outcome(self.result(), finding))

    def _hang_diagnosed(self, finding: Finding) -> None:
        self.ctx.record([finding])
        self.ctx.display.message(str(finding))
        self._hang_reported(finding)
        if self.watchdog is not None:
            self.watchdog.stop()  # we exit for it; its backstop must not fire later

    # -- running and ending --------------------------------------------------------------------
    def train(self) -> None:
        assert self.loop is not None
        train(self.loop)
        self.ctx.log_event("end", **self.last_eval)

    @property
    def last_eval(self) -> dict[str, float]:
        return self.validation.last if self.validation is not None else {}

    def close(self, report: bool, primary: BaseException | None = None) -> None:
        """Close the callbacks (always), the checkpointer, the metric sinks, and write the
        report (after a halt too: the report is where a user looks first). While `primary`
        ends the run, failures here become notes on it, never the error the user sees."""
        error: Exception | None = None
        if self.loop is not None:
            try:
                self.loop.callbacks.close(self.ctx, primary)
                self.loop.checkpointer.close()
            except Exception as e:
                if primary is not None:
                    primary.add_note(f"also could not close the run: {e}")
                else:
                    error = e
        # A refused run (nothing begun) writes no report: its run dir stays as it was.
        report = report and self.ctx.is_main and self.begun
        close_run(self.ctx.metrics, self.run_dir, report, primary or error)
        if error is not None:
            raise error

    def result(self) -> RunResult:
        model, last = self.ctx.model, self.last_eval
        return RunResult(
            run_dir=self.run_dir,
            final_step=self.ctx.step,
            final_val_loss=last.get("val_loss"),
            final_val_bpb=last.get("val_bpb"),
            params=sum(p.numel() for p in model.parameters()) if model is not None else 0,
            tokens=self.ctx.tokens_seen,
            resumed_from=self.resumed_from,
            findings=[*self.ctx.findings, *self.held],
            skipped_steps=self._skipped_steps(),
        )

    def _skipped_steps(self) -> list[int]:
        """The steps whose update the guard skipped (its history survives resumes)."""
        history = self.loop.guard.history if self.loop is not None else []
        return [h["step"] for h in history if h.get("action") == "skip"]


def run_recipe(
    recipe: Recipe,
    run_dir: str | Path,
    *,
    progress: bool = True,
    faults: FaultPlan | None = None,
    report: bool = True,
    evals: bool = True,
    fresh: bool = False,
    accept_data_change: bool = False,
    on_end: Callable[[RunResult], None] | None = None,
    callbacks: Sequence[Callback] = (),
) -> RunResult:
    """The whole guarded run. Resumes automatically when the run dir has checkpoints.

    `callbacks`: your own `trainguard.Callback`s, run beside the run's (in `priority` order;
    the order is logged at the start), their `state_dict` kept in every checkpoint.

    `evals=False` trains without use-case evals on purpose (`trainguard run --no-evals`);
    `fresh=True` first moves the previous run aside (`start_fresh`) and starts at step 0.
    `accept_data_change=True` resumes on data that differs from the checkpoint's (D104), which
    otherwise stops the run. `on_end(result)` is called once however the run ends: finished,
    raising (the result's `exit_status` and `error` say why; then it is raised), or about to
    exit for a hang (from the watchdog's thread); `trainguard run --json` prints it.
    """
    run_dir = Path(run_dir)
    run: Run | None = None
    try:
        dist = init_distributed(recipe.distributed, recipe.train.batch_size)
        try:
            rundir.ensure_writable(run_dir)  # before the lock: the clearest message for a bad dir
            with rundir.hold_run_dir(run_dir, dist):
                run = Run(
                    recipe,
                    run_dir,
                    dist,
                    progress=progress,
                    faults=faults,
                    evals=evals,
                    accept_data_change=accept_data_change,
                    on_end=on_end,
                    callbacks=callbacks,
                )
                _run_phases(run, report, fresh)
        finally:
            dist.close()
    except BaseException as e:
        if on_end is not None:
            on_end((run.result() if run else RunResult.empty(run_dir)).with_error(e))
        raise
    result = run.result()
    if on_end is not None:
        on_end(result)
    return result


def _run_phases(run: Run, report: bool, fresh: bool) -> None:
    try:
        run.setup(fresh=fresh)
        run.train()
    except BaseException as e:
        run.close(report, primary=e)
        raise
    run.close(report)


def _samples(recipe: Any, data: Any) -> int:
    """The train split's sample count: the data order's size, for run.json."""
    return int(data.train.num_samples(recipe.data.seq_len))
