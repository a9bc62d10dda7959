"""R601-R604: MoE router health from the router statistics of each step.

Input: the router statistics protocol's form (`model/moe.py`, docs/architecture.md), one step's
counts per MoE layer: `{layer name: {"tokens_routed", "tokens_dropped", "expert_counts"}}`
(and optionally `"top_k"`),
as `collect_router_stats(model, reset=True)` returns after the step's forwards. Plain numbers:
the detector never touches a tensor, so it costs the loop nothing beyond reading the counts
(`trainguard run` reads them in the step's one host sync).

Per layer and step: the dropped share `tokens_dropped / tokens_routed`, and each expert's share
of the computed assignments. Findings (each fires once per episode and re-arms when the
condition clears):
- R601: the worst layer drops more than `moe_drop_max` for `moe_patience` steps in a row;
- R602: an expert computes nothing for `moe_dead_patience` steps in a row;
- R603: the top_k busiest experts of a layer compute at least `moe_collapse_share` of its
  assignments for `moe_patience` steps in a row (top_k from the stats' optional `top_k` key,
  1 without it);
- R604: the layer's imbalance (busiest share times n_experts; 1 balanced), smoothed by an EMA
  of span `moe_imbalance_span`, stays more than `moe_imbalance_rise` above its lowest smoothed
  value for `moe_patience` steps, after `moe_min_steps` steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainguard.findings import Finding
from trainguard.guard.config import MonitorsConfig

RouterStats = Mapping[str, Mapping[str, Any]]


def router_summary(stats: RouterStats) -> dict[str, float]:
    """The step row's MoE columns over every layer: `moe_drop_frac` (the worst layer's dropped
    share), `moe_load_max` and `moe_load_min` (the busiest and idlest expert's share of its
    layer's computed assignments times n_experts: 1 is balanced, 0 a dead expert)."""
    drop, hi, lo = 0.0, 0.0, float("inf")
    for s in stats.values():
        counts = [int(c) for c in s.get("expert_counts", [])]
        routed, total = int(s.get("tokens_routed", 0)), sum(counts)
        if routed > 0:
            drop = max(drop, int(s.get("tokens_dropped", 0)) / routed)
        if total > 0 and counts:
            hi = max(hi, max(counts) * len(counts) / total)
            lo = min(lo, min(counts) * len(counts) / total)
    if lo == float("inf"):
        return {}
    return {"moe_drop_frac": drop, "moe_load_max": hi, "moe_load_min": lo}


class _Layer:
    """What the detector remembers of one MoE layer between steps."""

    def __init__(self, n_experts: int) -> None:
        self.zero_run = [0] * n_experts  # consecutive steps each expert computed nothing
        self.dead_fired = [False] * n_experts
        self.drop_run = self.collapse_run = self.rise_run = 0
        self.drop_fired = self.collapse_fired = self.rise_fired = False
        self.ema: float | None = None
        self.best: float | None = None
        self.seen = 0

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> _Layer:
        layer = cls(len(state["zero_run"]))
        for k, v in state.items():
            setattr(layer, k, v)
        return layer


class MoEHealthDetector:
    """`update(step, router_stats)` returns R601-R604 findings; see the module docstring."""

    def __init__(self, config: MonitorsConfig | None = None) -> None:
        self.c = config or MonitorsConfig()
        self.layers: dict[str, _Layer] = {}

    def update(self, step: int, stats: RouterStats | None) -> list[Finding]:
        out: list[Finding] = []
        for name, s in (stats or {}).items():
            counts = [int(c) for c in s.get("expert_counts", [])]
            routed = int(s.get("tokens_routed", 0))
            if not counts or routed <= 0:
                continue  # no forward through this layer this step: nothing to judge
            layer = self.layers.get(name)
            if layer is None or len(layer.zero_run) != len(counts):
                layer = self.layers[name] = _Layer(len(counts))
            top_k = int(s.get("top_k", 1))  # optional key: assignments per token
            dropped = int(s.get("tokens_dropped", 0))
            out += self._layer(step, name, layer, routed, dropped, counts, top_k)
        return out

    def _layer(
        self,
        step: int,
        name: str,
        layer: _Layer,
        routed: int,
        dropped: int,
        counts: list[int],
        top_k: int,
    ) -> list[Finding]:
        c, out = self.c, []
        n, total = len(counts), sum(counts)
        layer.seen += 1
        # R601: drops.
        frac = dropped / routed
        layer.drop_run = layer.drop_run + 1 if frac > c.moe_drop_max else 0
        if layer.drop_run == 0:
            layer.drop_fired = False
        elif layer.drop_run >= c.moe_patience and not layer.drop_fired:
            layer.drop_fired = True
            out.append(
                Finding.of(
                    "R601",
                    f"MoE layer {name} dropped {frac:.1%} of its token-to-expert assignments "
                    f"({dropped} of {routed}) at step {step}, above {c.moe_drop_max:.0%} for "
                    f"{layer.drop_run} steps",
                    step=step,
                    metric="moe_drop_frac",
                    data={"layer": name, "drop_frac": frac, "dropped": dropped, "routed": routed},
                )
            )
        # R602: dead experts.
        for e, k in enumerate(counts):
            layer.zero_run[e] = layer.zero_run[e] + 1 if k == 0 else 0
            if k > 0:
                layer.dead_fired[e] = False
            elif layer.zero_run[e] >= c.moe_dead_patience and not layer.dead_fired[e]:
                layer.dead_fired[e] = True
                out.append(
                    Finding.of(
                        "R602",
                        f"expert {e} of MoE layer {name} computed no token for "
                        f"{layer.zero_run[e]} steps (up to step {step})",
                        step=step,
                        metric="moe_load_min",
                        data={"layer": name, "expert": e, "steps": layer.zero_run[e]},
                    )
                )
        if total <= 0:
            return out
        shares = sorted((k / total for k in counts), reverse=True)
        # R603: collapse onto the top_k busiest experts (top_k: assignments per token).
        top_k = max(1, min(n - 1, top_k))
        top = sum(shares[:top_k])
        layer.collapse_run = layer.collapse_run + 1 if top >= c.moe_collapse_share else 0
        if layer.collapse_run == 0:
            layer.collapse_fired = False
        elif layer.collapse_run >= c.moe_patience and not layer.collapse_fired:
            layer.collapse_fired = True
            busiest = sorted(range(n), key=lambda e: -counts[e])[:top_k]
            out.append(
                Finding.of(
                    "R603",
                    f"MoE layer {name}'s router collapsed: expert(s) {busiest} computed "
                    f"{top:.1%} of its assignments for {layer.collapse_run} steps (up to step "
                    f"{step})",
                    step=step,
                    metric="moe_load_max",
                    data={"layer": name, "experts": busiest, "share": top},
                )
            )
        # R604: imbalance rising against its own smoothed best.
        imbalance = shares[0] * n
        alpha = 2.0 / (c.moe_imbalance_span + 1)
        layer.ema = imbalance if layer.ema is None else layer.ema + alpha * (imbalance - layer.ema)
        if layer.seen < c.moe_min_steps:
            return out
        layer.best = layer.ema if layer.best is None else min(layer.best, layer.ema)
        rising = layer.ema > layer.best * (1 + c.moe_imbalance_rise)
        layer.rise_run = layer.rise_run + 1 if rising else 0
        if layer.rise_run == 0:
            layer.rise_fired = False
        elif layer.rise_run >= c.moe_patience and not layer.rise_fired:
            layer.rise_fired = True
            out.append(
                Finding.of(
                    "R604",
                    f"MoE layer {name}'s load imbalance is rising: smoothed {layer.ema:.2f} "
                    f"(busiest expert's share x {n}; 1 is balanced), "
                    f"{layer.ema / layer.best - 1:.0%} above its best {layer.best:.2f}, for "
                    f"{layer.rise_run} steps",
                    step=step,
                    metric="moe_load_max",
                    data={"layer": name, "imbalance": layer.ema, "best": layer.best},
                )
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {name: layer.state_dict() for name, layer in self.layers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.layers = {name: _Layer.from_state(s) for name, s in (state or {}).items()}
