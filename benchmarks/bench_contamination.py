"""Contamination check: recall and precision on planted edit kinds, and throughput, new vs old.

A planted set (`planted_set`): background training documents of random words, each with three
common phrases of a small shared pool sprinkled in; eval examples of 40-100 words, each opening
and closing with a phrase of the pool (a template), of five kinds:
- exact: the example copied verbatim into a training document;
- change10: copied with every tenth word replaced by a fresh word (one word in ten changed);
- insert12: copied with a fresh word inserted after every twelfth word;
- unrelated (negative): in no training document; its two phrases are in many, incidentally;
- boilerplate (negative): a training document holds its two template phrases and a 10-word span
  of its text (shorter than 13 words: a quote, not a copy).
The old code (`--baseline-rev`, extracted with `git archive`) and the new code run in fresh
processes on the same files, alternating rounds; each times `find_contamination` over the
training documents held in memory (reading excluded) and reports what it flagged. With
--spark, the new Spark engine on local[1] and local[2] (warm: the second run of a session,
reading included) and whether its report equals the local engine's.

    python benchmarks/bench_contamination.py --examples 40 --background 1500 --repeats 3 \
        --spark --markdown docs/benchmarks/contamination.md
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

from machine import describe  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KINDS = ("exact", "change10", "insert12", "unrelated", "boilerplate")
POSITIVE = {"exact", "change10", "insert12"}


def planted_set(examples: int, background: int, seed: int = 0) -> tuple[list, list, list[str]]:
    """(training records, eval texts, kind of each eval text)."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=7)) for _ in range(20000)]
    phrases = [" ".join(rng.choices(vocab[:300], k=8)) for _ in range(12)]
    fresh = iter(f"fresh{i}" for i in range(10**9))

    def words(n: int) -> list[str]:
        return rng.choices(vocab, k=n)

    def background_doc() -> list[str]:
        w = words(300)
        for p in rng.sample(phrases, 3):
            at = rng.randrange(len(w))
            w[at:at] = p.split()
        return w

    train = [background_doc() for _ in range(background)]
    texts, kinds = [], []
    for kind in KINDS:
        for _ in range(examples):
            head, tail = rng.sample(phrases, 2)
            content = words(rng.randint(40, 100))
            ex = head.split() + content + tail.split()
            if kind == "exact":
                planted = ex
            elif kind == "change10":
                planted = [next(fresh) if (i + 1) % 10 == 0 else w for i, w in enumerate(ex)]
            elif kind == "insert12":
                planted = []
                for i, w in enumerate(ex):
                    planted.append(w)
                    if (i + 1) % 12 == 0:
                        planted.append(next(fresh))
            elif kind == "boilerplate":
                at = rng.randrange(len(content) - 10)
                planted = head.split() + words(30) + content[at : at + 10] + tail.split()
            else:
                planted = None
            if planted is not None:  # in a document of its own, inside random text
                host = words(rng.randint(20, 200)) + planted + words(rng.randint(20, 200))
                train.insert(rng.randrange(len(train) + 1), host)
            texts.append(" ".join(ex))
            kinds.append(kind)
    records = [{"id": f"bg-{i}", "text": " ".join(w)} for i, w in enumerate(train)]
    return records, texts, kinds


def worker(src: str, train: str, evals: str) -> dict:
    """Run in a fresh process with `src` first on the path: one timed scan."""
    sys.path.insert(0, src)
    from trainguard.data.corpus import Document
    from trainguard.dedup.contamination import EvalTask, find_contamination

    records = [json.loads(line) for line in Path(train).read_text().splitlines()]
    docs = [Document(r["id"], r["text"], "s") for r in records]
    texts = json.loads(Path(evals).read_text())
    task = EvalTask("planted", "all", texts)
    cpu = time.process_time()
    t = time.perf_counter()
    report = find_contamination([task], docs)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    rows = report.tasks[0].to_dict()["contaminated"]
    return {"wall_s": wall, "cpu_s": cpu, "rows": rows}


