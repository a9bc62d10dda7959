"""What the run loop calls: evals before the first step, every K steps and at the end.

    evals = EvalSchedule(recipe.evals, tokenizer, recipe.data, recipe.train.eval_interval)
    if evals.due(step, final=is_last):
        row, findings = evals.run(model, step)   # row: {"kind": "evals", "step", metrics...}
        metrics_log.write(row)
    ... checkpoint: state["evals"] = evals.state_dict()

The drift monitor's best-so-far values live in the state, so a resumed run still flags a drop
against the evaluations before the interruption.
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer

from trainguard.config.evals import EvalsConfig
from trainguard.evals.drift import EvalDriftMonitor
from trainguard.evals.runner import run_evals
from trainguard.findings import Finding


class EvalSchedule:
    def __init__(
        self,
        cfg: EvalsConfig,
        tokenizer: Tokenizer,
        data: Any | None = None,
        default_interval: int = 100,
        device: str | torch.device = "cpu",
    ) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.data = data
        self.interval = cfg.interval or default_interval
        self.device = device
        self.drift = EvalDriftMonitor(cfg.drop_alpha)
        self.last_step: int | None = None

    def due(self, step: int, final: bool = False) -> bool:
        """Before the first step (baseline), every `interval` steps, and at the end."""
        if step == self.last_step:
            return False  # the end can coincide with an interval step: evaluate once
        return step == 0 or final or step % self.interval == 0

    def run(self, model: torch.nn.Module, step: int) -> tuple[dict[str, Any], list[Finding]]:
        res = run_evals(
            model,
            self.tokenizer,
            self.cfg.specs,
            device=self.device,
            max_examples=self.cfg.max_examples,
            data=self.data,
            canaries=self.cfg.canaries,
            step=step,
        )
        self.last_step = step
        findings = res.findings + self.drift.update(step, res.metrics)
        row = {"kind": "evals", "step": step, **res.metrics, "eval_seconds": res.seconds}
        return row, findings

    def state_dict(self) -> dict[str, Any]:
        return {"drift": self.drift.state_dict(), "last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drift.load_state_dict(state["drift"])
        self.last_step = state.get("last_step")
