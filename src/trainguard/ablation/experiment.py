"""`data ablate`: the same small recipe on BASE and on each filtered variant, several seeds
each, every run scored on the use-case evals and on one held-out set; each variant's effect
against the base with a confidence interval (`stats.py`).

The runs go through `scaling.grid.run_grid` (one grid: data x seed) with the runner the CLI
injects: this module is below the run in the layers and never imports it. Resuming is the
grid's: finished runs are rows of OUT/runs.csv and are not run again, an interrupted one
resumes from its own checkpoints (a run dir resumes by itself). OUT/ablation.json (written
atomically) records what the ablation is; an OUT holding a different one is refused.

    OUT/ablation.json   the plan (base, variants, seeds, recipe, evals), data counts
    OUT/data/           heldout.jsonl + heldout.yaml, NAME.jsonl per training set
    OUT/runs/NAME-seedS the run dirs;  OUT/runs.csv  the finished runs
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainguard.ablation.heldout import (
    HELDOUT_TASK,
    KEPT_PREFIX,
    carve_heldout,
    write_heldout,
    write_training,
)
from trainguard.ablation.verdicts import BASE, compare
from trainguard.data.corpus import iter_documents
from trainguard.errors import BadInputError
from trainguard.findings import Finding
from trainguard.metrics.jsonl import read_metrics
from trainguard.scaling.grid import Runner, run_grid
from trainguard.util.atomic import atomic_write_text, check_writable
from trainguard.util.inputs import read_text
from trainguard.util.paths import refuse_overwrite
from trainguard.util.runlock import FolderLock

MANIFEST = "ablation.json"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_SCORED = ("acc", "acc_norm", "bpb")  # per-task metrics worth comparing (not n, bpb_se)


def parse_variants(items: list[str]) -> dict[str, str]:
    """`["nodup=data/nodup.jsonl", ...]` -> {name: source}, names unique and not `base`."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, source = item.partition("=")
        name = name.strip()
        if not sep or not source.strip():
            raise BadInputError(
                f"--variant {item!r} is not NAME=DATA", "write --variant nodup=data/nodup.jsonl"
            )
        if not _NAME.match(name) or name == BASE:
            raise BadInputError(
                f"--variant name {name!r} must be letters, digits, '_', '.', '-' and not {BASE!r}",
                "rename it, e.g. --variant no_boilerplate=DATA",
            )
        if name in out:
            raise BadInputError(f"--variant {name!r} is given twice", "give each name once")
        out[name] = source.strip()
    if not out:
        raise BadInputError("no --variant given", "give at least one --variant NAME=DATA")
    return out


def _abs_spec(path: str) -> str:
    # The runs read the specs from their own recipe files: a relative path must not depend
    # on where that file lies; and the same ablation named from another folder is the same.
    return str(Path(path).resolve()) if Path(path).exists() else path


def _plan(
    base: str,
    variants: dict[str, str],
    recipe: str,
    evals: list[str],
    seeds: list[int],
    overrides: list[str],
    heldout: dict[str, float],
) -> dict[str, Any]:
    return {
        "base": _abs_spec(base),
        "variants": {name: _abs_spec(source) for name, source in variants.items()},
        "recipe": str(Path(recipe).resolve()) if Path(recipe).is_file() else recipe,
        "evals": [_abs_spec(s) for s in evals],
        "seeds": seeds,
        "overrides": overrides,
        "heldout": heldout,
    }


def _read_manifest(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    fix = "give --out a new folder, or the one this ablation was started in"
    try:
        doc = json.loads(read_text(path, "ablation manifest", fix))
    except ValueError:
        raise BadInputError(f"{path} is not an ablation manifest (not JSON)", fix) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("plan"), dict):
        raise BadInputError(f"{path} is not an ablation manifest", fix)
    return doc


