"""Acting on the guard's decisions inside `trainguard run`: skip, rerun to classify, roll back,
halt. Skipped data positions are recorded in the trainer state (and so in checkpoints), which
keeps the data order deterministic and auditable after a rollback.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from trainguard.errors import RunHalted
from trainguard.guards.decision import Decision
from trainguard.train.loop import StepResult
from trainguard.train.restore import choose_checkpoint
from trainguard.train.state_load import apply_checkpoint

if TYPE_CHECKING:
    from trainguard.train.run import RunSession

# How many recent steps' data positions we remember, to skip their batches after a rollback.
POSITION_MEMORY = 4096


class StepPositions:
    """Where in the data order each recent step started (a bounded map)."""

    def __init__(self) -> None:
        self._map: OrderedDict[int, int] = OrderedDict()

    def record(self, step: int, position: int) -> None:
        self._map[step] = position
        while len(self._map) > POSITION_MEMORY:
            self._map.popitem(last=False)

    def get(self, step: int) -> int | None:
        return self._map.get(step)


def next_position(session: RunSession) -> int:
    """The data position of the next step, jumping over ranges a rollback marked bad."""
    state = session.state
    num_samples = session.trainer.order.num_samples
    skipped = {start: end for start, end in state.skipped_positions}
    while state.loader_position in skipped:
        state.skip_data(skipped[state.loader_position] - state.loader_position, num_samples)
    return state.loader_position


def rerun_to_classify(
    session: RunSession, decision: Decision, first: StepResult, position: int
) -> None:
    """Recompute the suspect step from the same state and batch; say hardware or software."""
    second = session.trainer.forward_backward(decision.step, position)
    verdict = session.guard.classify_rerun(
        (first.loss, first.grad_norm), (second.loss, second.grad_norm), step=decision.step
    )
    decision.findings.append(verdict)
    # The update stays unapplied either way: a corrupt first result is not to be trusted,
    # and a reproducible bad one is exactly what the guard refused.
    session.trainer.discard_update()


def rollback(session: RunSession, decision: Decision, positions: StepPositions) -> None:
    """Return to the newest valid checkpoint and skip the batches of the bad steps."""
    chosen = choose_checkpoint(session.store, session.model, session.optimizer)
    loaded, content = chosen.loaded, chosen.content
    if loaded is None or content is None:
        why = "; ".join(f.message for f in chosen.findings if f.code == "C107")
        raise RunHalted(
            f"the guard asked for a rollback at step {decision.step} but there is no valid "
            "checkpoint to return to" + (f" ({why})" if why else ""),
            "lower checkpoint.interval so a good state is on disk, or lower train.lr",
        )
    counters = session.guard.state_dict()  # the rollback count must survive the restore
    previous_skips = session.state.skipped_positions
    state, _ = apply_checkpoint(content, loaded.path, session.model, session.optimizer)
    global_batch = session.trainer.global_batch
    bad_positions = {
        s: pos
        for s in decision.bad_steps
        if s > loaded.step and (pos := positions.get(s)) is not None
    }
    new_skips = [[pos, pos + global_batch] for pos in bad_positions.values()]
    state.skipped_positions = sorted({tuple(r) for r in previous_skips + new_skips})
    state.skipped_positions = [list(r) for r in state.skipped_positions]
    session.state = state
    session.guard.load_state_dict(counters)
    session.guard.after_rollback(state.guard)
    session.record(chosen.findings)
    session.log_event(
        "rollback",
        from_step=decision.step,
        to_step=loaded.step,
        skipped_positions=new_skips,
        # The batch each bad step read, by step: `trainguard batch --step N` finds it here.
        bad_positions={str(s): pos for s, pos in bad_positions.items()},
    )
    session.display.message(
        f"rollback: step {decision.step} -> checkpoint {loaded.step}, "
        f"skipping {len(new_skips)} bad batches"
    )
