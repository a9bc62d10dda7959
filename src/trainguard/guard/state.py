"""The Guard's state: what a checkpoint carries (detector windows, action counters) and how a
rollback takes a checkpoint's windows while keeping the counters."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from trainguard.errors import ConfigError
from trainguard.guard.arguments import state_arg
from trainguard.guard.detectors.loader import LoaderStallDetector
from trainguard.guard.detectors.moe import MoEHealthDetector
from trainguard.guard.detectors.monitor_set import MonitorSet


def guard_state(guard: Any) -> dict[str, Any]:
    state = {
        "version": 1,
        "monitors": guard.monitors.state_dict(),
        "moe": guard.moe.state_dict(),
        "loader": guard.loader.state_dict(),
        "rollbacks": guard.rollbacks,
        "skipped": guard.skipped,
        "recent_bad": list(guard.recent_bad),
        "history": list(guard.history),
    }
    if guard.distributed is not None:  # straggler windows, replica rollback count
        state["distributed"] = guard.distributed.state_dict()
    return state


def load_guard_state(guard: Any, state: Any) -> None:
    """Resume: the windows and the action counters. ConfigError when `state` is not what
    `guard_state` returned; the guard is then left as it was."""
    state = state_arg(state)
    try:  # into fresh parts first, so that a damaged state changes nothing
        monitors = fresh_monitors(guard, state.get("monitors", {}))
        counters = (
            int(state.get("rollbacks", 0)),
            int(state.get("skipped", 0)),
            deque(int(s) for s in state.get("recent_bad", [])),
            list(state.get("history", [])),
        )
        moe, loader = health_parts(guard, state)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise ConfigError(
            f"Guard.load_state_dict(state): state is not a Guard.state_dict() ({e!r:.120})",
            "pass the guard's state as saved in the checkpoint (state['guard'])",
        ) from None
    guard.monitors, guard.moe, guard.loader = monitors, moe, loader
    guard.rollbacks, guard.skipped, guard.recent_bad, guard.history = counters
    if guard.distributed is not None and "distributed" in state:
        guard.distributed.load_state_dict(state["distributed"])


def take_windows(guard: Any, checkpoint_state: dict[str, Any] | None) -> None:
    """After a restore: the checkpoint's detector windows, the guard's own counters kept (or
    the rollback limit could never be reached)."""
    if checkpoint_state and "monitors" in checkpoint_state:
        guard.monitors = fresh_monitors(guard, checkpoint_state["monitors"])
        guard.moe, guard.loader = health_parts(guard, checkpoint_state)
    guard.recent_bad.clear()


def fresh_monitors(guard: Any, state: Mapping[str, Any]) -> MonitorSet:
    monitors = MonitorSet(guard.monitors.config, guard.monitors.metrics)
    monitors.set_data_period(_data_period(guard.monitors))
    monitors.load_state_dict(state)
    return monitors


def health_parts(
    guard: Any, state: Mapping[str, Any]
) -> tuple[MoEHealthDetector, LoaderStallDetector]:
    """The MoE and loader detectors with their state (absent in checkpoints from before
    them)."""
    moe = MoEHealthDetector(guard.config)
    moe.load_state_dict(state.get("moe", {}))
    loader = LoaderStallDetector(guard.config)
    if "loader" in state:
        loader.load_state_dict(state["loader"])
    return moe, loader


def _data_period(monitors: MonitorSet) -> float | None:
    from trainguard.guard.detectors.oscillation import OscillationDetector

    for m in monitors.monitors.values():
        if isinstance(m, OscillationDetector):
            return m.data_period
    return None
