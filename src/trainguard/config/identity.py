"""What makes two runs "the same recipe" for a reference curve: every key except the
operational ones, and the recipe hash built from them.

Operational keys say how a run is operated, observed or where its files are, never what it
computes: the thread count, the log/eval/checkpoint intervals, evaluations, metrics sinks,
paths, pre-flight, guards, timeouts. A clean run's training loss at every step is the same
whatever their values (bitwise on CPU, except for the thread count, which changes the order of
reductions and so the last bits). Everything else, including keys added later, is part of the
recipe: a new key counts until it is declared operational here.

The data source is a path: the data's content is compared separately, through the prepared
data's identity (tokenizer and shard checksums), which catches a changed corpus or tokenizer
under the same path.
"""

from __future__ import annotations

from typing import Any

from trainguard.util.hashing import stable_json_hash

# Dotted keys, or section prefixes ending in ".", that are operational. The one definition:
# the recipe hash, `trainguard reference`, the run's reference check and docs/recipes.md use it.
OPERATIONAL_KEYS: tuple[str, ...] = (
    "name",
    "description",
    "data.source",
    "data.cache_dir",
    # Where prepared data is read from: its content is compared through the data identity.
    "data.prepared",
    "data.storage_options",
    "data.node_cache_dir",
    "data.node_cache_max_gb",
    "train.threads",
    "train.schedule_on_extend",  # acts only when a resume extends max_steps
    "train.log_interval",
    "train.eval_interval",
    "train.eval_batches",
    "checkpoint.",
    "preflight.",
    "guards.",
    "evals.",
    "prediction.",
    "metrics.",
    "reference.",
    # Not distributed.fp32_reduce: it changes how bf16 gradients are summed.
    "distributed.backend",
    "distributed.init_timeout_s",
    "distributed.warmup_steps",
    "distributed.collective_timeout_s",
    "distributed.hang_timeout_s",
    "distributed.step_barrier",
    "distributed.sync_timeout_s",
    "distributed.replica_check_interval",
    "distributed.replica_check_optimizer",
    "distributed.straggler_interval",
    "distributed.straggler_threshold",
    "distributed.straggler_history",
    "distributed.straggler_steps",
    "distributed.straggler_min_lag_s",
    # How long a collective may wait before it is called hung: never what a step computes.
    "distributed.derive_timeouts",
    "distributed.timeout_factor",
    "distributed.timeout_percentile",
    "distributed.timeout_floor_s",
    "distributed.checkpoint_timeout_s",
    "distributed.eval_timeout_s",
)


# Keys added after recipes were recorded, with the default that computes what the recipe did
# before they existed: left out of the curve at that default, so that a recipe (and its
# reference curve) keeps its hash; any other value counts.
ADDED_LATER: dict[str, object] = {"train.batch_ramp": None}


def is_operational(key: str) -> bool:
    """True when the dotted recipe key `key` never changes a clean run's loss curve."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in OPERATIONAL_KEYS)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`. Mapping-valued fields (guards.actions) flatten too."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def curve_recipe(recipe: dict[str, Any]) -> dict[str, Any]:
    """The resolved recipe (`recipe_to_dict`) as flat `{dotted key: value}`, operational keys
    left out: what a reference curve depends on."""
    return {
        k: v
        for k, v in sorted(flatten(recipe).items())
        if not is_operational(k) and not (k in ADDED_LATER and v == ADDED_LATER[k])
    }


def recipe_hash(recipe: dict[str, Any]) -> str:
    """16 hex digits naming the curve a recipe produces (`curve_recipe`, order-independent)."""
    return stable_json_hash(curve_recipe(recipe))


def curve_differences(reference: dict[str, Any], run: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """`{key: (reference value, run value)}` for every curve key that differs; both arguments
    are `curve_recipe` outputs (flat)."""
    keys = sorted(set(reference) | set(run))
    return {k: (reference.get(k), run.get(k)) for k in keys if reference.get(k) != run.get(k)}


def operational_keys_markdown() -> str:
    """The operational keys for docs/recipes.md."""
    items = ", ".join(f"`{k}*`" if k.endswith(".") else f"`{k}`" for k in OPERATIONAL_KEYS)
    return (
        "## Operational keys\n\n"
        "These keys say how a run is operated, observed or where its files are, never what it "
        "computes, so they are left out of the recipe hash that names a reference curve "
        "(`trainguard reference record`, `reference.path`): a run that differs from its "
        "reference only in them is the same recipe. Every other key, including keys added "
        "later, is part of the recipe. The data's content is compared through the prepared "
        f"data's identity instead of `data.source`.\n\n{items}\n"
    )
