"""MoE token drops (M105): the dropped-token fraction of each MoE layer over a few batches.

Uses the router statistics protocol (docs/architecture.md): a module with `router_stats() ->
dict` holding `tokens_routed` and `tokens_dropped` since the last `reset_router_stats()`.
"""

from __future__ import annotations

from torch import nn

from trainguard.checks._model_runner import ModelRunner
from trainguard.findings import Finding

DROP_WARN = 0.01


def router_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Modules that follow the router statistics protocol, by qualified name."""
    return {
        name or "(root)": m
        for name, m in model.named_modules()
        if callable(getattr(m, "router_stats", None))
        and callable(getattr(m, "reset_router_stats", None))
    }


def check_moe_drops(
    runner: ModelRunner, mode: str, n_batches: int = 3, threshold: float = DROP_WARN
) -> tuple[list[Finding], dict[str, dict]]:
    """M105 for layers dropping more than `threshold` of their tokens; also the per-layer
    fractions (empty when the model has no router statistics)."""
    routers = router_modules(runner.model)
    if not routers:
        return [], {}
    with runner.timed("moe_drops") as stats:
        for m in routers.values():
            m.reset_router_stats()
        for _ in range(n_batches):
            runner.forward(runner.tokens(runner.batch_size, runner.seq_len), stats)
        per_layer = {}
        for name, m in routers.items():
            s = m.router_stats()
            routed, dropped = int(s.get("tokens_routed", 0)), int(s.get("tokens_dropped", 0))
            per_layer[name] = {
                "tokens_routed": routed,
                "tokens_dropped": dropped,
                "drop_fraction": dropped / routed if routed else 0.0,
            }
            m.reset_router_stats()
    over = {n: v for n, v in per_layer.items() if v["drop_fraction"] > threshold}
    if not over:
        return [], per_layer
    worst = max(over, key=lambda n: over[n]["drop_fraction"])
    return [
        Finding.of(
            "M105",
            f"MoE token drops in {mode} mode: {len(over)} of {len(per_layer)} MoE layer(s) "
            f"dropped more than {threshold:.0%} of their tokens over {n_batches} batches "
            f"(worst {worst}: {over[worst]['drop_fraction']:.1%})",
            where=f"{mode} mode",
            data={"mode": mode, "layers": per_layer, "threshold": threshold},
        )
    ], per_layer