def spark_worker(src: str, train: str, evals: str, cores: int) -> dict:
    sys.path.insert(0, src)
    os.environ.setdefault(
        "PYSPARK_SUBMIT_ARGS",
        "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' pyspark-shell",
    )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from trainguard.dedup.contamination import EvalTask
    from trainguard.dedup.contamination_spark import find_contamination_spark

    t = time.perf_counter()
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    startup = time.perf_counter() - t
    task = EvalTask("planted", "all", json.loads(Path(evals).read_text()))
    t = time.perf_counter()
    find_contamination_spark([task], train, spark=spark)
    first = time.perf_counter() - t
    t = time.perf_counter()
    report = find_contamination_spark([task], train, spark=spark)
    warm = time.perf_counter() - t
    spark.stop()
    rows = report.tasks[0].to_dict()["contaminated"]
    return {"cores": cores, "startup_s": startup, "first_s": first, "warm_s": warm, "rows": rows}


def run(mode: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, mode, *args], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def quality(rows: list[dict], kinds: list[str]) -> dict:
    flagged = {r["example"]: r for r in rows}
    out = {}
    for kind in KINDS:
        idx = [i for i, k in enumerate(kinds) if k == kind]
        out[kind] = {
            "flagged": sum(i in flagged for i in idx),
            "of": len(idx),
            "rules": sorted({flagged[i]["match"] for i in idx if i in flagged}),
        }
    tp = sum(out[k]["flagged"] for k in POSITIVE)
    fp = sum(out[k]["flagged"] for k in KINDS if k not in POSITIVE)
    out["precision"] = tp / (tp + fp) if tp + fp else 1.0
    out["recall"] = tp / sum(out[k]["of"] for k in POSITIVE)
    return out


def containment_by_kind(src: str, texts: list[str], kinds: list[str], train: list) -> dict:
    """The new rule's measure: per kind, min/median/max of each example's highest exact 5-gram
    containment in one training document (the evidence for the threshold)."""
    sys.path.insert(0, src)
    from trainguard.data.corpus import Document
    from trainguard.dedup.contamination import EvalTask, eval_index

    index = eval_index([EvalTask("p", "all", texts)])
    scan = index.scan(Document(r["id"], r["text"], "s") for r in train)
    out = {}
    for kind in KINDS:
        vals = [float(scan.edit_best[i]) for i, k in enumerate(kinds) if k == kind]
        out[kind] = (min(vals), statistics.median(vals), max(vals))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=40, help="eval examples per kind")
    ap.add_argument("--background", type=int, default=1500, help="training documents")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline-rev", default="98eb882", help="the old code (a git revision)")
    ap.add_argument("--spark", action="store_true")
    ap.add_argument("--markdown")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--spark-worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    if args.spark_worker:
        *rest, cores = args.spark_worker
        print(json.dumps(spark_worker(*rest, int(cores))))
        return
    print(describe())
    load_before = os.getloadavg()
    records, texts, kinds = planted_set(args.examples, args.background)
    with tempfile.TemporaryDirectory() as d:
        old_src = Path(d) / "old"
        old_src.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.baseline_rev, "src"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(old_src)], input=archive, check=True)
        new_src = str(ROOT / "src")
        train = Path(d) / "train.jsonl"
        train.write_text("".join(json.dumps(r) + "\n" for r in records))
        evals = Path(d) / "evals.json"
        evals.write_text(json.dumps(texts))
        mb = sum(len(r["text"].encode()) for r in records) / 1e6
        times: dict[str, list[float]] = {"old": [], "new": []}
        rows: dict[str, list] = {}
        for _ in range(args.repeats):
            for name, src in (("old", str(old_src / "src")), ("new", new_src)):
                r = run("--worker", src, str(train), str(evals))
                times[name].append(r["cpu_s"])
                rows[name] = r["rows"]
        spark = []
        if args.spark:
            for cores in (1, 2):
                r = run("--spark-worker", new_src, str(train), str(evals), str(cores))
                r["same_as_local"] = r.pop("rows") == rows["new"]
                r["mb_per_s"] = mb / r["warm_s"]
                spark.append(r)
    load_after = os.getloadavg()
    result = {
        "mb": mb,
        "docs": len(records),
        "examples": len(texts),
        "load": [load_before[0], load_after[0]],
        "old_cpu_s": times["old"],
        "new_cpu_s": times["new"],
        "old_mb_per_cpu_s": mb / statistics.median(times["old"]),
        "new_mb_per_cpu_s": mb / statistics.median(times["new"]),
        "quality_old": quality(rows["old"], kinds),
        "quality_new": quality(rows["new"], kinds),
        "containment": containment_by_kind(new_src, texts, kinds, records),
        "spark": spark,
    }
    result["ratio"] = result["new_mb_per_cpu_s"] / result["old_mb_per_cpu_s"]
    print(json.dumps(result, indent=2))
    cmd = "python " + " ".join(["benchmarks/bench_contamination.py", *sys.argv[1:]])
    text = markdown(result, cmd)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text("# Benchmarks: train/eval contamination\n\n" + text)