def ablation_inputs(
    base: str, variants: dict[str, str], recipe: str, evals: list[str]
) -> dict[str, str]:
    """Every input file of an ablation, by the name the user gave it (outputs must spare them);
    a recipe named from the library (`default`) is no file and is left out."""
    named = {"BASE": base, **{f"--variant {n}": s for n, s in variants.items()}}
    named |= {"--recipe": recipe, **{f"--evals {e}": e for e in evals}}
    return {k: v for k, v in named.items() if Path(v).exists()}


def run_ablation(
    base: str,
    variants: dict[str, str],
    recipe: str,
    evals: list[str],
    out_dir: str | Path,
    *,
    runner: Runner,
    seeds: int = 3,
    jobs: int = 1,
    overrides: list[str] | None = None,
    heldout_fraction: float = 0.1,
    heldout_max: int = 200,
    level: float = 0.95,
) -> tuple[dict[str, Any], list[Finding]]:
    """Run (or finish) the ablation; returns (report, findings)."""
    from trainguard.config.evals import EvalsConfig
    from trainguard.config.load import load_recipe
    from trainguard.evals.spec import check_examples, load_spec, require_use_case_eval

    out_dir = Path(out_dir)
    overrides = list(overrides or [])
    inputs = ablation_inputs(base, variants, recipe, evals)
    # OUT gets data/ and a run dir per cell: an input inside it could be replaced as well.
    refuse_overwrite({"--out": out_dir}, inputs, replaced_folders=["--out"])
    for spec in evals:
        check_examples(load_spec(spec))
    require_use_case_eval(EvalsConfig(specs=evals))
    first = load_recipe(recipe, overrides)  # a bad recipe or --set fails before any work
    for source in (base, *variants.values()):  # a missing or empty source fails before OUT
        next(iter_documents(source, first.data.text_field))
    held = {"fraction": heldout_fraction, "max_docs": heldout_max}
    plan = _plan(base, variants, recipe, evals, list(range(seeds)), overrides, held)
    check_writable(out_dir, folder=True)
    data_dir = out_dir / "data"
    with FolderLock(out_dir, "trainguard data ablate", flag="--out"):
        manifest_path = out_dir / MANIFEST
        manifest = _read_manifest(manifest_path)
        if manifest is not None and manifest["plan"] != plan:
            raise BadInputError(
                f"--out {out_dir} holds a different ablation (its {MANIFEST} names another "
                "base, variants, recipe, evals, seeds, --set or --heldout-docs)",
                "give --out a new folder, or repeat the command that started this one",
            )
        if manifest is None or "data" not in manifest:
            manifest = {"plan": plan}
            atomic_write_text(manifest_path, json.dumps(manifest, indent=1))
            manifest.update(
                _prepare(
                    base, variants, first.data.text_field, data_dir, heldout_fraction, heldout_max
                )
            )
            atomic_write_text(manifest_path, json.dumps(manifest, indent=1))
        specs = [*plan["evals"], str(data_dir / f"{HELDOUT_TASK}.yaml"), *manifest["kept_specs"]]
        names = {str(data_dir / f"{n}.jsonl"): n for n in [BASE, *variants]}
        run_overrides = [
            *overrides,
            "data.prepared=null",
            "data.text_field=text",
            f"evals.specs={json.dumps(specs)}",
            f"evals.interval={first.train.max_steps}",  # scored at the start and the end
        ]
        _, findings = run_grid(
            recipe,
            [("data.source", list(names)), ("train.seed", plan["seeds"])],
            out_dir / "runs",
            out_dir / "runs.csv",
            runner=runner,
            overrides=run_overrides,
            jobs=jobs,
            names=lambda cell: f"{names[cell['data.source']]}-seed{cell['train.seed']}",
            command="trainguard data ablate",
        )
        scores = _final_scores(
            out_dir / "runs", [BASE, *variants], plan["seeds"], first.train.max_steps, findings
        )
    report = {
        "out": str(out_dir),
        "heldout": manifest["heldout"],
        "data": manifest["data"],
        "seeds": seeds,
        "scores": scores,
        "variants": {},
    }
    report["variants"], more = compare(scores, list(variants), level)
    return report, findings + more


