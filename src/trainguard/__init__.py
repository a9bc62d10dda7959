"""trainguard: keeps LLM training runs from failing silently.

The public objects load lazily so that `import trainguard` stays cheap for the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.util.lazy import lazy_getattr

__version__ = "0.1.0"

_LAZY = {
    "Guard": "trainguard.guard.core",
    "GuardsConfig": "trainguard.guard.config",
    "Decision": "trainguard.guard.decision",
    "DistributedGuards": "trainguard.guard.distributed.guards",
    "ElasticSampler": "trainguard.data.sampler",
    "Watchdog": "trainguard.guard.watchdog",
    "Finding": "trainguard.findings",
    "Checkpointer": "trainguard.checkpoint.checkpointer",
    "run_recipe": "trainguard.train.guarded_run",
    "Callback": "trainguard.train.callback",
    "RunResult": "trainguard.train.outcome",
    "ExitStatus": "trainguard.errors",
    "load_recipe": "trainguard.config.load",
    "collect_router_stats": "trainguard.model.moe",
}

# The same names for type checkers and IDEs, which do not run `__getattr__`; never imported at
# run time (tests/test_layers.py keeps this block equal to `_LAZY`). `X as X`: a re-export.
if TYPE_CHECKING:
    from trainguard.checkpoint.checkpointer import Checkpointer as Checkpointer
    from trainguard.config.load import load_recipe as load_recipe
    from trainguard.data.sampler import ElasticSampler as ElasticSampler
    from trainguard.errors import ExitStatus as ExitStatus
    from trainguard.findings import Finding as Finding
    from trainguard.guard.config import GuardsConfig as GuardsConfig
    from trainguard.guard.core import Guard as Guard
    from trainguard.guard.decision import Decision as Decision
    from trainguard.guard.distributed.guards import DistributedGuards as DistributedGuards
    from trainguard.guard.watchdog import Watchdog as Watchdog
    from trainguard.model.moe import collect_router_stats as collect_router_stats
    from trainguard.train.callback import Callback as Callback
    from trainguard.train.guarded_run import run_recipe as run_recipe
    from trainguard.train.outcome import RunResult as RunResult

__all__ = sorted(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
