"""`trainguard checkpoint convert RUN_DIR`: a run dir of an earlier release, in the one
checkpoint format.

Before this release `trainguard run` wrote its own files into each step folder
(model.safetensors, optimizer.pt, rng.pt, trainer.json, loader.json, recipe.yaml, env.json;
layout "trainguard-run/1", or no layout entry at all before the Checkpointer). The run now
refuses such a step (exit 2, `checkpoint/checkpointer_load.py:LegacyRunCheckpoint`) and names this
command. It rewrites every such step as the Checkpointer's FlatLayout holds the run's state
(run_state.py): the same tensors, counters, skipped ranges, guard, callbacks, schedule and
every rank's generator states, so the resumed run goes on bitwise as the old release would
have. Nothing is lost: each old step folder is verified first (a damaged one is not converted
but named; the run's retention sets it aside in quarantine/ as any damaged step), moved to
`CHECKPOINT_ROOT/attic/<stamp>/` (never deleted), and the new one is committed through the
store (temp name, manifest last) and verified. The run dir's lock is held throughout, so no
run writes meanwhile.

This module is the only reader of the old files; nothing else knows them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import safe_open

from trainguard.checkpoint.checkpointer_load import FORMAT, LEGACY_RUN_LAYOUT, is_legacy_run_step
from trainguard.checkpoint.fit import generator_state
from trainguard.checkpoint.folder import inspect_local_folder, listed_path, open_listed
from trainguard.checkpoint.layout import FlatLayout, Part
from trainguard.checkpoint.local import ATTIC
from trainguard.checkpoint.manifest import parse_step_dirname
from trainguard.checkpoint.store import CheckpointStore
from trainguard.checkpoint.target import run_checkpoint_root
from trainguard.config.identity import recipe_hash
from trainguard.config.schema import Recipe
from trainguard.data.sampler import ElasticSampler
from trainguard.errors import BadInputError, CorruptError
from trainguard.findings import has_errors
from trainguard.util.nofollow import move_within
from trainguard.util.paths import is_remote, local_path
from trainguard.util.runlock import FolderLock

KEYS = ("model", "optimizer", "sampler", "run", "guard", "callbacks")


@dataclass
class Converted:
    """What `convert_run_dir` did: steps rewritten, where the old folders went, steps left."""

    steps: list[int] = field(default_factory=list)
    attic: Path | None = None
    left: dict[int, str] = field(default_factory=dict)  # step -> why it was not converted


class _Saved:
    """A state read from the old files, saved as the object that produced it would be."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def state_dict(self) -> Any:
        return self.state

    def load_state_dict(self, state: Any) -> None:  # never loaded: classify asks for it
        self.state = state


