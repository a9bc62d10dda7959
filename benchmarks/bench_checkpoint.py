"""Checkpoint store costs, each side by side with its baseline in the same run.

1. local save (checksums + manifest + fsync + rename + retention) vs a raw sequential write +
   fsync of the same bytes to the same disk;
2. restore (load_latest: manifest + size + xxh3 of every file) vs a raw sequential read;
3. S3 (a moto server on 127.0.0.1 through s3fs): synchronous save vs `save_async`, measuring
   the time the caller (the training loop) is blocked, and upload throughput.

    .venv/bin/python benchmarks/bench_checkpoint.py --mb 64 --repeats 5 \\
        --markdown docs/benchmarks/checkpoint.md

Reads are from the page cache (the files were just written); the raw read baseline has the
same advantage. Medians over repeats; ratios are candidate / baseline.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from machine import describe

from trainguard.checkpoint import CheckpointStore, RetryPolicy  # noqa: E402


def make_payload(total_mb: int) -> dict[str, bytes]:
    """Incompressible bytes split like a real checkpoint: weights 1/3, optimizer 2/3."""
    total = total_mb << 20
    rnd = os.urandom(total)
    return {
        "model.safetensors": rnd[: total // 3],
        "optimizer.pt": rnd[total // 3 :],
        "loader.json": b'{"epoch": 0, "position": 4096}',
    }


def writer(files: dict[str, bytes]):
    def write(folder: Path) -> None:
        for name, data in files.items():
            (folder / name).write_bytes(data)

    return write


def raw_write(folder: Path, files: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        with open(folder / name, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def raw_read(folder: Path, files: dict[str, bytes]) -> int:
    n = 0
    for name in files:
        with open(folder / name, "rb") as f:
            while chunk := f.read(1 << 20):
                n += len(chunk)
    return n


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_local(files: dict[str, bytes], repeats: int, base: Path) -> list[tuple]:
    mb = sum(len(d) for d in files.values()) / 2**20
    store = CheckpointStore(str(base / "store"), keep=2)
    unpruned = CheckpointStore(str(base / "unpruned"), keep=repeats + 1)  # retention deletes none
    save_t, nodel_t, raw_t, load_t, read_t = [], [], [], [], []
    for i in range(repeats):
        # Interleaved, and the order rotates each round, so drift in machine load and in the
        # disk's writeback state hits every variant alike.
        raw_dir = base / f"raw-{i}"
        jobs = [
            (save_t, lambda i=i: store.save(i, writer(files))),
            (nodel_t, lambda i=i: unpruned.save(i, writer(files))),
            (raw_t, lambda d=raw_dir: raw_write(d, files)),
        ]
        for out, job in jobs[i % 3 :] + jobs[: i % 3]:
            out.append(timed(job))
        shutil.rmtree(raw_dir)
        load_t.append(timed(store.load_latest))
        raw_write(base / "raw-read", files)
        read_t.append(timed(lambda: raw_read(base / "raw-read", files)))
    shutil.rmtree(base / "unpruned")
    s, r = statistics.median(save_t), statistics.median(raw_t)
    nd = statistics.median(nodel_t)
    lo, rd = statistics.median(load_t), statistics.median(read_t)
    return [
        ("local save, keep=2 (deletes the oldest step)", s, mb / s, "raw write+fsync", r, mb / r),
        ("local save, nothing to delete", nd, mb / nd, "raw write+fsync", r, mb / r),
        ("restore: load_latest (verify all)", lo, mb / lo, "raw sequential read", rd, mb / rd),
    ]


def bench_s3(files: dict[str, bytes], repeats: int, base: Path, compute_s: float) -> list[tuple]:
    from s3_server import make_bucket, s3_server, storage_options

    mb = sum(len(d) for d in files.values()) / 2**20
    rows = []
    with s3_server() as endpoint:
        make_bucket(endpoint, "bench")
        opts = storage_options(endpoint)
        for verify in (True, False):
            policy = RetryPolicy(verify_checksums=verify)
            sync_store = CheckpointStore(
                f"s3://bench/sync-{verify}",
                keep=2,
                cache_dir=str(base / f"cs{verify}"),
                storage_options=opts,
                retry=policy,
            )
            async_store = CheckpointStore(
                f"s3://bench/async-{verify}",
                keep=2,
                cache_dir=str(base / f"ca{verify}"),
                storage_options=opts,
                retry=policy,
            )
            sync_stall, async_stall, async_total = [], [], []
            for i in range(repeats):
                sync_stall.append(timed(lambda i=i, st=sync_store: st.save(i, writer(files))))
                # The loop: save_async, then keep computing; the upload overlaps the compute.
                t0 = time.perf_counter()
                handle = async_store.save_async(i, writer(files))
                async_stall.append(handle.stall_s)
                time.sleep(compute_s)  # stands in for training steps (releases the GIL)
                handle.result()
                async_total.append(time.perf_counter() - t0)
            async_store.close()
            s, a = statistics.median(sync_stall), statistics.median(async_stall)
            tag = "checksum read-back" if verify else "size check only"
            rows.append(
                (
                    f"S3 save_async: caller blocked ({tag})",
                    a,
                    mb / a,
                    f"S3 save sync: caller blocked ({tag})",
                    s,
                    mb / s,
                )
            )
    return rows


def render(rows: list[tuple], mb: float, s3_mb: float, repeats: int, cmd: str) -> str:
    lines = [
        "## Checkpoint store",
        "",
        f"Command: `{cmd}`  ",
        f"Payload: {mb:.0f} MiB local, {s3_mb:.0f} MiB S3, in 3 files (incompressible); median of "
        f"{repeats} runs; machine: "
        f"{describe()} (the load average says how shared). Ratio = candidate time / "
        "baseline time (lower is better for the candidate).",
        "",
        "| candidate | median s | MiB/s | baseline | median s | MiB/s | ratio |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for cand, ct, cr, basel, bt, br in rows:
        lines.append(
            f"| {cand} | {ct:.3f} | {cr:.0f} | {basel} | {bt:.3f} | {br:.0f} | {ct / bt:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64, help="checkpoint size in MiB (local)")
    ap.add_argument("--s3-mb", type=int, default=16, help="checkpoint size in MiB (S3/moto)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--compute-s", type=float, default=2.0, help="simulated training time after save_async"
    )
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    ap.add_argument("--markdown", default=None, help="write the results section here")
    args = ap.parse_args()
    print(describe())

    base = Path(args.dir or tempfile.mkdtemp(prefix="bench-ckpt-"))
    try:
        rows = bench_local(make_payload(args.mb), args.repeats, base / "local")
        if not args.no_s3:
            rows += bench_s3(make_payload(args.s3_mb), args.repeats, base / "s3", args.compute_s)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    cmd = "python benchmarks/bench_checkpoint.py " + " ".join(sys.argv[1:])
    text = render(rows, args.mb, args.s3_mb, args.repeats, cmd)
    print(text)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
