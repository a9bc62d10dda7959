"""`trainguard run`: prepare data -> pre-flight -> guarded training with verified checkpoints
and auto-resume -> evaluation -> report.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trainguard.config.load import recipe_to_dict
from trainguard.config.schema import Recipe
from trainguard.data.order import compare_batch_hashes
from trainguard.data.prepare import prepare_data
from trainguard.data.shards import compare_identity, data_identity
from trainguard.drills.faults import FaultPlan
from trainguard.errors import PreflightFailed, RunHalted
from trainguard.findings import Finding
from trainguard.guard import Guard
from trainguard.guards.decision import Decision
from trainguard.metrics.sinks import open_run_sinks
from trainguard.model.gpt import GPT
from trainguard.monitors.moe import router_summary
from trainguard.monitors.watchdog import Watchdog
from trainguard.train import rundir
from trainguard.train.actions import StepPositions, next_position, rerun_to_classify, rollback
from trainguard.train.device_steps import DeviceSteps
from trainguard.train.distributed import Dist, init_distributed
from trainguard.train.envinfo import drift_findings, environment_fingerprint
from trainguard.train.evals_hook import RunEvals
from trainguard.train.loop import StepResult, Trainer, World
from trainguard.train.metrics import ProgressDisplay, unlogged_hang_reports
from trainguard.train.multiproc import MultiProcessGuards
from trainguard.train.optim import build_optimizer
from trainguard.train.outcome import RunResult, close_session, report_hang
from trainguard.train.restore import (
    Chosen,
    choose_checkpoint,
    refuse_if_none_usable,
    schedule_to_resume,
    start_fresh,
)
from trainguard.train.shared_store import checkpoint_root, open_store, probe_store
from trainguard.train.state import TrainerState, write_checkpoint_files
from trainguard.train.state_load import apply_checkpoint


def set_determinism(recipe: Recipe) -> None:
    """Same recipe and seed give bitwise the same weights on CPU (docs/architecture.md, #9)."""
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


__all__ = ["RunResult", "RunSession", "checkpoint_root", "run_recipe"]  # RunResult: outcome.py


class RunSession:
    """The state of one `trainguard run` invocation, so the phases read as methods."""

    def __init__(
        self,
        recipe: Recipe,
        run_dir: Path,
        *,
        progress: bool = True,
        world: World | None = None,
        faults: FaultPlan | None = None,
        device: torch.device | None = None,
        dist: Dist | None = None,
        evals: bool = True,
        accept_data_change: bool = False,
        on_end: Callable[[RunResult], None] | None = None,
    ) -> None:
        self.recipe = recipe
        # One process unless torchrun started us (train/distributed.py).
        self.dist = dist or Dist(world=world or World())
        self.recipe_dict = recipe_to_dict(recipe)
        self.run_dir = Path(run_dir)
        self.progress_enabled = progress
        self.world = self.dist.world
        self.is_main = self.world.rank == 0
        self.faults = faults if faults is not None else FaultPlan.from_env()
        self.device = device or self.dist.device
        self.findings: list[Finding] = []
        # metrics.jsonl plus the recipe's viewers (TensorBoard, W&B): every row goes to each.
        self.metrics = open_run_sinks(self.run_dir, recipe.metrics)
        self.env = environment_fingerprint()
        self.state = TrainerState()
        self.resumed_from: int | None = None
        self.last_eval: dict[str, float] = {}
        self.replayed_hashes: dict[int, str] = {}
        self.watchdog: Watchdog | None = None
        self.accept_data_change = accept_data_change
        self.on_end = on_end
        self.multi = MultiProcessGuards(self)
        self.evals = RunEvals(self, enabled=evals)  # refuses a recipe with no use-case eval

    # -- phases -----------------------------------------------------------------------------
    def setup(self, fresh: bool = False) -> None:
        # The run dir is proven writable and locked (run_recipe) before anything here.
        if fresh:  # rank 0 sets the previous run aside; no rank looks at it before that
            moved = start_fresh(self.recipe, self.run_dir) if self.is_main else []
            self.dist.barrier()
            self.record(moved)
        rundir.check_resume_recipe(self.run_dir, self.recipe_dict)
        if self.recipe.preflight.doctor:  # first: a bad node is found before anything is spent
            self.preflight(doctor=True)
        self.store = open_store(self.recipe, self.run_dir, self.dist)
        probe_store(self.store, checkpoint_root(self.recipe, self.run_dir))
        set_determinism(self.recipe)
        self.env["torch_threads"] = torch.get_num_threads()  # train.threads, now applied
        self.data = prepare_data(
            self.recipe.data, self.recipe.tokenizer, progress=self.progress_enabled and self.is_main
        )
        self.model = build_model(self.recipe, self.data.vocab_size, self.device)
        self.optimizer = build_optimizer(self.recipe, self.model)
        # Before anything is written: checkpoints that exist but cannot be used stop the run
        # here, with metrics.jsonl and the checkpoint folders untouched. Loading waits for
        # resume(), after pre-flight (whose random draws must not touch the restored RNGs).
        self.chosen = choose_checkpoint(self.store, self.model, self.optimizer)
        refuse_if_none_usable(self.chosen)
        # A max_steps below the checkpoint's step stops here, before the run dir is written.
        self.schedule, self.schedule_findings = schedule_to_resume(self.recipe, self.chosen)
        if self.is_main:
            rundir.write_recipe(self.run_dir, self.recipe_dict)
            shutil.copyfile(self.data.tokenizer_path, self.run_dir / "tokenizer.json")
        self.evals.attach_data()
        # DDP (several processes) broadcasts rank 0's initial weights; None for one process.
        self.ddp = self.dist.wrap(self.model, self.recipe.train.precision)
        if self.recipe.preflight.enabled:
            self.preflight()

    def preflight(self, doctor: bool = False) -> None:
        from trainguard.train.preflight import doctor_findings, run_preflight

        found, details = doctor_findings(self) if doctor else run_preflight(self)
        self.record(found)
        self.log_event("doctor" if doctor else "preflight", checks=details)
        errors = [f for f in found if f.severity == "error"]
        if errors and self.recipe.preflight.fail_on_error:
            listing = "; ".join(str(f) for f in errors)
            raise PreflightFailed(
                f"pre-flight found {len(errors)} error(s), training did not start: {listing}",
                "fix the findings, or set preflight.fail_on_error=false to train anyway",
            )

    def record(self, findings: list[Finding]) -> None:
        for f in findings:
            self.findings.append(f)
            if self.is_main:
                self.metrics.write({"kind": "finding", **f.to_dict()})

    def resume(self) -> None:
        """Continue from the checkpoint `setup` chose: the newest one that verifies and loads."""
        loaded, content = self.chosen.loaded, self.chosen.content
        if loaded is not None:
            self.check_data_unchanged(loaded.step, loaded.manifest)
        step = loaded.step if loaded is not None else 0
        dropped = self.metrics.truncate_after(step) if self.is_main else []
        # Steps a crash threw away are recomputed; they must read the very same batches (D110).
        self.replayed_hashes = {
            r["step"]: r["batch_hash"] for r in dropped if r.get("kind") == "step"
        }
        self.record_earlier_hangs()
        self.record(self.chosen.findings)  # damaged steps passed over, junk in the folder
        if loaded is None or content is None:
            return
        self.state, saved_env = apply_checkpoint(content, loaded.path, self.model, self.optimizer)
        self.chosen = Chosen(loaded, None)  # the read state is in the model now: free it
        self.resumed_from = self.state.step
        self.record(drift_findings(saved_env, self.env, self.state.step))
        self.record(
            [
                Finding.of(
                    "C150",
                    f"resumed from checkpoint step {self.state.step} ({loaded.path})",
                    step=self.state.step,
                    data={"path": str(loaded.path)},
                )
            ]
        )
        self.record(self.schedule_findings)  # R620: max_steps changed, the LR before and after

    def check_data_unchanged(self, step: int, manifest: dict) -> None:
        """D104: the checkpoint was trained on other data than the data prepared now. The run
        stops here, before it changes anything, unless the user accepted the change."""
        recorded = (manifest.get("meta") or {}).get("data_identity")
        if recorded is None:
            return
        found = compare_identity(recorded, data_identity(self.data.manifest))
        accepted = " (accepted: --accept-data-change)" if self.accept_data_change else ""
        self.record([dataclasses.replace(f, message=f.message + accepted) for f in found])
        if found and not self.accept_data_change:
            raise RunHalted(
                f"not resuming from checkpoint step {step}: {found[0].message}; the same sample "
                "ids would now be different text (D104)",
                "resume with the original data (same source files and tokenizer settings), start "
                "a new run with --run-dir NEW_DIR, or continue on the new data on purpose with "
                "--accept-data-change",
            )

    def record_earlier_hangs(self) -> None:
        """Log the hangs that ended earlier attempts (R210, R301), once each (see
        `unlogged_hang_reports`)."""
        if self.is_main:
            self.record(unlogged_hang_reports(self.run_dir))

    def save_checkpoint(self) -> None:
        step = self.state.step

        self.state.guard = self.guard.state_dict()
        self.state.evals = self.evals.state_dict()
        self.state.schedule = self.schedule.to_list()

        def write(folder: Path) -> None:
            write_checkpoint_files(
                folder, self.model, self.optimizer, self.state, self.recipe_dict, self.env
            )
            self.faults.at("checkpoint_write", step)

        self.faults.at("checkpoint", step)
        if self.watchdog is not None:
            self.watchdog.set_phase("checkpoint")
        if self.is_main:
            meta = {
                "tokens_seen": self.state.tokens_seen,
                "data_identity": data_identity(self.data.manifest),
            }
            self.store.save(step, write, meta=meta)

    def evaluate(self) -> None:
        if self.watchdog is not None:
            self.watchdog.set_phase("eval")
        result = self.trainer.evaluate()
        self.last_eval = result
        if self.is_main:
            row = {"kind": "eval", "step": self.state.step, "tokens": self.state.tokens_seen}
            self.metrics.write({**row, **result})
        self.evals.after_validation(self.state.step, result)
        self.display.message(
            f"eval @ step {self.state.step}: val_loss {result['val_loss']:.4f}  "
            f"val_bpb {result['val_bpb']:.4f}"
        )

    def log_event(self, event: str, **fields: object) -> None:
        if self.is_main:
            self.metrics.write({"kind": "event", "step": self.state.step, "event": event, **fields})

    def start_guards(self) -> None:
        r = self.recipe
        # One epoch of the data order, in steps: the period a poor shuffle would show.
        data_period = self.trainer.order.num_samples / self.trainer.global_batch
        # The guard owns the multi-process part, so that its state (straggler windows, replica
        # rollback count) is saved in checkpoints and survives rollbacks.
        self.guard = Guard(config=r.guards, data_period=data_period, distributed=self.multi.part)
        if self.state.guard:
            self.guard.load_state_dict(self.state.guard)
        if self.is_main:  # lets `trainguard watch` match a wave to the epoch length
            self.metrics.write({"kind": "meta", "data_period_steps": data_period})
        self.watchdog = None
        self.trainer.on_phase = lambda phase, step: self.multi.timed(phase)
        if r.guards.enabled:
            floor = r.guards.hang_floor_s
            self.watchdog = Watchdog.from_config(
                self.run_dir,
                r.guards,
                rank=self.world.rank if self.world.size > 1 else None,
                on_timeout=lambda finding: report_hang(self, finding),
                # The first step compiles and warms caches; checkpoints and evals are long.
                phase_floors={"startup": 4 * floor, "checkpoint": 4 * floor, "eval": 4 * floor},
            ).start()
            watchdog = self.watchdog

            def on_phase(phase: str, step: int) -> None:
                watchdog.set_phase(phase)
                self.multi.timed(phase)

            self.trainer.on_phase = on_phase

    def train(self) -> None:
        r = self.recipe
        t = r.train
        self.trainer = Trainer(
            r,
            self.model,
            self.optimizer,
            self.data.train,
            self.data.val,
            world=self.world,
            faults=self.faults,
            device=self.device,
            ddp_model=self.ddp,
            schedule=self.schedule,
        )
        self.display = ProgressDisplay(
            t.max_steps,
            self.state.step,
            t.log_interval,
            enabled=self.progress_enabled and self.is_main,
        )
        self.start_guards()
        self.evals.load_state_dict(self.state.evals)
        self.evals.maybe_run(self.state.step)  # the baseline before the first step
        tokens_per_step = self.trainer.global_batch * r.data.seq_len
        positions = StepPositions()
        lagged = DeviceSteps(self) if self.guard.on_device(self.device) else None
        self.multi.arm_sigterm_dump()
        try:
            if self.state.step == 0:
                self.log_event("start", env=self.env)
            while self.state.step < t.max_steps:
                step = self.state.step + 1  # the step being computed, as its log row will say
                position = next_position(self)
                positions.record(step, position)
                t0 = time.perf_counter()
                out = self.multi.guarded(
                    step, self.trainer.forward_backward, step, position, lagged is None
                )
                compute_s = time.perf_counter() - t0  # forward/backward, data phase included
                done = step == t.max_steps
                checkpoint_due = step % r.checkpoint.interval == 0 or done
                eval_due = step % t.eval_interval == 0 or done
                if lagged is None:
                    tokens_per_s = tokens_per_step / compute_s
                    decision = self.guard.step(
                        step,
                        loss=out.loss,
                        grad_norm=out.grad_norm,
                        tokens_per_s=tokens_per_s,
                        router_stats=out.router_stats,  # R601-R604 (MoE models)
                        data_time_s=out.data_time_s,  # R605: the loader's share of the step
                        step_time_s=compute_s,
                    )
                    if decision.rerun:
                        rerun_to_classify(self, decision, out, position)
                    self.record(decision.findings)
                    if decision.action == "rollback":
                        rollback(self, decision, positions)
                        continue
                    decision.raise_if_halt()
                    if decision.apply:
                        lr = self.trainer.apply_update(step)
                    else:
                        self.trainer.discard_update()
                        lr = 0.0
                else:  # the guard decides on the device; the previous step settles here
                    tokens_per_s = lagged.tokens_per_s(tokens_per_step, t0)
                    pending = lagged.judge(step, out, tokens_per_s, positions)
                    if pending is None:
                        continue  # the previous step rolled back
                    lr = self.trainer.apply_update(step, pending)
                    lagged.hold(step, self.step_row(step, out, lr, tokens_per_s, t0))
                    if (checkpoint_due or eval_due) and not lagged.flush(positions):
                        continue
                diverged = self.multi.check_update(step, checkpoint_due)
                if diverged:  # H201: every rank reloads the newest verified checkpoint
                    self.record(diverged)
                    if lagged is not None:  # settle first: rollback reads the guard's state
                        lagged.discard(step)
                        if not lagged.flush(positions):
                            continue
                    rollback(self, Decision(step, "rollback", diverged), positions)
                    continue
                self.state.advance(
                    self.trainer.global_batch, tokens_per_step, self.trainer.order.num_samples
                )
                dt = time.perf_counter() - t0
                if self.is_main and lagged is None:
                    self.metrics.write(
                        {
                            "kind": "step",
                            "step": step,
                            "loss": out.loss,
                            "grad_norm": out.grad_norm,
                            "lr": lr,
                            "tokens_per_s": tokens_per_step / dt,
                            "batch_hash": out.batch_hash,
                            "position": out.position,  # the batch of this row: `batch --step`
                            "step_time_s": dt,
                            "data_time_s": out.data_time_s,
                            **(router_summary(out.router_stats) if out.router_stats else {}),
                            "time": time.time(),
                            "action": decision.action,
                        }
                    )
                self.evals.after_step(step, {"loss": out.loss, "batch_hash": out.batch_hash})
                if step in self.replayed_hashes:
                    expected = {step: self.replayed_hashes.pop(step)}
                    self.record(compare_batch_hashes(expected, {step: out.batch_hash}))
                if lagged is None:
                    self.display.update(step, out.loss, tokens_per_step / dt)
                self.record(self.multi.after_step(step))
                if self.watchdog is not None:
                    self.watchdog.heartbeat(step)
                if eval_due:
                    self.evaluate()
                self.evals.maybe_run(step, final=done)
                if checkpoint_due:
                    self.save_checkpoint()
                if step % t.eval_interval == 0 or checkpoint_due:
                    self.multi.sync(step)  # the others wait for rank 0's checkpoint write
            if self.resumed_from == t.max_steps or not self.last_eval:
                self.evaluate()  # nothing left to train: still report where the model stands
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()
            self.multi.disarm_sigterm_dump()
            self.display.close()

    @staticmethod
    def step_row(
        step: int, out: StepResult, lr: float, tokens_per_s: float, t0: float
    ) -> dict[str, object]:
        """A step's metrics row before its values are read back (the device path)."""
        return {
            "kind": "step",
            "step": step,
            "loss": None,
            "grad_norm": None,
            "lr": lr,
            "tokens_per_s": tokens_per_s,
            "batch_hash": out.batch_hash,
            "position": out.position,
            "step_time_s": time.perf_counter() - t0,
            "data_time_s": out.data_time_s,
            "time": time.time(),
            "action": None,
        }

    def result(self) -> RunResult:
        model = getattr(self, "model", None)  # absent when setup failed
        return RunResult(
            run_dir=self.run_dir,
            final_step=self.state.step,
            final_val_loss=self.last_eval.get("val_loss"),
            final_val_bpb=self.last_eval.get("val_bpb"),
            params=sum(p.numel() for p in model.parameters()) if model is not None else 0,
            tokens=self.state.tokens_seen,
            resumed_from=self.resumed_from,
            findings=list(self.findings),
        )


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
) -> RunResult:
    """The whole guarded run. Resumes automatically when the run dir has checkpoints.

    `evals=False` trains without use-case evals on purpose (`trainguard run --no-evals`);
    `fresh=True` first moves the previous run aside (`start_fresh`) and starts at step 0.
    `accept_data_change=True` resumes on data that differs from the checkpoint's (D104), which
    otherwise stops the run. `on_end(result)` is called once however the run ends: finished,
    raising (the result's `exit_status` and `error` say why; then it is raised), or about to
    exit for a hang (from the watchdog's thread); `trainguard run --json` prints it.
    """
    run_dir = Path(run_dir)
    session: RunSession | None = None
    try:
        dist = init_distributed(recipe.distributed, recipe.train.batch_size)
        try:
            rundir.ensure_writable(run_dir)  # before the lock: the clearest message for a bad dir
            with rundir.hold_run_dir(run_dir, dist):
                session = RunSession(
                    recipe,
                    run_dir,
                    progress=progress,
                    faults=faults,
                    dist=dist,
                    evals=evals,
                    accept_data_change=accept_data_change,
                    on_end=on_end,
                )
                _run_phases(session, report, fresh)
        finally:
            dist.close()
    except BaseException as e:
        if on_end is not None:
            on_end((session.result() if session else RunResult.empty(run_dir)).with_error(e))
        raise
    result = session.result()
    if on_end is not None:
        on_end(result)
    return result


def _run_phases(session: RunSession, report: bool, fresh: bool) -> None:
    try:
        session.setup(fresh=fresh)
        session.resume()
        session.train()
        session.log_event("end", **session.last_eval)
    except BaseException as e:
        close_session(session, report, primary=e)
        raise
    close_session(session, report)
