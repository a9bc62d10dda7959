"""`trainguard doctor` on this machine: wall time of `--quick` and of the full doctor with 2
processes, and detection of each injected fault.

Each figure is a real `python -m trainguard doctor ... --nproc 2 --json` process, timed from
launch to exit (interpreter start, torch import, the launcher, every check, the report):

    quick           `doctor --quick --nproc 2`                 target: under 20 s
    full            `doctor --nproc 2`                         target: under 90 s
    faults          `doctor --quick --nproc 2` with one round per fault in one job:
                    bitflip/r1, slow/r1, bad-allreduce/r1, hang/r1 (hang timeout 5 s);
                    each round must name rank 1 with its code and nothing else

The machine (CPU model and the instruction-set flags that decide matmul speed, cores, load)
is printed first. With `--markdown PATH` the results are also written as a page section.

    python benchmarks/bench_doctor.py [--repeats 3] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

from machine import describe

EXPECTED = {"bitflip/r1": "H401", "slow/r1": "H403", "bad-allreduce/r1": "H410", "hang/r1": "H412"}


def doctor(*args: str, cwd: str) -> tuple[float, int, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard", "doctor", "--nproc", "2", "--json", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=900,
    )
    seconds = time.perf_counter() - t0
    if not proc.stdout.strip():
        raise SystemExit(f"doctor {' '.join(args)} gave no report:\n{proc.stderr[-3000:]}")
    return seconds, proc.returncode, json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--markdown", help="also write the results as markdown here")
    args = parser.parse_args()
    machine = describe()
    print(machine)
    with tempfile.TemporaryDirectory(prefix="bench-doctor-") as cwd:
        quick, full = [], []
        for i in range(args.repeats):
            s, status, report = doctor("--quick", cwd=cwd)
            quick.append(s)
            print(f"quick #{i + 1}: {s:.1f}s exit {status}, findings {len(report['findings'])}")
            s, status, report = doctor(cwd=cwd)
            full.append(s)
            print(f"full  #{i + 1}: {s:.1f}s exit {status}, findings {len(report['findings'])}")
        inject = [a for f in EXPECTED for a in ("--inject", f)]
        fault_s, status, report = doctor(
            "--quick", *inject, "--set", "distributed.hang_timeout_s=5", cwd=cwd
        )
    rows = []
    for r in report["rounds"]:
        named = sorted({(f["code"], f["rank"]) for f in r["findings"]})
        want = EXPECTED[r["inject"]]
        ok = named == [(want, 1)]
        rows.append((r["inject"], want, named, ok, r["seconds"]))
        print(
            f"{r['inject']:>18}: named {named} ({'ok' if ok else 'MISSED'}) in {r['seconds']:.1f}s"
        )
    lines = [
        f"Machine: {machine} (at the start).",
        "",
        "| run | wall time (median of runs) | runs | target |",
        "|---|---|---|---|",
        f"| `doctor --quick --nproc 2` | {statistics.median(quick):.1f} s | "
        f"{', '.join(f'{s:.1f}' for s in quick)} | < 20 s |",
        f"| `doctor --nproc 2` (full) | {statistics.median(full):.1f} s | "
        f"{', '.join(f'{s:.1f}' for s in full)} | < 90 s |",
        "",
        f"Faults, one round each in one `doctor --quick --nproc 2` job ({fault_s:.1f} s in all, "
        f"exit {status}):",
        "",
        "| injected | expected | named (code, rank) | detected | round time |",
        "|---|---|---|---|---|",
    ]
    for inject, want, named, ok, seconds in rows:
        lines.append(
            f"| `{inject}` | {want} | {named} | {'yes' if ok else 'NO'} | {seconds:.1f} s |"
        )
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
