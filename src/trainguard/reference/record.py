"""`trainguard reference record RUN_DIR`: a finished run's curve as a `ReferenceCurve`.

Read from the run dir: `recipe.yaml` (re-validated, so keys added since carry their defaults and
the hash matches today's runs of the same recipe), `metrics.jsonl` (every step's loss and batch
hash, the evaluations, the environment logged at the start, findings), and the newest verified
checkpoint's data identity. Nothing in the run dir is changed.
"""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

from trainguard.checkpoint.target import RUN_RECIPE, open_checkpoint, run_checkpoint_root
from trainguard.config.identity import curve_recipe, recipe_hash
from trainguard.config.load import read_recipe_yaml, recipe_to_dict, validate_recipe
from trainguard.errors import BadInputError, TrainguardError
from trainguard.findings import Finding
from trainguard.metrics.jsonl import METRICS_FILE, read_metrics
from trainguard.reference.curve import MIN_STEPS, ReferenceCurve

_FINISH = "finish it first: run the same `trainguard run` command again with --run-dir {run_dir}"


def run_inputs(run_dir: Path) -> dict[str, str | Path]:
    """What recording reads, for `util.paths.refuse_overwrite`: the run dir and its checkpoint
    root (which `checkpoint.dir` may put elsewhere; a URL is skipped)."""
    root = run_checkpoint_root(run_dir) if run_dir.is_dir() else None
    return {
        "RUN_DIR": run_dir,
        "its checkpoint.dir": root.removeprefix("file://") if root else None,
    }


def _recipe(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_RECIPE
    if not path.is_file():
        raise BadInputError(
            f"{run_dir} is not a run dir: it has no {RUN_RECIPE}",
            "give the --run-dir of a finished `trainguard run`",
        )
    fix = f"restore {path} (trainguard wrote it when the run started)"
    raw = read_recipe_yaml(path, "the run's recipe", fix)
    return recipe_to_dict(validate_recipe(raw, str(path)))


def _last_by_step(rows: list[dict[str, Any]], kind: str) -> dict[int, dict[str, Any]]:
    """Rows of `kind` by step; a step logged twice (replayed after a crash) keeps its last."""
    out: dict[int, dict[str, Any]] = {}
    for r in rows:
        if r.get("kind") == kind and isinstance(r.get("step"), int):
            out[r["step"]] = r
    return out


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def record_reference(
    run_dir: str | Path, skipped: list[str] | None = None
) -> tuple[ReferenceCurve, list[Finding]]:
    """The reference of the finished run in `run_dir`, and R507 findings when the run was not
    clean. BadInputError (exit 2) for a missing, unfinished or damaged run. `skipped`, when
    given, receives the metrics.jsonl lines left out ("path:line: why")."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BadInputError(
            f"run dir {run_dir} does not exist", "give the --run-dir of a finished `trainguard run`"
        )
    recipe = _recipe(run_dir)
    max_steps = recipe["train"]["max_steps"]
    rows = read_metrics(run_dir, skipped)
    steps = _last_by_step(rows, "step")
    ended = any(r.get("kind") == "event" and r.get("event") == "end" for r in rows)
    done = max(steps, default=-1) + 1  # step rows count from 0
    if done < max_steps or not ended:
        why = f"{done} of {max_steps} steps" if done < max_steps else "no end event"
        raise BadInputError(
            f"run {run_dir} is unfinished ({why}): a reference is a finished run",
            _FINISH.format(run_dir=run_dir),
        )
    missing = [s for s in range(max_steps) if s not in steps]
    if missing:
        raise BadInputError(
            f"{run_dir / METRICS_FILE} lacks the rows of {len(missing)} step(s) (first: "
            f"{missing[0]}): the curve is incomplete",
            "record from a run whose metrics.jsonl is intact",
        )
    order = list(range(max_steps))
    bad = [s for s in order if not _finite(steps[s].get("loss"))]
    if bad:
        raise BadInputError(
            f"run {run_dir} has a non-finite loss at step {bad[0]}: not a known-good run",
            "record from a clean run of the recipe",
        )
    start = next((r for r in rows if r.get("kind") == "event" and r.get("event") == "start"), None)
    env = (start or {}).get("env")
    if not isinstance(env, dict):
        raise BadInputError(
            f"{run_dir / METRICS_FILE} has no start event with the environment",
            "record from a run written by `trainguard run` with its metrics.jsonl intact",
        )
    findings = _not_clean(rows)
    evals = [
        {k: r.get(k) for k in ("step", "val_loss", "val_bpb")}
        for _, r in sorted(_last_by_step(rows, "eval").items())
    ]
    curve = ReferenceCurve(
        recipe_name=str(recipe.get("name", "")),
        recipe_hash=recipe_hash(recipe),
        recipe=curve_recipe(recipe),
        env=env,
        steps=order,
        loss=[steps[s]["loss"] for s in order],
        batch_hash=[steps[s].get("batch_hash") for s in order],
        single_environment=not any(f.code == "H101" for f in _logged_findings(rows)),
        data_identity=_data_identity(run_dir),
        evals=evals,
        source={
            "run_dir": str(run_dir.resolve()),
            "recorded_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "final_step": max_steps,
        },
    )
    if len(curve.steps) < MIN_STEPS:
        raise BadInputError(
            f"run {run_dir} has {len(curve.steps)} steps; a reference needs at least {MIN_STEPS}",
            "record from a run of more steps (the comparison learns the noise from the curve)",
        )
    return curve, findings


def _logged_findings(rows: list[dict[str, Any]]) -> list[Finding]:
    return [Finding.from_dict(r) for r in rows if r.get("kind") == "finding" and r.get("code")]


def _not_clean(rows: list[dict[str, Any]]) -> list[Finding]:
    logged = _logged_findings(rows)
    skips = sorted({f.step for f in logged if f.code == "R201" and f.step is not None})
    rollbacks = [r for r in rows if r.get("kind") == "event" and r.get("event") == "rollback"]
    drift = [f for f in logged if f.code == "H101"]
    what = []
    if skips:
        what.append(f"its guards skipped {len(skips)} update(s) (first at step {skips[0]})")
    if rollbacks:
        what.append(f"it rolled back {len(rollbacks)} time(s)")
    if drift:
        what.append(f"it resumed under other software ({drift[0].message})")
    if not what:
        return []
    return [
        Finding.of(
            "R507",
            "the recorded run is not a clean run: " + "; ".join(what),
            data={"skipped_steps": skips, "rollbacks": len(rollbacks), "drift": bool(drift)},
        )
    ]


def _data_identity(run_dir: Path) -> dict[str, Any] | None:
    """The data identity the newest verified checkpoint recorded; None without one (the run's
    data is then not compared)."""
    try:
        loaded, _ = open_checkpoint(run_dir)
    except TrainguardError:
        return None
    if loaded is None:
        return None
    identity = (loaded.manifest.get("meta") or {}).get("data_identity")
    return identity if isinstance(identity, dict) else None
