"""Findings -> one action for the step: the Guard's policy (apply < skip < rollback < halt).

Each finding code has an action (`DEFAULT_ACTIONS`, overridden by `guards.actions` or
`Guard(actions=...)`); the strongest among a step's findings wins. Then the escalations: skips
that keep coming (R204, `repeat_count` within `repeat_window` steps) ask for a rollback, and a
rollback past `max_rollbacks` becomes a halt (R203). The counters it keeps (rollbacks, skips,
the recent bad steps, the history of actions) live on the guard, whose state carries them.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from trainguard.findings import Finding
from trainguard.guard.config import Action, GuardsConfig
from trainguard.guard.decision import STRENGTH, Decision

DEFAULT_ACTIONS: dict[str, Action] = {
    "R101": "skip",  # non-finite loss / grad norm
    "R102": "skip",  # loss spike
    "R103": "skip",  # grad-norm spike
    "R104": "rollback",  # divergence
    "R105": "apply",  # oscillation: a data-order problem, nothing to undo in-run
    "R106": "apply",  # throughput drop: report only
    "R204": "rollback",  # repeated bad steps
}


class PolicyState(Protocol):
    """What the policy reads and counts on the guard."""

    config: GuardsConfig
    actions: dict[str, Action]
    rollbacks: int
    skipped: int
    recent_bad: deque[int]
    history: list[dict[str, Any]]
    pending_rollback: Decision | None


def strongest(actions: dict[str, Action], found: list[Finding]) -> Action:
    action: Action = "apply"
    for f in found:
        a = actions.get(f.code, "apply")
        if STRENGTH[a] > STRENGTH[action]:
            action = a
    return action


def decide(guard: PolicyState, step: int, found: list[Finding]) -> Decision:
    """The step's Decision from its findings, with the escalations and their findings (R201
    skip, R202 rollback, R203 halt, R204 repeated skips); updates the guard's counters."""
    c = guard.config
    action = strongest(guard.actions, found)
    d = Decision(step, action, list(found))
    d.rerun = action != "apply" and any(f.code in c.rerun_on for f in found)
    if action == "skip":
        guard.recent_bad.append(step)
    while guard.recent_bad and guard.recent_bad[0] <= step - c.repeat_window:
        guard.recent_bad.popleft()
    if action == "skip" and len(guard.recent_bad) >= c.repeat_count:
        d.findings.append(
            Finding.of(
                "R204",
                f"{len(guard.recent_bad)} bad steps within {c.repeat_window} steps "
                f"(steps {list(guard.recent_bad)})",
                step=step,
                data={"steps": list(guard.recent_bad)},
            )
        )
        a = guard.actions.get("R204", "rollback")
        if STRENGTH[a] > STRENGTH[action]:
            action = a
    if action == "rollback" and guard.rollbacks >= c.max_rollbacks:
        action = "halt"
        d.findings.append(
            Finding.of(
                "R203",
                f"a rollback was needed at step {step} but the run already rolled back "
                f"{guard.rollbacks} times (max_rollbacks={c.max_rollbacks})",
                step=step,
                data={"rollbacks": guard.rollbacks, "max_rollbacks": c.max_rollbacks},
            )
        )
    elif action == "halt":
        codes = sorted({f.code for f in found if guard.actions.get(f.code) == "halt"})
        d.findings.append(
            Finding.of("R203", f"findings {codes} are configured to halt the run", step=step)
        )
    elif action == "rollback":
        guard.rollbacks += 1
        bad = sorted({*guard.recent_bad, step, *_divergent_steps(found, step)})
        d.bad_steps = bad
        guard.pending_rollback = d
        guard.recent_bad.clear()
        d.findings.append(
            Finding.of(
                "R202",
                f"roll back to the last good checkpoint and skip the batches of steps {bad} "
                f"(rollback {guard.rollbacks} of at most {c.max_rollbacks})",
                step=step,
                data={"bad_steps": bad, "rollbacks": guard.rollbacks},
            )
        )
    elif action == "skip":
        guard.skipped += 1
        d.findings.append(
            Finding.of(
                "R201",
                f"update of step {step} not applied ({', '.join(f.code for f in found)})",
                step=step,
                data={"codes": [f.code for f in found]},
            )
        )
    d.action = action
    if action != "apply":
        guard.history.append({"step": step, "action": action, "bad_steps": d.bad_steps})
    return d


def _divergent_steps(found: list[Finding], step: int) -> list[int]:
    for f in found:
        if f.code == "R104" and f.data.get("since_step") is not None:
            return list(range(int(f.data["since_step"]), step + 1))
    return []
