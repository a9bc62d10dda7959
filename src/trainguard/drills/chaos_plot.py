"""The timeline of a chaos soak: each round's kept steps against the wall clock, each restart as
a shaded span from the dead process's last record to its first resumed step, labelled with the
fault that caused it, and the data faults marked at their step. Written with
`util.atomic.save_figures` (whole files, never through a link)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.drills.chaos import Round
from trainguard.metrics.jsonl import read_metrics
from trainguard.util.atomic import save_figures


def timeline_figure(rounds: list[Round]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rounds), 1, figsize=(8, 2.6 * len(rounds)), squeeze=False)
    for ax, r in zip(axes[:, 0], rounds, strict=True):
        rows = [x for x in read_metrics(r.run_dir) if x.get("kind") == "step"]
        t0 = min((x["time"] - x.get("step_time_s", 0.0) for x in rows), default=0.0)
        ax.plot([x["time"] - t0 for x in rows], [x["step"] for x in rows], ".", ms=3, color="C2")
        by_step = {x["step"]: x["time"] - t0 for x in rows}
        restarts = r.goodput.get("restarts") or []
        process = [f for f in r.faults if f.fault.ends_process and f.recovery_s is not None]
        for f, rs in zip(process, restarts, strict=False):
            ax.axvspan(rs["began"] - t0, rs["resumed_at"] - t0, color="C3", alpha=0.25)
            ax.text(rs["began"] - t0, f.fault.step, f" {f.fault.kind}@{f.fault.step}", fontsize=7)
        for f in r.faults:
            if not f.fault.ends_process and f.fault.step in by_step:
                ax.plot([by_step[f.fault.step]], [f.fault.step], "x", color="C1", ms=8)
                ax.text(by_step[f.fault.step], f.fault.step, f" {f.fault.kind}", fontsize=7)
        share = r.goodput.get("goodput")
        title = (
            f"round {r.number}: goodput {share:.0%}" if share is not None else f"round {r.number}"
        )
        ax.set_title(title + (", final weights equal the reference" if r.bitwise_equal else ""))
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_timeline(rounds: list[Round], path: Path) -> Path:
    save_figures([timeline_figure(rounds)], [path])
    return path
