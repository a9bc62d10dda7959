"""trainguard: keeps LLM training runs from failing silently.

The public objects load lazily so that `import trainguard` stays cheap for the CLI.
"""

from __future__ import annotations

from trainguard.util.lazy import lazy_getattr

__version__ = "0.1.0"

_LAZY = {
    "Guard": "trainguard.guard",
    "GuardsConfig": "trainguard.monitors.config",
    "Decision": "trainguard.guards.decision",
    "DistributedGuards": "trainguard.guards.distributed",
    "ElasticSampler": "trainguard.data.sampler",
    "Watchdog": "trainguard.monitors.watchdog",
    "Finding": "trainguard.findings",
    "Checkpointer": "trainguard.checkpoint.checkpointer",
    "run_recipe": "trainguard.train.run",
    "load_recipe": "trainguard.config.load",
    "collect_router_stats": "trainguard.model.moe",
}

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
