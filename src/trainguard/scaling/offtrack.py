"""Off-track alarm: a run given a scaling-law prediction flags when its loss leaves the band.

The band comes from the gating runs' fit: for the run's model size N, the bootstrap interval
of L(N, D) at the tokens D seen so far (`PredictionBand.from_fit`). The law describes the
*final* loss of a run trained for D tokens; mid-run losses under a decaying schedule sit above
it until the schedule has annealed. So the alarm waits for `start_fraction` of the token
budget, allows a relative `margin`, and needs `patience` consecutive evaluations outside the
band before it fires: E151 above the band (the run is wasting compute), E152 below it (too
good to be true: leakage, duplicates, another tokenizer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.errors import BadInputError
from trainguard.findings import Finding
from trainguard.util.atomic import atomic_write_text


@dataclass
class PredictionBand:
    """Predicted loss and its band at increasing token counts, for one model size."""

    params: float
    tokens: list[float]
    loss: list[float]
    low: list[float]
    high: list[float]

    @classmethod
    def from_fit(
        cls, fit: Any, params: float, total_tokens: float, points: int = 64, level: float = 0.95
    ) -> PredictionBand:
        """The band of a `FitResult` for a run of `params` parameters up to `total_tokens`."""
        d = np.geomspace(max(total_tokens / 1000.0, 1.0), total_tokens, points)
        loss, low, high = fit.band(np.full_like(d, params), d, level)
        return cls(float(params), d.tolist(), loss.tolist(), low.tolist(), high.tolist())

    def at(self, tokens: float) -> tuple[float, float, float]:
        """(loss, low, high) at `tokens`, interpolated in log tokens; clamped at the ends."""
        x = np.log(np.asarray(self.tokens))
        t = float(np.log(max(tokens, 1.0)))
        return tuple(float(np.interp(t, x, v)) for v in (self.loss, self.low, self.high))

    def save(self, path: str | Path) -> Path:
        """Write the band as JSON, for `OffTrackMonitor` in the big run."""
        atomic_write_text(path, json.dumps(self.to_dict()))
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> PredictionBand:
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
            band = cls(**{k: d[k] for k in ("params", "tokens", "loss", "low", "high")})
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BadInputError(
                f"prediction band {path} is unreadable: {e}",
                "write it with `trainguard scale fit RUNS.csv --predict N,D --band FILE`",
            ) from None
        if not band.tokens or not len(band.tokens) == len(band.low) == len(band.high):
            raise BadInputError(f"prediction band {path} is empty or ragged", "rewrite it")
        return band

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "tokens": self.tokens,
            "loss": self.loss,
            "low": self.low,
            "high": self.high,
        }


class OffTrackMonitor:
    """`update(step, metrics)`; reads `tokens` and `val_loss` (eval rows), ignores other rows."""

    def __init__(
        self,
        band: PredictionBand,
        *,
        margin: float = 0.02,
        patience: int = 2,
        start_fraction: float = 0.5,
        loss_key: str = "val_loss",
    ) -> None:
        self.band = band
        self.margin = margin
        self.patience = patience
        self.start_fraction = start_fraction
        self.loss_key = loss_key
        self.above = 0
        self.below = 0
        self.fired: set[str] = set()

    def update(self, step: int, metrics: dict[str, float]) -> list[Finding]:
        loss, tokens = metrics.get(self.loss_key), metrics.get("tokens")
        if loss is None or tokens is None or not np.isfinite(loss):
            return []  # not an eval row; NaN losses are the NaN detector's business
        loss, tokens = float(loss), float(tokens)
        if tokens < self.start_fraction * self.band.tokens[-1]:
            return []
        pred, low, high = self.band.at(tokens)
        self.above = self.above + 1 if loss > high * (1 + self.margin) else 0
        self.below = self.below + 1 if loss < low * (1 - self.margin) else 0
        data = {
            "loss": loss,
            "predicted": pred,
            "low": low,
            "high": high,
            "tokens": tokens,
            "params": self.band.params,
        }
        out = []
        # Fire once per direction and excursion: a run that stays off track is one finding.
        if self.above >= self.patience and "E151" not in self.fired:
            self.fired.add("E151")
            out.append(
                Finding.of(
                    "E151",
                    f"{self.loss_key}={loss:.4g} at {tokens:.3g} tokens is above the "
                    f"predicted band [{low:.4g}, {high:.4g}] (prediction {pred:.4g}) for "
                    f"{self.above} evaluations",
                    step=step,
                    metric=self.loss_key,
                    data=data,
                )
            )
        if self.below >= self.patience and "E152" not in self.fired:
            self.fired.add("E152")
            out.append(
                Finding.of(
                    "E152",
                    f"{self.loss_key}={loss:.4g} at {tokens:.3g} tokens is below the "
                    f"predicted band [{low:.4g}, {high:.4g}] (prediction {pred:.4g})",
                    step=step,
                    metric=self.loss_key,
                    data=data,
                )
            )
        if self.above == 0:
            self.fired.discard("E151")
        if self.below == 0:
            self.fired.discard("E152")
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "above": self.above,
            "below": self.below,
            "fired": sorted(self.fired),
            "band": self.band.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.above, self.below = int(state["above"]), int(state["below"])
        self.fired = set(state["fired"])
        self.band = PredictionBand(**state["band"])
