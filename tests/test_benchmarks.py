"""`make bench`: benchmarks/run_all.py knows every benchmark, runs them and writes the summary;
every benchmark prints the machine line (CPU model and flags) beside its figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import machine  # noqa: E402
import run_all  # noqa: E402


def test_run_all_lists_every_benchmark_script() -> None:
    scripts = {p.stem for p in BENCH.glob("bench_*.py")}
    assert set(run_all.BENCHMARKS) == scripts


def test_every_benchmark_prints_the_machine_line() -> None:
    for path in sorted(BENCH.glob("bench_*.py")):
        assert "describe()" in path.read_text(), f"{path.name} does not print machine.describe()"


def test_machine_line_names_the_cpu_and_its_flags() -> None:
    line = machine.describe()
    assert line.startswith(f"CPU: {machine.cpu_model()}, ")
    flags = machine.cpu_flags()
    assert all(f in line for f in flags)
    if Path("/proc/cpuinfo").exists():  # Linux: the flags come from the kernel's list
        have = Path("/proc/cpuinfo").read_text().split()
        assert all(f in have for f in flags)


def test_run_all_writes_a_summary_row_per_benchmark(tmp_path: Path) -> None:
    out = tmp_path / "summary.md"
    res = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--only", "bench_monitors", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert text.strip() == res.stdout.strip()
    assert f"Machine: {machine.describe().split(';')[0]}" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| bench_monitors |"))
    assert "| ok |" in row and "us/step" in row


def test_a_failing_benchmark_is_a_row_and_exit_1(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(run_all.BENCHMARKS, "bench_monitors", ["--no-such-flag"])
    row = run_all.run_one("bench_monitors", timeout=300)
    assert row["status"] == "failed (exit 2)" and "no-such-flag" in str(row["last"])
