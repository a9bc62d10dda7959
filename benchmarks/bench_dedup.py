"""Dedup throughput and quality: trainguard's local engine vs datasketch MinHashLSH, side by side.

Both get the same planted corpus (background documents plus near duplicates at known Jaccard
similarities), the same normalisation, word 5-gram shingles and LSH parameters (112 hash functions
as 14 bands of 8 rows, threshold 0.8), on one core. datasketch runs its usual dedup loop: per
document `MinHash.update_batch` over the shingles (permutations built once), then `query` and
`insert` into `MinHashLSH`.
Reported: documents per second (median of --repeats runs, alternating), recall on planted pairs
at or above 0.85 similarity, and false merges (planted 0.3 and 0.5 pairs, and background
documents, that were removed). With --spark, the Spark engine with 1 and 2 local cores and its
start-up cost.

    .venv/bin/python benchmarks/bench_dedup.py --docs 4000 --repeats 3 --spark \
        --markdown docs/benchmarks/dedup.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")  # one core for both contenders

from machine import describe  # noqa: E402

from trainguard.dedup.local import dedup_file, dedup_texts  # noqa: E402
from trainguard.dedup.lsh import DedupParams  # noqa: E402
from trainguard.dedup.normalise import normalise  # noqa: E402
from trainguard.dedup.planted import planted_corpus  # noqa: E402

# The near-threshold group is planted at 0.86 so that its true similarity (0.858) is inside the
# recall set (>= 0.85); a planted 0.85 lands at 0.849.
SIMILARITIES = (0.95, 0.9, 0.86, 0.5, 0.3)


def quality(removed: set[int], planted, n: int) -> dict[str, float]:
    dup = planted.must_remove(0.85)
    dissimilar = planted.must_keep(0.55)
    copies = {i for i, *_ in planted.pairs}
    background = set(range(n)) - copies
    return {
        "recall": len(removed & dup) / len(dup),
        "false_merge_pairs": len(removed & dissimilar) / len(dissimilar),
        "false_merge_background": len(removed & background) / len(background),
    }


def run_trainguard(texts: list[str], params: DedupParams) -> set[int]:
    def batches():
        for i in range(0, len(texts), 2048):
            yield texts[i : i + 2048], [None] * len(texts[i : i + 2048])

    n, exact_rep, near_root, *_ = dedup_texts(batches, params)
    return set(exact_rep) | set(near_root)


def run_datasketch(texts: list[str], params: DedupParams) -> set[int]:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(
        threshold=params.threshold, num_perm=params.num_perm, params=(params.bands, params.rows)
    )
    # Reuse one set of permutations: datasketch's documented way to build many MinHashes.
    perms = MinHash(num_perm=params.num_perm, seed=params.seed).permutations
    removed = set()
    for i, text in enumerate(texts):
        words = normalise(text).split(" ")
        k = params.ngram
        shingles = [" ".join(words[j : j + k]).encode() for j in range(max(1, len(words) - k + 1))]
        m = MinHash(
            num_perm=params.num_perm, seed=params.seed, permutations=perms, scheme="affine32"
        )
        m.update_batch(shingles)
        if lsh.query(m):
            removed.add(i)
        else:
            lsh.insert(i, m)
    return removed


def bench_local(docs: int, repeats: int) -> dict:
    planted = planted_corpus(
        n_background=docs,
        similarities=SIMILARITIES,
        copies_each=max(10, docs // 100),
        exact=docs // 50,
        normalised=docs // 50,
        seed=0,
    )
    texts = [r["text"] for r in planted.records]
    params = DedupParams()
    times: dict[str, list[float]] = {"trainguard": [], "datasketch": []}
    cpu: dict[str, list[float]] = {"trainguard": [], "datasketch": []}
    found = {}
    for _ in range(repeats):
        for name, fn in (("trainguard", run_trainguard), ("datasketch", run_datasketch)):
            t, c = time.perf_counter(), time.process_time()
            found[name] = fn(texts, params)
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    n = len(texts)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "in.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in planted.records))
        t = time.perf_counter()
        dedup_file(src, Path(d) / "out.jsonl")
        file_s = time.perf_counter() - t
    out = {"docs": n, "words_per_doc": 200, "file_docs_per_s": n / file_s}
    for name in times:
        med, med_cpu = statistics.median(times[name]), statistics.median(cpu[name])
        out[name] = {
            "median_s": med,
            "docs_per_s": n / med,
            "median_cpu_s": med_cpu,
            "docs_per_cpu_s": n / med_cpu,
            **quality(found[name], planted, n),
        }
    out["ratio_cpu"] = out["trainguard"]["docs_per_cpu_s"] / out["datasketch"]["docs_per_cpu_s"]
    out["ratio_wall"] = out["trainguard"]["docs_per_s"] / out["datasketch"]["docs_per_s"]
    return out


def spark_worker(src: str, cores: int) -> dict:
    """One Spark engine measurement in a fresh process (so start-up includes the JVM)."""
    from trainguard.dedup.spark import dedup_file_spark
    from trainguard.util.spark import get_spark

    t = time.perf_counter()
    spark = get_spark(f"local[{cores}]")
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.parallelize([1]).count()  # first job: JVM and a Python worker up
    startup = time.perf_counter() - t
    out = Path(src).with_name(f"sp{cores}.jsonl")
    t = time.perf_counter()
    dedup_file_spark(src, out, spark=spark)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    rep = dedup_file_spark(src, out, spark=spark)
    warm = time.perf_counter() - t
    spark.stop()
    return {
        "cores": cores,
        "startup_s": startup,
        "first_run_s": cold,
        "run_s": warm,
        "rows": [r.to_dict() for r in rep.rows],
    }


def bench_spark(docs: int) -> list[dict]:
    import subprocess

    planted = planted_corpus(
        n_background=docs, similarities=SIMILARITIES, copies_each=max(10, docs // 100), seed=1
    )
    rows = []
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "in.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in planted.records))
        t = time.perf_counter()
        local = dedup_file(src, Path(d) / "local.jsonl")
        local_s = time.perf_counter() - t
        for cores in (1, 2):
            proc = subprocess.run(
                [sys.executable, __file__, "--spark-worker", str(src), str(cores)],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            r["same_as_local"] = r.pop("rows") == [x.to_dict() for x in local.rows]
            r["docs_per_s"] = len(planted.records) / r["run_s"]
            r["local_engine_s"] = local_s
            r["docs"] = len(planted.records)
            rows.append(r)
    return rows


def markdown(local: dict, spark: list[dict] | None, cmd: str) -> str:
    lines = [
        "## Deduplication",
        "",
        f"Command: `{cmd}`",
        "",
        f"Machine: {describe()} (shared with other jobs). "
        f"Corpus: {local['docs']} documents of about 200 words, planted near duplicates at "
        "Jaccard 0.95/0.9/0.86 and dissimilar pairs at 0.5/0.3. Parameters for both: word "
        "5-grams, 112 hashes as 14 bands x 8 rows, threshold 0.8, one core (both are "
        "single-threaded). Medians of the runs, contenders alternating in one run. On a shared "
        "machine the process CPU time is the fair one-core measure; wall-clock figures follow "
        "the other jobs' load.",
        "",
        "| engine | docs per CPU-s | docs per wall-s | recall (>= 0.85) | false merges "
        "(0.3/0.5 pairs) | false merges (background) |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("trainguard", "datasketch"):
        r = local[name]
        lines.append(
            f"| {name} | {r['docs_per_cpu_s']:.0f} | {r['docs_per_s']:.0f} | {r['recall']:.3f} | "
            f"{r['false_merge_pairs']:.3f} | {r['false_merge_background']:.4f} |"
        )
    lines += [
        "",
        f"Throughput ratio trainguard / datasketch: **{local['ratio_cpu']:.2f}x** in CPU time "
        f"({local['ratio_wall']:.2f}x wall-clock). End to end (`dedup_file`, JSONL read and "
        f"write included, wall-clock): {local['file_docs_per_s']:.0f} docs/s.",
        "",
    ]
    if spark:
        lines += [
            f"Spark engine on {spark[0]['docs']} documents, each master in a fresh process, so "
            "start-up includes the JVM (session creation and a first one-task job); the local "
            f"engine takes {spark[0]['local_engine_s']:.1f} s on the same file in the same run:",
            "",
            "| Spark master | start-up s | first run s | warm run s | docs/s (warm) | "
            "same kept as local |",
            "|---|---|---|---|---|---|",
        ]
        for r in spark:
            lines.append(
                f"| local[{r['cores']}] | {r['startup_s']:.1f} | {r['first_run_s']:.1f} "
                f"| {r['run_s']:.1f} | {r['docs_per_s']:.0f} | {r['same_as_local']} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=4000, help="background documents")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spark", action="store_true", help="also time the Spark engine")
    ap.add_argument("--spark-docs", type=int, default=2000)
    ap.add_argument("--markdown", help="write the results section to this file")
    ap.add_argument("--spark-worker", nargs=2, metavar=("SRC", "CORES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    print(describe())
    if args.spark_worker:
        print(json.dumps(spark_worker(args.spark_worker[0], int(args.spark_worker[1]))))
        return
    local = bench_local(args.docs, args.repeats)
    print(json.dumps(local, indent=2))
    spark = bench_spark(args.spark_docs) if args.spark else None
    if spark:
        print(json.dumps(spark, indent=2))
    cmd = "python " + " ".join(["benchmarks/bench_dedup.py", *sys.argv[1:]])
    text = markdown(local, spark, cmd)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text("# Benchmarks: deduplication\n\n" + text)


if __name__ == "__main__":
    main()
