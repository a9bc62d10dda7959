"""`trainguard.Callback`: the callback spine of `trainguard run` (OLMo-core style). What is not
the arithmetic of a step is a `Callback` that the loop calls at fixed points, with a narrow
`RunContext`; `run_recipe(..., callbacks=[...])` adds a user's own beside the run's.

    pre_train           once, after the resume, before the first step
    pre_step            before step `step` (the 0-based index of the step) is computed
    on_phase            step `step` enters a phase: data, forward, backward, optimizer, eval,
                        checkpoint
    on_loss             a micro-batch's loss before its backward; may return a replacement
    pre_optimizer_step  the guard judged the step; return False to veto its update
    post_optimizer_step the update was applied (or not), before the replica check
    post_step           after the step was applied or skipped; `row` is its metrics row
    on_checkpoint_write the checkpointer's writer is writing checkpoint `step` (its thread)
    post_checkpoint     after a checkpoint of `step` completed steps was committed at `path`
    post_train          the loop reached train.max_steps (not called when it ends otherwise)
    on_error            the run is ending with an exception: every callback hears of it
    close               always, once, last: release what the callback holds

Callbacks run in order of `priority`, higher first (ties: the order given). `state_dict()` of
every callback is saved in each checkpoint (trainer.json's `callbacks`, under the callback's
`name`) and handed back to `load_state_dict` on resume, so windows and schedules survive a
restart. A callback gets what it needs to be built from its constructor, and at run time only
the context: never the run itself (no module imports `train/guarded_run.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from trainguard.errors import BadInputError
from trainguard.findings import Finding

if TYPE_CHECKING:
    import torch

    from trainguard.config.schema import Recipe
    from trainguard.metrics.sinks import MetricsFanout
    from trainguard.train.progress import ProgressDisplay
    from trainguard.train.run_state import RunState
    from trainguard.train.world import World


@dataclass
class RunContext:
    """What a callback may use at run time: the recipe, where the run lives, this process's
    place, the model and optimizer, the metric sinks, the progress display, and the counters."""

    recipe: Recipe
    run_dir: Path
    world: World
    device: torch.device
    metrics: MetricsFanout
    display: ProgressDisplay
    progress: RunState
    model: torch.nn.Module = None  # type: ignore[assignment]  (set once built, before pre_train)
    optimizer: Any = None
    findings: list[Finding] = field(default_factory=list)
    """Everything recorded so far (the run's result lists them)."""
    phase_listener: Callable[[RunContext, str, int], None] | None = None

    @property
    def is_main(self) -> bool:
        """Rank 0, which alone writes the metric log and the run dir's files."""
        return self.world.rank == 0

    @property
    def step(self) -> int:
        """Completed steps: the 0-based index of the step being computed (or the next one)."""
        return self.progress.step

    @property
    def tokens_seen(self) -> int:
        return self.progress.tokens_seen

    def record(self, findings: Iterable[Finding]) -> None:
        """Keep findings for the run's result; rank 0 also logs them."""
        for f in findings:
            self.findings.append(f)
            if self.is_main:
                self.metrics.write({"kind": "finding", **f.to_dict()})

    def log_event(self, event: str, **fields: object) -> None:
        if self.is_main:
            self.metrics.write({"kind": "event", "step": self.step, "event": event, **fields})

    def set_phase(self, phase: str, step: int | None = None) -> None:
        """Tell every callback that step `step` (default: `self.step`) enters `phase` (the
        watchdog, the timers, the drills' faults)."""
        if self.phase_listener is not None:
            self.phase_listener(self, phase, self.step if step is None else step)


class Callback:
    """Base class of the run's callbacks: every hook does nothing; override what you need.

    A callback is built with what it needs; at run time it gets only the `RunContext`. Its
    `state_dict()` is saved in every checkpoint under its `name` and handed back to
    `load_state_dict` on resume (and kept across a rollback)."""

    name: ClassVar[str] = ""
    """The key of this callback's state in checkpoints; unique in a run."""
    priority: ClassVar[int] = 0
    """Higher runs first (ties: the order given)."""

    def pre_train(self, ctx: RunContext) -> None:
        """Once, after the resume and before the first step."""

    def pre_step(self, ctx: RunContext, step: int) -> None:
        """Before step `step` (0-based) is computed."""

    def on_phase(self, ctx: RunContext, phase: str, step: int) -> None:
        """Step `step` enters `phase` (data, forward, backward, optimizer, eval, checkpoint)."""

    def on_loss(self, ctx: RunContext, step: int, loss: Any) -> Any:
        """A micro-batch's loss (a 0-dim tensor) before its backward; return one to replace it."""

    def pre_optimizer_step(self, ctx: RunContext, step: int, decision: Any) -> bool | None:
        """The guard judged step `step` (`decision`; None when it decides on the device and
        tells a step later) and would apply it: return False to veto the update."""

    def post_optimizer_step(self, ctx: RunContext, step: int) -> None:
        """Step `step`'s update was applied or discarded, before the replicas are compared."""

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        """Step `step` is done (applied or skipped); `row` is its metrics row."""

    def on_checkpoint_write(self, ctx: RunContext, step: int) -> None:
        """Checkpoint `step` is being written (the checkpointer's writer thread)."""

    def post_checkpoint(self, ctx: RunContext, step: int, path: str) -> None:
        """The checkpoint of `step` completed steps is committed at `path`."""

    def post_train(self, ctx: RunContext) -> None:
        """The loop reached the last step."""

    def on_error(self, ctx: RunContext, exc: BaseException) -> None:
        """The run ends with `exc` (raised again after every callback heard of it)."""

    def close(self, ctx: RunContext) -> None:
        """Always called once, last."""

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs (JSON data); {} when nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what `state_dict` returned ({} when the checkpoint has nothing)."""


_HOOKS = (
    "pre_train",
    "pre_step",
    "on_phase",
    "on_loss",
    "pre_optimizer_step",
    "post_optimizer_step",
    "post_step",
    "on_checkpoint_write",
    "post_checkpoint",
    "post_train",
)


class Callbacks:
    """The run's callbacks in priority order; one call runs a hook on each of them. Only the
    callbacks that override a hook are called for it (the per-phase hook is on the hot path).
    Stateful as one object: `{name: state}`."""

    def __init__(self, callbacks: Iterable[Callback]) -> None:
        self.all = sorted(callbacks, key=lambda cb: -cb.priority)  # stable: ties keep order
        names = [cb.name for cb in self.all]
        if len(set(names)) != len(names) or "" in names:
            raise BadInputError(  # a user's callback (run_recipe(callbacks=...)) among them
                f"callback names must be unique and non-empty, got {names}",
                "give each trainguard.Callback subclass its own class attribute `name` (the "
                "key of its state in checkpoints)",
            )
        self._hooks = {
            hook: [cb for cb in self.all if getattr(type(cb), hook) is not getattr(Callback, hook)]
            for hook in _HOOKS
        }

    def __iter__(self):
        return iter(self.all)

    def order(self) -> list[str]:
        """The callbacks' names in the order they run (logged at the start of a run)."""
        return [cb.name for cb in self.all]

    def get(self, name: str) -> Callback | None:
        return next((cb for cb in self.all if cb.name == name), None)

    def pre_train(self, ctx: RunContext) -> None:
        for cb in self._hooks["pre_train"]:
            cb.pre_train(ctx)

    def pre_step(self, ctx: RunContext, step: int) -> None:
        for cb in self._hooks["pre_step"]:
            cb.pre_step(ctx, step)

    def on_phase(self, ctx: RunContext, phase: str, step: int) -> None:
        for cb in self._hooks["on_phase"]:
            cb.on_phase(ctx, phase, step)

    def on_loss(self, ctx: RunContext, step: int, loss: Any) -> Any:
        for cb in self._hooks["on_loss"]:
            replaced = cb.on_loss(ctx, step, loss)
            loss = loss if replaced is None else replaced
        return loss

    def pre_optimizer_step(self, ctx: RunContext, step: int, decision: Any) -> str | None:
        """The name of the first callback that vetoes step `step`'s update, or None. Every
        callback is asked (each sees the step), in order."""
        vetoed = None
        for cb in self._hooks["pre_optimizer_step"]:
            if cb.pre_optimizer_step(ctx, step, decision) is False and vetoed is None:
                vetoed = cb.name
        return vetoed

    def post_optimizer_step(self, ctx: RunContext, step: int) -> None:
        for cb in self._hooks["post_optimizer_step"]:
            cb.post_optimizer_step(ctx, step)

    @property
    def hears_loss(self) -> bool:
        """Whether a callback looks at the loss (`on_loss`); the step skips the call if not."""
        return bool(self._hooks["on_loss"])

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        for cb in self._hooks["post_step"]:
            cb.post_step(ctx, step, row)

    def on_checkpoint_write(self, ctx: RunContext, step: int) -> None:
        for cb in self._hooks["on_checkpoint_write"]:
            cb.on_checkpoint_write(ctx, step)

    def post_checkpoint(self, ctx: RunContext, step: int, path: str) -> None:
        for cb in self._hooks["post_checkpoint"]:
            cb.post_checkpoint(ctx, step, path)

    def post_train(self, ctx: RunContext) -> None:
        for cb in self._hooks["post_train"]:
            cb.post_train(ctx)

    def on_error(self, ctx: RunContext, exc: BaseException) -> None:
        """Every callback hears of `exc`; a callback that fails here does not stop the others
        (its failure becomes a note on `exc`, which stays the error the user sees)."""
        for cb in self.all:
            try:
                cb.on_error(ctx, exc)
            except Exception as e:
                exc.add_note(f"also: the {cb.name} callback failed on the error: {e}")

    def close(self, ctx: RunContext, primary: BaseException | None = None) -> None:
        """Close every callback, even when one fails. With `primary` (the error ending the
        run) failures become notes on it; without, the first one is raised after all closed."""
        first: Exception | None = None
        for cb in self.all:
            try:
                cb.close(ctx)
            except Exception as e:
                if primary is not None:
                    primary.add_note(f"also: could not close the {cb.name} callback: {e}")
                elif first is None:
                    first = e
        if first is not None:
            raise first

    def state_dict(self) -> dict[str, dict[str, Any]]:
        return {cb.name: cb.state_dict() for cb in self.all}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each callback gets its own entry ({} if the checkpoint has none: a callback added
        since, e.g. a metrics viewer); entries of callbacks not in this run are ignored."""
        for cb in self.all:
            cb.load_state_dict(dict(state.get(cb.name) or {}))