def convert_run_dir(run_dir: Path) -> Converted:
    """Convert every verified step of the old format under `run_dir`'s checkpoint root (see
    the module docstring); BadInputError for a run dir it cannot convert."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise BadInputError(f"{run_dir} does not exist", "give the run dir of a trainguard run")
    if not run_dir.is_dir():
        raise BadInputError(f"{run_dir} is not a run dir", "give the run dir of a trainguard run")
    root = run_checkpoint_root(run_dir)
    if is_remote(root):
        raise BadInputError(
            f"the checkpoints of {run_dir} are at {root}, not on this machine",
            "copy the checkpoint folder to a local path, convert it there, and copy it back",
        )
    folder = local_path(root)
    if not folder.is_dir():
        raise BadInputError(f"{run_dir} has no checkpoints ({root})", "give a run dir with some")
    done = Converted()
    with FolderLock(run_dir, "trainguard checkpoint convert"):
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        store = CheckpointStore(str(folder), keep=1_000_000)  # retention prunes nothing here
        for step, path in sorted(_step_folders(folder)):
            manifest, findings = inspect_local_folder(path, step)
            if manifest is None or has_errors(findings) or not is_legacy_run_step(manifest):
                if manifest is not None and is_legacy_run_step(manifest):
                    done.left[step] = "; ".join(f"{f.code}: {f.message}" for f in findings)
                continue
            try:
                snapshot, meta = _read_old_step(path, step, manifest)
            except (CorruptError, BadInputError, ValueError, KeyError, TypeError) as e:
                done.left[step] = f"{type(e).__name__}: {e}"
                continue
            moved = move_within(folder, path.name, f"{ATTIC}/{stamp}/{path.name}")
            done.attic = moved.parent
            store.save(step, lambda d, s=snapshot: FlatLayout().write(d, s), meta)
            problems = [f for f in inspect_local_folder(path, step)[1] if f.severity == "error"]
            if problems:  # never expected: the store verified it; the old one is in the attic
                raise CorruptError(
                    f"converted step {step} does not verify: {problems[0].message}",
                    f"the old step is kept in {moved}; move it back to {path}",
                )
            done.steps.append(step)
    return done


def _step_folders(root: Path) -> list[tuple[int, Path]]:
    return [
        (step, p)
        for p in root.iterdir()
        if (step := parse_step_dirname(p.name)) is not None and p.is_dir() and not p.is_symlink()
    ]


# -- the old files (read only here) ----------------------------------------------------------
def _json(folder: Path, name: str) -> Any:
    with open_listed(folder, name) as f:
        return json.loads(f.read().decode("utf-8"))


def _torch(folder: Path, name: str) -> Any:
    with open_listed(folder, name) as f:
        return torch.load(f, weights_only=True)  # tensors and plain values only


def _model(folder: Path) -> dict[str, torch.Tensor]:
    """The weights; a tied name safetensors stored once (its metadata names the kept one)
    points at the same tensor, as in the module's state_dict."""
    with listed_path(folder, "model.safetensors") as path, safe_open(path, framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        tied = f.metadata() or {}
    for removed, kept in tied.items():
        if kept in state and removed not in state:
            state[removed] = state[kept]
    return state


def _read_old_step(folder: Path, step: int, manifest: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(FlatLayout snapshot, manifest meta) of an old step folder."""
    trainer = _json(folder, "trainer.json")
    if trainer.get("step") != step:
        raise ValueError(f"trainer.json says step {trainer.get('step')}, the manifest {step}")
    with open_listed(folder, "recipe.yaml") as f:
        raw_recipe = yaml.safe_load(f.read().decode("utf-8"))
    recipe = Recipe.model_validate(raw_recipe)
    old_meta = dict(manifest.get("meta") or {})
    callbacks = trainer.get("callbacks")
    if callbacks is None:  # before the callbacks: the eval hook's state, one object
        evals = trainer.get("evals") or {}
        callbacks = {"evals": evals, "validation": evals, "reference": evals.get("reference") or {}}
    run = {
        "step": step,
        "tokens_seen": int(trainer["tokens_seen"]),
        "schedule": trainer.get("schedule") or [],
    }
    optimizer = _torch(folder, "optimizer.pt")
    # A set of optimizers (Muon) saved its parts by name; one torch optimizer its own dict.
    one = isinstance(optimizer, dict) and "param_groups" in optimizer
    values = {
        "model": ("module", _Saved(_model(folder))),
        "optimizer": ("optimizer" if one else "stateful", _Saved(optimizer)),
        "sampler": ("stateful", _Saved(_sampler(recipe, trainer, old_meta, folder))),
        "run": ("stateful", _Saved(run)),
        "guard": ("stateful", _Saved(trainer.get("guard") or {})),
        "callbacks": ("stateful", _Saved(callbacks)),
    }
    parts = [Part(k, values[k][0], values[k][1]) for k in KEYS]
    rng = _rng(folder, trainer)
    env = _json(folder, "env.json")
    meta = {
        **old_meta,
        "recipe": raw_recipe,
        "recipe_hash": recipe_hash(raw_recipe),
        "env": env,
        "converted_from": old_meta.get("checkpointer", {}).get("layout", LEGACY_RUN_LAYOUT),
        "checkpointer": {
            "format": FORMAT,
            "layout": FlatLayout.name,
            "sharded": False,
            "world_size": len(rng),
            "keys": {p.key: p.kind for p in parts},
        },
    }
    return FlatLayout().snapshot(parts, rng, False), meta


def _sampler(
    recipe: Recipe, trainer: dict[str, Any], meta: dict[str, Any], folder: Path
) -> dict[str, Any]:
    """The ElasticSampler state the run had: its order (seed, dataset size, batch) from the
    recipe and the data identity, the skipped ranges from trainer.json."""
    t = recipe.train
    tokens = (((meta.get("data_identity") or {}).get("splits") or {}).get("train") or {}).get(
        "n_tokens"
    )
    if isinstance(tokens, int):
        num_samples = max(0, (tokens - 1) // recipe.data.seq_len)
    else:  # before the data identity: the loader's epoch gives the dataset size
        loader = _json(folder, "loader.json")
        if not loader.get("epoch"):
            raise ValueError("neither the data identity nor loader.json gives the dataset size")
        num_samples = (loader["global_position"] - loader["position"]) // loader["epoch"]
    sampler = ElasticSampler(
        num_samples,
        global_batch_size=t.batch_ramp or t.batch_size * t.grad_accum,
        seed=t.seed,
    )
    state = sampler.state_dict()
    state["skipped_positions"] = [list(r) for r in trainer.get("skipped_positions", [])]
    problem = sampler.state_problem(state)
    if problem:
        raise ValueError(f"trainer.json's skipped ranges: {problem}")
    return state


def _rng(folder: Path, trainer: dict[str, Any]) -> list[dict[str, Any]]:
    saved = _torch(folder, "rng.pt")
    if isinstance(saved, dict) and "ranks" in saved:
        return [generator_state(s) for s in saved["ranks"]]
    return [generator_state(saved, trainer.get("python_random"))]  # one rank, numpy unsaved
