"""The run's own counters and LR schedule: one ordinary entry of the checkpoint state.

`trainguard run` checkpoints one state dict through the public Checkpointer, in the format
every loop gets (FlatLayout, or DCP when sharded):

    {"model": model, "optimizer": optimizer, "sampler": sampler, "run": RunState,
     "guard": guard, "callbacks": callbacks}

with every rank's generator states (the Checkpointer's) and, in the manifest's `meta`, what
the checkpoint was trained on and with: `data_identity`, `tokens_seen`, `recipe` (the recipe
as run), `recipe_hash` and `env` (the software it ran with; H101 on a resume that differs).
"""

from __future__ import annotations

from typing import Any

from trainguard.train.schedule import LrSchedule


class RunState:
    """Completed steps (= the logged number of the last step), tokens trained on, and the LR
    schedule's segments the run trains on (`schedule`, set once the resume chose it;
    `loaded_schedule`: the segments of the checkpoint restored, None before they were
    saved)."""

    def __init__(self) -> None:
        self.step = 0
        self.tokens_seen = 0
        self.schedule: LrSchedule | None = None
        self.loaded_schedule: list[dict[str, Any]] | None = None

    def advance(self, tokens: int) -> None:
        self.step += 1
        self.tokens_seen += tokens

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "schedule": self.schedule.to_list() if self.schedule is not None else [],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens_seen = _count(state, "step"), _count(state, "tokens_seen")
        self.loaded_schedule = list(state.get("schedule") or []) or None

    def state_problem(self, state: Any) -> str | None:
        """Why `state` is not a RunState's (checked before anything loads)."""
        try:
            _count(state, "step"), _count(state, "tokens_seen")
            if state.get("schedule"):  # the segments' shape (warm-up and floor come later)
                LrSchedule.from_list(0, 0.0, state["schedule"])
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            return str(e)
        return None


def _count(state: dict[str, Any], key: str) -> int:
    value = state[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} is {value!r}, not a non-negative integer")
    return value
