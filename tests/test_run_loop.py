"""`trainguard run`'s loop in-process (torchtitan style: real parts, no subprocess): callbacks
in priority order at every hook, `on_error` and `close` on every exit, callback state through
real checkpoints and across a rollback, a bad batch skipped before any weight changes, the
chunked data pre-flight, and no module importing the composition root back."""

from __future__ import annotations

import ast
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from loophelpers import loop_without_data, run_checkpointer, run_state
from runhelpers import tiny_recipe_dict
from trainguard import ElasticSampler, Guard
from trainguard.checkpoint.layout import FlatLayout
from trainguard.checkpoint.read import read_module_state
from trainguard.config.load import validate_recipe
from trainguard.faults import FaultPlan
from trainguard.guard.decision import Decision
from trainguard.guard.distributed.guards import DistributedGuards
from trainguard.train import actions
from trainguard.train.callback import Callback, RunContext
from trainguard.train.guarded_run import Run, _run_phases
from trainguard.train.run_state import RunState
from trainguard.train.world import Dist

SRC = Path(__file__).resolve().parents[1] / "src" / "trainguard"


@pytest.fixture
def recipe_for(small_corpus: Path, cache_dir: Path, torch_globals: None):
    def make(async_save: bool = True, **train: Any):
        raw = tiny_recipe_dict(small_corpus, cache_dir)
        raw["train"] |= {"max_steps": 4, "eval_interval": 4, **train}
        raw["checkpoint"] |= {"interval": 2, "async_save": async_save}
        return validate_recipe(raw)

    return make


def run_in_process(recipe, run_dir: Path, callbacks=(), faults: str = "") -> Run:
    run = Run(
        recipe,
        run_dir,
        Dist(),
        progress=False,
        faults=FaultPlan.parse(faults, rank=0),
        evals=False,
        callbacks=callbacks,
    )
    _run_phases(run, report=False, fresh=False)
    return run


class Recorder(Callback):
    """Logs every hook it sees as (name, hook, detail); raises at `fail_at` = (hook, step)."""

    def __init__(self, name: str, priority: int, log: list, fail_at: tuple | None = None):
        self.name, self.priority, self.log, self.fail_at = name, priority, log, fail_at

    def _see(self, hook: str, detail: Any = None) -> None:
        self.log.append((self.name, hook, detail))
        if self.fail_at == (hook, detail):
            raise RuntimeError(f"{self.name} failed in {hook}")

    def pre_train(self, ctx: RunContext) -> None:
        self._see("pre_train", ctx.step)

    def pre_step(self, ctx: RunContext, step: int) -> None:
        self._see("pre_step", step)

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        logged = [json.loads(x) for x in ctx.metrics.path.read_text().splitlines()]
        assert any(r.get("kind") == "step" and r["step"] == step for r in logged)  # steplog ran
        self._see("post_step", step)

    def post_checkpoint(self, ctx: RunContext, step: int, path: str) -> None:
        assert (Path(path) / "manifest.json").exists()  # committed
        self._see("post_checkpoint", step)

    def post_train(self, ctx: RunContext) -> None:
        self._see("post_train")

    def on_error(self, ctx: RunContext, exc: BaseException) -> None:
        self._see("on_error", str(exc))

    def close(self, ctx: RunContext) -> None:
        self._see("close")


def hooks_of(log: list, name: str) -> list[tuple]:
    return [(hook, detail) for n, hook, detail in log if n == name]


def watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "trainguard-watchdog"]


# -- the spine's order ---------------------------------------------------------------------------
@pytest.mark.parametrize("async_save", [True, False])
def test_callbacks_see_every_hook_in_priority_order(
    recipe_for, tmp_path: Path, async_save: bool
) -> None:
    log: list = []
    low, high = Recorder("low", -5, log), Recorder("high", 85, log)  # below steplog (90)
    run_in_process(recipe_for(async_save), tmp_path / "run", [low, high])
    expected = [("pre_train", 0)]
    for step in (0, 1, 2, 3):  # steps count from 0; checkpoints hold completed steps
        expected += [("pre_step", step), ("post_step", step)]
        if (step + 1) % 2 == 0 and not async_save:  # written in the loop: committed at once
            expected += [("post_checkpoint", step + 1)]
    if async_save:  # written in the background: committed when the next save or the end waits
        expected += [("post_checkpoint", 2), ("post_checkpoint", 4)]
    expected += [("post_train", None), ("close", None)]
    assert hooks_of(log, "high") == expected == hooks_of(log, "low")
    # Higher priority first at every hook: the two logs interleave high, low, high, low...
    assert [n for n, _, _ in log] == ["high", "low"] * len(expected)
    assert watchdog_threads() == []  # the run's own watchdog callback was closed too


