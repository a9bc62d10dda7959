"""`trainguard data ablate` (issue 25): the statistics of a variant's effect, the held-out set
shared by every run, resuming a killed ablation, and (slow) the planted verdicts end to end."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from trainguard.ablation.experiment import run_ablation
from trainguard.ablation.heldout import HELDOUT_METRIC
from trainguard.ablation.stats import NO_DIFFERENCE, paired_effect, sign_flip_p
from trainguard.ablation.verdicts import compare
from trainguard.errors import BadInputError, Interrupted

GEN = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "he",
    "she",
    "they",
    "we",
    "you",
    "this",
]
DOM = ["zorb", "quix", "vlem", "trak", "snop", "wizz", "glon", "frup"]


def _para(r: random.Random, words: list[str], n: int = 12) -> str:
    return " ".join(r.choice(words) for _ in range(n)) + ".\n"


def _write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def planted_data(root: Path) -> dict[str, Path]:
    """BASE: general text, a domain the use-case eval asks about, and symbol noise; one
    variant without the domain, one without the noise; the eval: held-out domain text."""
    r = random.Random(0)
    docs = [("gen", "".join(_para(r, GEN) for _ in range(4))) for _ in range(60)]
    docs += [("dom", "".join(_para(r, DOM) for _ in range(4))) for _ in range(60)]
    docs += [("noise", "".join(r.choice("!@#$%^&*~`|") for _ in range(120))) for _ in range(30)]
    r.shuffle(docs)
    root.mkdir(parents=True, exist_ok=True)
    out = {
        "base": _write_jsonl(root / "base.jsonl", [t for _, t in docs]),
        "no_dom": _write_jsonl(root / "no_dom.jsonl", [t for k, t in docs if k != "dom"]),
        "no_noise": _write_jsonl(root / "no_noise.jsonl", [t for k, t in docs if k != "noise"]),
    }
    _write_jsonl(
        root / "dom_eval.jsonl", ["".join(_para(r, DOM) for _ in range(2)) for _ in range(20)]
    )
    spec = {
        "name": "dom",
        "use_case": True,
        "tasks": [{"name": "dom", "type": "perplexity", "data": "dom_eval.jsonl"}],
    }
    out["spec"] = root / "spec.yaml"
    out["spec"].write_text(yaml.safe_dump(spec))
    return out


def small_recipe(path: Path, cache: Path, steps: int = 30) -> Path:
    recipe = {
        "name": "ablate-tiny",
        "data": {"source": "stdlib", "seq_len": 32, "val_fraction": 0.1, "cache_dir": str(cache)},
        "tokenizer": {"vocab_size": 300},
        "model": {"n_layers": 1, "d_model": 32, "n_heads": 2},
        "train": {
            "max_steps": steps,
            "batch_size": 8,
            "lr": 0.01,
            "warmup_steps": 2,
            "eval_interval": 15,
            "eval_batches": 2,
            "threads": 1,
        },
        "checkpoint": {"interval": 10, "keep": 2},
        "preflight": {"enabled": False},
        "evals": {"max_examples": 20},
    }
    path.write_text(yaml.safe_dump(recipe))
    return path


# --- statistics ------------------------------------------------------------------------------


def test_consistent_shift_is_an_effect_in_the_metrics_direction() -> None:
    worse_bpb = paired_effect("dom/bpb", [1.0, 1.1, 0.9], [1.5, 1.62, 1.38])
    assert worse_bpb.verdict == "worse" and worse_bpb.low > 0
    better_acc = paired_effect("task/acc", [0.5, 0.6, 0.55], [0.7, 0.82, 0.74])
    assert better_acc.verdict == "better" and better_acc.low > 0
    assert paired_effect("dom/bpb", [1.0, 1.1], [0.8, 0.9]).verdict == "better"  # no spread


def test_noise_around_zero_is_no_detectable_difference() -> None:
    e = paired_effect("dom/bpb", [1.0, 1.1, 0.9, 1.05], [1.02, 1.07, 0.93, 1.04])
    assert e.verdict == NO_DIFFERENCE and e.low < 0 < e.high
    one = paired_effect("dom/bpb", [1.0], [3.0])  # one seed: no interval, no claim
    assert one.verdict == NO_DIFFERENCE and one.high == float("inf")


def test_sign_flip_p_is_exact() -> None:
    import numpy as np

    assert sign_flip_p(np.array([1.0, 2.0, 3.0])) == 2 / 8  # the smallest p with 3 seeds
    assert sign_flip_p(np.array([1.0, -1.0, 1.0, -1.0])) == 1.0


def test_compare_says_no_detectable_difference_and_few_seeds() -> None:
    scores = {
        "base": {str(s): {"dom/bpb": 1.0 + 0.1 * s} for s in range(3)},
        "same": {str(s): {"dom/bpb": 1.0 + 0.1 * s + (0.01 if s % 2 else -0.01)} for s in range(3)},
    }
    report, findings = compare(scores, ["same"])
    assert report["same"]["verdict"] == NO_DIFFERENCE
    codes = {f.code for f in findings}
    assert codes == {"D433", "D434"}, findings


# --- held-out set and resume (a stand-in runner: the ablation's own logic is under test) -----


def _fake_runner(calls: list[str], stop_after: int | None = None):
    """Writes the evals row a finished `trainguard run` writes: domain bpb much worse without
    the domain, seed noise otherwise."""

    def runner(recipe, run_dir: Path):
        if stop_after is not None and len(calls) >= stop_after:
            raise Interrupted(2)  # the ablation is killed here
        calls.append(run_dir.name)
        name = Path(recipe.data.source).stem
        seed = recipe.train.seed
        bpb = 1.0 + 0.05 * seed + (2.0 if name == "no_dom" else 0.0) + 0.001 * (seed % 2)
        run_dir.mkdir(parents=True)
        row = {"kind": "evals", "step": recipe.train.max_steps, "dom/bpb": bpb, "dom/n": 20.0}
        row[HELDOUT_METRIC] = 2.0 + 0.01 * seed
        (run_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        (run_dir / "specs.json").write_text(json.dumps(recipe.evals.specs))
        return SimpleNamespace(params=10, tokens=100, final_val_loss=1.0)

    return runner


def test_heldout_shared_and_excluded_and_a_killed_ablation_resumes(tmp_path: Path) -> None:
    d = planted_data(tmp_path / "d")
    recipe = small_recipe(tmp_path / "r.yaml", tmp_path / "cache")
    variants = {"no_dom": str(d["no_dom"]), "no_noise": str(d["no_noise"])}
    out = tmp_path / "out"
    args = (str(d["base"]), variants, str(recipe), [str(d["spec"])], out)
    calls: list[str] = []
    with pytest.raises(Interrupted):
        run_ablation(*args, runner=_fake_runner(calls, stop_after=4), seeds=3)
    assert len(calls) == 4
    first = list(calls)
    run_ablation(*args, runner=_fake_runner(calls), seeds=3)
    # Resumed: the four finished runs are not run again, the other five are.
    assert calls[:4] == first and len(calls) == 9 and len(set(calls)) == 9
    report, findings = run_ablation(*args, runner=_fake_runner(calls), seeds=3)
    assert len(calls) == 9  # all done: nothing runs
    assert report["variants"]["no_dom"]["verdict"] == "worse"
    assert report["variants"]["no_noise"]["verdict"] == NO_DIFFERENCE
    assert any(f.code == "D430" and f.metric == "dom/bpb" for f in findings)
    # One held-out set for all runs, in none of the training sets.
    heldout = {json.loads(x)["text"] for x in (out / "data/ablation_heldout.jsonl").open()}
    assert heldout
    for name in ("base", "no_dom", "no_noise"):
        train = {json.loads(x)["text"] for x in (out / f"data/{name}.jsonl").open()}
        assert train and not (train & heldout)
    specs = {p.read_text() for p in (out / "runs").glob("*/specs.json")}
    assert len(specs) == 1 and "ablation_heldout.yaml" in specs.pop()
    manifest = json.loads((out / "ablation.json").read_text())
    assert manifest["data"]["base"]["heldout_removed"] == len(heldout)


def test_an_out_holding_another_ablation_is_refused(tmp_path: Path) -> None:
    d = planted_data(tmp_path / "d")
    recipe = small_recipe(tmp_path / "r.yaml", tmp_path / "cache")
    out = tmp_path / "out"
    args = (str(d["base"]), {"no_dom": str(d["no_dom"])}, str(recipe), [str(d["spec"])], out)
    run_ablation(*args, runner=_fake_runner([]), seeds=2)
    before = (out / "ablation.json").read_bytes()
    calls: list[str] = []
    with pytest.raises(BadInputError, match="different ablation"):
        run_ablation(*args, runner=_fake_runner(calls), seeds=3)
    assert not calls and (out / "ablation.json").read_bytes() == before


# --- end to end: real guarded runs ------------------------------------------------------------


@pytest.mark.slow
def test_planted_variants_get_the_right_verdicts(tmp_path: Path) -> None:
    """Removing the domain the eval asks about is significantly worse on that eval; removing
    noise is not (no detectable difference, or better). Nine real 30-step runs, two at once."""
    from runhelpers import run_cli

    d = planted_data(tmp_path / "d")
    recipe = small_recipe(tmp_path / "r.yaml", tmp_path / "cache")
    out = tmp_path / "out"
    args = [
        *("data", "ablate", str(d["base"]), "--recipe", str(recipe), "--evals", str(d["spec"])),
        *("--variant", f"no_dom={d['no_dom']}", "--variant", f"no_noise={d['no_noise']}"),
        *("--seeds", "3", "--jobs", "2", "--out", str(out), "--json"),
    ]
    res = run_cli(*args, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    effects = {(name, e["metric"]): e for name, v in doc["variants"].items() for e in v["effects"]}
    assert effects[("no_dom", "dom/bpb")]["verdict"] == "worse"
    assert effects[("no_noise", "dom/bpb")]["verdict"] in (NO_DIFFERENCE, "better")
    assert doc["variants"]["no_dom"]["verdict"] == "worse"
    assert Path(doc["plot"]).read_bytes()[:4] == b"\x89PNG"
    csv_rows = (out / "runs.csv").read_text().splitlines()[1:]
    assert len(csv_rows) == 9
    assert len({r.split(",")[2] for r in csv_rows}) == 1  # the same tokens seen by every run
    for run in (out / "runs").iterdir():  # each a normal guarded run with its own record
        if run.is_dir():
            assert (run / "recipe.yaml").is_file() and (run / "metrics.jsonl").is_file()
    again = run_cli(*args, timeout=300)  # finished: nothing runs again, same answer
    assert again.returncode == 0
    assert (out / "runs.csv").read_text().splitlines()[1:] == csv_rows
    assert json.loads(again.stdout)["variants"] == doc["variants"]


def test_compare_names_a_better_variant() -> None:
    scores = {
        "base": {str(s): {"t/acc": 0.5 + 0.01 * s} for s in range(3)},
        "clean": {str(s): {"t/acc": 0.7 + 0.01 * s + 0.001 * (s % 2)} for s in range(3)},
    }
    report, findings = compare(scores, ["clean"])
    assert report["clean"]["verdict"] == "better"
    assert [f.code for f in findings if f.code == "D431"] == ["D431"]


def test_a_run_without_its_last_evals_is_left_out_by_name(tmp_path: Path) -> None:
    d = planted_data(tmp_path / "d")
    recipe = small_recipe(tmp_path / "r.yaml", tmp_path / "cache")
    inner = _fake_runner([])

    def runner(recipe, run_dir: Path):
        result = inner(recipe, run_dir)
        if run_dir.name == "no_dom-seed1":  # its metric log lost the last evals row
            (run_dir / "metrics.jsonl").write_text('{"kind": "evals", "step": 0}\n')
        return result

    args = (str(d["base"]), {"no_dom": str(d["no_dom"])}, str(recipe), [str(d["spec"])])
    report, findings = run_ablation(*args, tmp_path / "out", runner=runner, seeds=3)
    assert [f.where for f in findings if f.code == "D432"] == [
        str(tmp_path / "out/runs/no_dom-seed1")
    ]
    assert report["variants"]["no_dom"]["seeds"] == 2


def test_after_an_interrupt_no_new_run_starts_with_jobs(tmp_path: Path) -> None:
    """Two runs at a time: once one is interrupted, no queued run starts (it would train after
    the user's Ctrl-C); the run beside it ends, and the next call runs the rest."""
    import time

    d = planted_data(tmp_path / "d")
    recipe = small_recipe(tmp_path / "r.yaml", tmp_path / "cache")
    args = (str(d["base"]), {"no_dom": str(d["no_dom"])}, str(recipe), [str(d["spec"])])
    attempts: list[str] = []
    calls: list[str] = []
    inner = _fake_runner(calls)

    def runner(recipe, run_dir: Path):
        attempts.append(run_dir.name)
        if len(attempts) == 1:
            raise Interrupted(2)  # the first run is interrupted at once
        time.sleep(0.3)  # the one beside it is still running then
        return inner(recipe, run_dir)

    with pytest.raises(Interrupted):
        run_ablation(*args, tmp_path / "out", runner=runner, seeds=3, jobs=2)
    assert len(attempts) <= 2, attempts  # the interrupted run, at most the one beside it
    more: list[str] = []
    run_ablation(*args, tmp_path / "out", runner=_fake_runner(more), seeds=3, jobs=2)
    assert sorted(calls + more) == sorted(
        f"{n}-seed{s}" for n in ("base", "no_dom") for s in range(3)
    )


@pytest.mark.slow
def test_a_killed_ablation_continues_where_it_stopped(tmp_path: Path) -> None:
    """SIGKILL the ablation once a run has a checkpoint: its runs die with it (launcher
    token); the same command again resumes them from their checkpoints and finishes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from runhelpers import run_cli

    d = planted_data(tmp_path / "d")
    recipe = small_recipe(tmp_path / "r.yaml", tmp_path / "cache", steps=200)
    out = tmp_path / "out"
    args = [
        *("data", "ablate", str(d["base"]), "--recipe", str(recipe), "--evals", str(d["spec"])),
        *("--variant", f"no_dom={d['no_dom']}", "--seeds", "1", "--jobs", "2"),
        *("--out", str(out), "--json"),
    ]
    env = {**os.environ, "CI": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainguard", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not list(out.glob("runs/*/checkpoints/step-*")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the ablation ended before any checkpoint"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = run_cli(*args, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    assert doc["variants"]["no_dom"]["seeds"] == 1
    logs = "".join(p.read_text() for p in out.glob("runs/*/metrics.jsonl"))
    assert '"C150"' in logs  # at least one run resumed from its checkpoint, not from step 0
    assert len((out / "runs.csv").read_text().splitlines()) == 3