def markdown(r: dict, cmd: str) -> str:
    lines = [
        "## Contamination: edited copies and throughput",
        "",
        f"Command: `{cmd}`",
        "",
        f"Machine: {describe()}. **Shared and heavily loaded**: load average "
        f"{r['load'][0]:.1f} at the start, {r['load'][1]:.1f} at the end (other engineers' test "
        "suites); CPU seconds of the scanning process are the measure, medians of the rounds, "
        "old and new alternating in fresh processes; wall-clock figures follow the load.",
        "",
        f"Planted set: {r['docs']} training documents ({r['mb']:.1f} MB of text), "
        f"{r['examples']} eval examples, {r['examples'] // len(KINDS)} of each kind (see the "
        "script's docstring).",
        "",
        "| kind | old: flagged | new: flagged (rule) | new: 5-gram containment min / median "
        "/ max |",
        "|---|---|---|---|",
    ]
    for kind in KINDS:
        o, n, c = r["quality_old"][kind], r["quality_new"][kind], r["containment"][kind]
        lines.append(
            f"| {kind}{'' if kind in POSITIVE else ' (negative)'} | {o['flagged']}/{o['of']} "
            f"| {n['flagged']}/{n['of']} ({', '.join(n['rules']) or '-'}) "
            f"| {c[0]:.2f} / {c[1]:.2f} / {c[2]:.2f} |"
        )
    qo, qn = r["quality_old"], r["quality_new"]
    lines += [
        "",
        f"Recall over the three copy kinds: old {qo['recall']:.3f}, new **{qn['recall']:.3f}**; "
        f"precision: old {qo['precision']:.3f}, new **{qn['precision']:.3f}**.",
        "",
        f"Local engine throughput (CPU, scan only): old {r['old_mb_per_cpu_s']:.2f} MB/s "
        f"(rounds {', '.join(f'{t:.2f}' for t in r['old_cpu_s'])} s), new "
        f"{r['new_mb_per_cpu_s']:.2f} MB/s (rounds {', '.join(f'{t:.2f}' for t in r['new_cpu_s'])}"
        f" s): **{r['ratio']:.2f}x**, with the new rule's extra lookups included.",
        "",
    ]
    if r["spark"]:
        lines += [
            "Spark engine (`find_contamination_spark`, reading the JSONL included; each master "
            "in a fresh process, warm = the second run of the session):",
            "",
            "| master | start-up s | first run s | warm run s | MB/s (warm, wall) | same report "
            "as local |",
            "|---|---|---|---|---|---|",
        ]
        for s in r["spark"]:
            lines.append(
                f"| local[{s['cores']}] | {s['startup_s']:.1f} | {s['first_s']:.1f} "
                f"| {s['warm_s']:.1f} | {s['mb_per_s']:.2f} | {s['same_as_local']} |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