def ablate(
    base: str,
    variant_items: list[str],
    recipe: str,
    evals: list[str],
    out: Path,
    *,
    runner: Runner,
    seeds: int = 3,
    jobs: int | None = None,
    overrides: list[str] | None = None,
    heldout_max: int = 200,
    plot: Path | None = None,
    oversubscribe: bool = False,
) -> tuple[dict[str, Any], list[Finding]]:
    """`trainguard data ablate`: `run_ablation` for the variants as the command line gives
    them (`NAME=DATA` items), `jobs` runs at once (default: as many as the machine holds),
    and the effects plotted to `plot` (default OUT/effects.png). Both outputs are refused
    before any work when they would overwrite an input or cannot be written."""
    from trainguard.ablation.plot import plot_effects
    from trainguard.util.atomic import check_writable
    from trainguard.util.paths import refuse_overwrite
    from trainguard.util.processes import Machine, check_local_processes

    variants = parse_variants(variant_items)
    runs = (len(variants) + 1) * seeds
    if jobs is None:
        jobs = min(runs, Machine.here().fits())
    check_local_processes(
        jobs, f"--jobs {jobs}", lambda n: f"pass --jobs {n}", oversubscribe=oversubscribe
    )
    plot = plot or out / "effects.png"
    # Both outputs before any work (run_ablation checks --out again for callers of the API).
    inputs = ablation_inputs(base, variants, recipe, evals)
    refuse_overwrite({"--out": out, "--plot": plot}, inputs, replaced_folders=["--out"])
    check_writable(plot)
    report, findings = run_ablation(
        base,
        variants,
        recipe,
        evals,
        out,
        runner=runner,
        seeds=seeds,
        jobs=jobs,
        overrides=overrides or [],
        heldout_max=heldout_max,
    )
    report["jobs"] = jobs
    if any(v["effects"] for v in report["variants"].values()):
        report["plot"] = str(plot_effects(report["variants"], plot))
    return report, findings


def _prepare(
    base: str,
    variants: dict[str, str],
    text_field: str,
    data_dir: Path,
    fraction: float,
    max_docs: int,
) -> dict[str, Any]:
    counts, texts = carve_heldout(base, text_field, fraction, max_docs, data_dir)
    data, kept_specs = {}, []
    for name, source in {BASE: base, **variants}.items():
        written, present = write_training(
            source, text_field, set(texts), data_dir / f"{name}.jsonl"
        )
        data[name] = {"source": source, **written}
        if name != BASE and present:
            kept = [texts[k] for k in sorted(present)]
            kept_specs.append(str(write_heldout(data_dir, f"{KEPT_PREFIX}{name}", kept)))
    return {"heldout": counts, "data": data, "kept_specs": kept_specs}


def _final_scores(
    runs_dir: Path, names: list[str], seeds: list[int], max_steps: int, findings: list[Finding]
) -> dict[str, dict[str, dict[str, float]]]:
    """{data name: {seed: {metric: value}}} from each finished run's last evals row."""
    scores: dict[str, dict[str, dict[str, float]]] = {n: {} for n in names}
    for name in names:
        for seed in seeds:
            run_dir = runs_dir / f"{name}-seed{seed}"
            rows = [r for r in read_metrics(run_dir) if r.get("kind") == "evals"]
            if not rows or rows[-1].get("step") != max_steps:
                findings.append(
                    Finding.of(
                        "D432",
                        f"run {run_dir.name} has no evals at its last step {max_steps}: it "
                        "is left out of the comparison",
                        where=str(run_dir),
                    )
                )
                continue
            scores[name][str(seed)] = {
                k: float(v)
                for k, v in rows[-1].items()
                if k.rsplit("/", 1)[-1] in _SCORED and isinstance(v, int | float)
            }
    return scores