def test_on_error_and_close_reach_every_callback(recipe_for, tmp_path: Path) -> None:
    log: list = []
    boom = Recorder("boom", 0, log, fail_at=("post_step", 3))
    low = Recorder("low", -5, log)
    with pytest.raises(RuntimeError, match="boom failed in post_step"):
        run_in_process(recipe_for(), tmp_path / "run", [boom, low])
    assert ("post_step", 3) not in hooks_of(log, "low")  # the step's later callbacks: skipped
    for name in ("boom", "low"):
        assert hooks_of(log, name)[-2:] == [
            ("on_error", "boom failed in post_step"),
            ("close", None),
        ]
    assert watchdog_threads() == []


def test_a_failure_before_the_first_step_still_closes_everything(recipe_for, tmp_path) -> None:
    log: list = []
    first = Recorder("first", 1000, log, fail_at=("pre_train", 0))  # before pre-flight
    low = Recorder("low", -5, log)
    with pytest.raises(RuntimeError, match="first failed in pre_train"):
        run_in_process(recipe_for(), tmp_path / "run", [first, low])
    assert hooks_of(log, "low") == [("on_error", "first failed in pre_train"), ("close", None)]
    assert watchdog_threads() == []  # never started, closed all the same


def test_a_bad_batch_is_skipped_before_any_weight_changes(recipe_for, tmp_path: Path) -> None:
    weights: dict[int, list[torch.Tensor]] = {}

    class Weights(Callback):
        name = "weights"

        def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
            weights[step] = [p.detach().clone() for p in ctx.model.parameters()]

    run = run_in_process(recipe_for(), tmp_path / "run", [Weights()], faults="nan@2")
    codes = [f.code for f in run.ctx.findings]
    assert "R101" in codes and "R201" in codes and run.ctx.step == 4
    assert all(torch.equal(a, b) for a, b in zip(weights[1], weights[2], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(weights[2], weights[3], strict=True))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step2 = next(r for r in rows if r.get("kind") == "step" and r["step"] == 2)
    assert step2["action"] == "skip" and step2["lr"] == 0.0


# -- checkpoints in the background (checkpoint.async_save, the default) ----------------------
def test_the_loop_trains_on_while_a_checkpoint_is_written(
    recipe_for, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 2's checkpoint is held mid-write until step 3 has finished: the loop must have
    trained on meanwhile (a save in the loop would wait here until the gate times out). The
    copy is of step 2's state (bitwise the in-loop save's weights), and the run's end waits
    for every write.

    The copy of step 2's weights and optimizer state, made in the writer thread beside step
    3's forward and backward, is held until step 3 has finished (for a second at most): step
    3 must wait for it before its update (`Checkpointer.wait_copied`), or its update would
    land in step 2's files."""
    gate, real_write = threading.Event(), FlatLayout.write
    seen: dict[int, bool] = {}
    real_copy, copied_after_step_3 = FlatLayout._copy_into, []

    def held_copy(self: Any, snapshot: Any, *rest: Any) -> None:
        if snapshot[0]["values"]["run"]["step"] == 2:
            copied_after_step_3.append(gate.wait(timeout=1.0))  # True: step 3 went on
        real_copy(self, snapshot, *rest)

    def gated_write(self: Any, folder: Path, snapshot: Any) -> None:
        if snapshot[0]["values"]["run"]["step"] == 2:
            gate.wait(timeout=120)
        real_write(self, folder, snapshot)

    class Watch(Callback):
        name = "watch"

        def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
            seen[step] = (ctx.run_dir / "checkpoints" / "step-2" / "manifest.json").exists()
            if step == 2:  # the step after the save of checkpoint 2 (2 steps done)
                gate.set()

    monkeypatch.setattr(FlatLayout, "write", gated_write)
    monkeypatch.setattr(FlatLayout, "_copy_into", held_copy)
    run_in_process(recipe_for(), tmp_path / "async", [Watch()])
    assert seen[2] is False  # step 2 ran while checkpoint 2 was still being written
    assert copied_after_step_3 == [False]  # step 3 waited for the copy before its update
    monkeypatch.setattr(FlatLayout, "write", real_write)
    monkeypatch.setattr(FlatLayout, "_copy_into", real_copy)
    run_in_process(recipe_for(async_save=False), tmp_path / "sync")
    for step in (2, 4):  # the same checkpoints, committed by the time the run returned
        a, b = (
            read_module_state(tmp_path / kind / "checkpoints" / f"step-{step}")
            for kind in ("async", "sync")
        )
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        # byte for byte: step 2 is written from fresh copies, step 4 from refilled ones
        for name in ("state.safetensors",):
            a, b = (
                (tmp_path / kind / "checkpoints" / f"step-{step}" / name).read_bytes()
                for kind in ("async", "sync")
            )
            assert a == b, f"step {step}: {name}"


def test_a_transient_bitflip_waits_for_the_previous_checkpoints_copy(
    recipe_for, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bitflip@4` flips a weight during step 4's forward and backward (0-based: the fifth
    step), beside which the writer thread copies checkpoint 4's weights. The copy is held until
    step 4's backward (a second at most, as a writer thread scheduled late would be): the flip
    must wait for it (`FaultPlan.settle_copy`), or checkpoint 4 holds the flipped bit and still
    verifies."""
    from trainguard.faults import FaultPlan

    in_backward = threading.Event()
    real_copy, real_at = FlatLayout._copy_into, FaultPlan.at

    def late_copy(self: Any, snapshot: Any, *rest: Any) -> None:
        if snapshot[0]["values"]["run"]["step"] == 4:
            in_backward.wait(timeout=1.0)
        real_copy(self, snapshot, *rest)

    def at(self: FaultPlan, phase: str, step: int) -> None:
        if phase == "backward" and step == 4:
            in_backward.set()
            time.sleep(0.2)  # the flipped weight stays in place while the copy could read it
        real_at(self, phase, step)

    monkeypatch.setattr(FlatLayout, "_copy_into", late_copy)
    monkeypatch.setattr(FaultPlan, "at", at)
    run_in_process(recipe_for(max_steps=6), tmp_path / "async", faults="bitflip@4")
    monkeypatch.undo()
    run_in_process(recipe_for(async_save=False, max_steps=6), tmp_path / "sync", faults="bitflip@4")
    a, b = (
        (tmp_path / kind / "checkpoints" / "step-4" / "state.safetensors").read_bytes()
        for kind in ("async", "sync")
    )
    assert a == b, "step 4's checkpoint holds step 5's transiently flipped weight"


# -- callback state ------------------------------------------------------------------------------
class Counter(Callback):
    """A callback with a window to keep: the steps it has seen."""

    name = "counter"

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.loaded: dict | None = None

    def post_step(self, ctx: RunContext, step: int, row: dict[str, Any]) -> None:
        self.seen.append(step)

    def state_dict(self) -> dict[str, Any]:
        return {"seen": list(self.seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = state
        self.seen = list(state.get("seen", []))


def test_callback_state_survives_a_restart_through_real_checkpoints(recipe_for, tmp_path) -> None:
    run_dir = tmp_path / "run"
    first = Counter()
    run_in_process(recipe_for(), run_dir, [first])
    saved = json.loads((run_dir / "checkpoints" / "step-4" / "state.json").read_text())
    callbacks = saved["values"]["callbacks"]
    assert callbacks["counter"] == {"seen": [0, 1, 2, 3]}
    assert "validation" in callbacks and "guard" in saved["values"]
    again = Counter()
    run = run_in_process(recipe_for(max_steps=6), run_dir, [again])
    assert run.resumed_from == 4 and again.loaded == {"seen": [0, 1, 2, 3]}
    assert again.seen == [0, 1, 2, 3, 4, 5]


def test_a_rollback_rewinds_the_model_not_the_callbacks(tmp_path: Path) -> None:
    counter = Counter()
    loop = loop_without_data(tmp_path, num_samples=40, global_batch=4, callbacks=[counter])
    for step in range(5):
        loop.ctx.progress.advance(0)
        counter.seen.append(step)
        if step == 2:
            loop.checkpointer.save(step + 1, loop.state)  # 3 steps done
    actions.roll_back(loop, Decision(4, "rollback", bad_steps=[4]))
    assert loop.ctx.step == 3 and counter.seen == [0, 1, 2, 3, 4]
    assert loop.sampler.skipped_positions == [[16, 20]]  # step 4's batch


def test_distributed_guard_state_travels_in_a_run_checkpoint(tmp_path: Path) -> None:
    """Straggler windows and the replica rollback count are in the checkpoint's guard state."""
    part = DistributedGuards(group=None)
    part.replica_rollbacks = 2
    for step in range(2):  # rank 1 behind in two steps: one more and it is named
        walls = [[0.01, 0.05, 0.3, 0.01], [0.01, 0.3, 0.05, 0.01]]  # rank 0 waits in backward
        cpus = [[0.01, 0.05, 0.05, 0.01], [0.01, 0.3, 0.05, 0.01]]
        assert part.stragglers.observe(step, walls, cpus, ["a", "b"]) == []
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = ElasticSampler(40, global_batch_size=4, seed=0)
    checkpointer = run_checkpointer(tmp_path / "ckpt")
    progress = RunState()
    progress.step = 1
    saved = run_state(model, optimizer, sampler, progress=progress, guard=Guard(distributed=part))
    checkpointer.save(1, saved)
    restored = Guard(distributed=DistributedGuards(group=None))
    state = run_state(model, optimizer, sampler, progress=progress, guard=restored)
    assert checkpointer.load_latest(state) == 1
    assert restored.distributed is not None and restored.distributed.replica_rollbacks == 2
    assert restored.distributed.stragglers.state_dict() == part.stragglers.state_dict()
    assert restored.distributed.stragglers.behind.keys() == {1}


# -- pre-flight on the data: chunked ---------------------------------------------------------------
def test_preflight_counts_tokens_in_chunks(recipe_for, tmp_path: Path, monkeypatch) -> None:
    """The tokenizer audit's counts are summed over bounded slices of the train split, never
    the whole split at once (80 GB as int64 at 10B tokens)."""
    import trainguard.checks.data_preflight as data_preflight
    from trainguard.data.prepare import prepare_data
    from trainguard.train.callbacks.preflight import PreflightCallback

    monkeypatch.setattr(data_preflight, "_CHUNK", 4096)
    recipe = recipe_for()
    data = prepare_data(recipe.data, recipe.tokenizer, progress=False)
    largest = [0]
    read = data.train.tokens

    def tokens(start: int, stop: int):
        largest[0] = max(largest[0], stop - start)
        return read(start, stop)

    monkeypatch.setattr(data.train, "tokens", tokens)
    model = torch.nn.Linear(2, 2)
    ctx = _context(recipe, tmp_path, model)
    PreflightCallback(data, evals_enabled=False).tokenizer_findings(ctx)
    assert data.train.n_tokens > 100 * 4096  # the split is far larger than a chunk
    assert 0 < largest[0] <= data_preflight._PACKED  # the framing sample is the largest read


def _context(recipe, tmp_path: Path, model: torch.nn.Module) -> RunContext:
    from loophelpers import context

    ctx = context(tmp_path, model, None)
    ctx.recipe = recipe
    return ctx


# -- layers: nothing imports the composition root back ---------------------------------------------
def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (functions, TYPE_CHECKING blocks included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_no_module_imports_the_run_back_and_the_loop_never_imports_drills() -> None:
    offenders = []
    for path in sorted((SRC / "train").rglob("*.py")):
        if path.name == "guarded_run.py" and path.parent.name == "train":
            continue
        bad = {
            m
            for m in _imports(path)
            if m == "trainguard.train.guarded_run"
            or m.startswith(("trainguard.drills", "trainguard.cli"))
        }
        offenders += [f"{path.relative_to(SRC)} imports {m}" for m in sorted(bad)]
    assert offenders == []


def test_the_checker_sees_imports_inside_functions_and_type_checking(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from trainguard.train.guarded_run import Run\n"
        "def g():\n    import trainguard.drills.runner\n"
    )
    assert {"trainguard.train.guarded_run", "trainguard.drills.runner"} <= _imports(f)
