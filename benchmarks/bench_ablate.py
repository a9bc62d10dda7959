"""Wall time of the default small ablation: `trainguard data ablate` with two planted variants
(one removes the domain the use-case eval asks about, one removes symbol noise), 3 seeds each,
9 runs of a 30-step one-layer recipe, `--jobs` at a time (default: what the machine holds).

    .venv/bin/python benchmarks/bench_ablate.py [--seeds 3] [--steps 30] [--jobs N]

Prints the machine, the load average before and after, the wall time of the whole ablation
and the verdicts (which the slow test `tests/test_ablation.py` checks).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from machine import describe  # noqa: E402

GEN = "the a of and to in is it that for on with as was he she they we you this".split()  # noqa: SIM905
DOM = ["zorb", "quix", "vlem", "trak", "snop", "wizz", "glon", "frup"]


def make_data(root: Path) -> dict[str, Path]:
    r = random.Random(0)

    def para(words: list[str]) -> str:
        return " ".join(r.choice(words) for _ in range(12)) + ".\n"

    docs = [("gen", "".join(para(GEN) for _ in range(4))) for _ in range(60)]
    docs += [("dom", "".join(para(DOM) for _ in range(4))) for _ in range(60)]
    docs += [("noise", "".join(r.choice("!@#$%^&*~`|") for _ in range(120))) for _ in range(30)]
    r.shuffle(docs)

    def write(name: str, texts: list[str]) -> Path:
        path = root / name
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        return path

    out = {
        "base": write("base.jsonl", [t for _, t in docs]),
        "no_dom": write("no_dom.jsonl", [t for k, t in docs if k != "dom"]),
        "no_noise": write("no_noise.jsonl", [t for k, t in docs if k != "noise"]),
    }
    write("dom_eval.jsonl", ["".join(para(DOM) for _ in range(2)) for _ in range(20)])
    spec = {
        "name": "dom",
        "use_case": True,
        "tasks": [{"name": "dom", "type": "perplexity", "data": "dom_eval.jsonl"}],
    }
    out["spec"] = root / "spec.yaml"
    out["spec"].write_text(yaml.safe_dump(spec))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args()
    print(describe())
    with tempfile.TemporaryDirectory(prefix="bench-ablate-") as tmp:
        root = Path(tmp)
        d = make_data(root)
        recipe = {
            "name": "ablate-tiny",
            "data": {"seq_len": 32, "val_fraction": 0.1, "cache_dir": str(root / "cache")},
            "tokenizer": {"vocab_size": 300},
            "model": {"n_layers": 1, "d_model": 32, "n_heads": 2},
            "train": {
                "max_steps": args.steps,
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
        (root / "r.yaml").write_text(yaml.safe_dump(recipe))
        cmd = [
            sys.executable,
            "-m",
            "trainguard",
            "data",
            "ablate",
            str(d["base"]),
            "--variant",
            f"no_dom={d['no_dom']}",
            "--variant",
            f"no_noise={d['no_noise']}",
            "--recipe",
            str(root / "r.yaml"),
            "--evals",
            str(d["spec"]),
            "--seeds",
            str(args.seeds),
            "--out",
            str(root / "out"),
            "--json",
        ]
        if args.jobs:
            cmd += ["--jobs", str(args.jobs)]
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        load1 = os.getloadavg()[0]
        if proc.returncode != 0:
            sys.exit(f"ablation failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        doc = json.loads(proc.stdout)
        runs = (len(doc["variants"]) + 1) * args.seeds
        print(
            f"{runs} runs of {args.steps} steps, --jobs {doc['jobs']}: {wall:.1f} s wall "
            f"(load average {load0:.1f} before, {load1:.1f} after)"
        )
        for name, v in doc["variants"].items():
            print(f"  {name}: {v['verdict']} on the use-case eval")


if __name__ == "__main__":
    main()
