"""`trainguard watch METRICS`: the in-run detectors over any trainer's metric log.

Each chosen metric's detectors (`MonitorSet`), and the data-loader stall (R605) from the rows'
`data_time_s` and `step_time_s` where they have them (`trainguard run`'s step rows do; so may
any loop that logs the two). The MoE router codes (R601-R604) need each step's per-expert
counts: a run record's step rows hold them (`router`) when the loop passed `router_stats` to
the guard; other logs do not, and those codes are judged in the run only."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import typer
import yaml
from pydantic import ValidationError

from trainguard.cli._episodes import emit_episodes, episode_counts, episodes_table
from trainguard.cli.common import console, exit_status
from trainguard.errors import ConfigError, DataError
from trainguard.findings import EpisodeGrouper, Finding, has_errors, step_interval
from trainguard.guard.config import MonitorsConfig
from trainguard.guard.detectors.loader import LoaderStallDetector
from trainguard.guard.detectors.metric_names import choose_metrics
from trainguard.guard.detectors.moe import MoEHealthDetector
from trainguard.guard.detectors.monitor_set import MonitorSet, infer_kind
from trainguard.guard.detectors.zero_loss import ZeroLossDetector
from trainguard.metrics.formats import ACCEPTED, detect_format, follow_rows, read_rows
from trainguard.metrics.logfile import LogState, normalise


def _config(assignments: list[str] | None) -> MonitorsConfig:
    raw: dict[str, Any] = {}
    for a in assignments or []:
        key, eq, value = a.partition("=")
        if not eq:
            raise ConfigError(f"--set {a!r} has no '='", "write --set loss_spike_z=8")
        raw[key.strip()] = yaml.safe_load(value) if value.strip() else None
    try:
        return MonitorsConfig.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise ConfigError(
            f"invalid --set: {problems}",
            f"settings: {', '.join(sorted(MonitorsConfig.model_fields))}",
        ) from None


def _grad_beside(loss: str, names: set[str]) -> str | None:
    """The gradient norm logged beside loss metric `loss`: the one with its prefix
    (`train/loss` -> `train/grad_norm`), else any; None when the log has none."""
    norms = sorted(n for n in names if infer_kind(n) == "grad_norm")
    prefix = loss.rpartition("/")[0]
    same = [n for n in norms if n.rpartition("/")[0] == prefix]
    return (same or norms or [None])[0]


class Replay:
    """The detectors `watch` runs over a log's step rows (see the module docstring), and a
    loss logged as exactly 0.0 (R101/R107, `guard.detectors.zero_loss`: `hf_filtered` for a Hugging
    Face `trainer_state.json`, whose Trainer writes a non-finite loss as 0.0)."""

    def __init__(
        self,
        config: MonitorsConfig,
        metrics: dict[str, Any],
        data_period: float | None,
        keys: set[str] | None = None,
        hf_filtered: bool = False,
    ) -> None:
        self.per_metric = MonitorSet(config, metrics, data_period)
        self.loader = LoaderStallDetector(config)
        self.moe = MoEHealthDetector(config)  # R601-R604, from a run record's router counts
        names = set(metrics) | set(keys or ())
        self.zero = [
            ZeroLossDetector(name, _grad_beside(name, names), hf_filtered)
            for name, kind in metrics.items()
            if kind == "loss"
        ]

    @property
    def metrics(self) -> dict[str, Any]:
        return self.per_metric.metrics

    def update(
        self, step: int, values: dict[str, float | None], router: dict[str, Any] | None = None
    ) -> list[Finding]:
        data_s, step_s = values.get("data_time_s"), values.get("step_time_s")
        found = self.per_metric.update(step, values) + self.loader.update(step, data_s, step_s)
        found += self.moe.update(step, router)
        for z in self.zero:
            found += z.update(step, values)
        return found

    def finalize(self) -> list[Finding]:
        return self.per_metric.finalize()

    def set_data_period(self, period: float | None) -> None:
        self.per_metric.set_data_period(period)


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _router(raw: dict[str, Any]) -> dict[str, Any] | None:
    """A run record row's MoE counts (`router`: layer -> tokens_routed, tokens_dropped,
    expert_counts), the layers whose counts are whole numbers; None when it has none."""
    layers = raw.get("router")
    if not isinstance(layers, dict):
        return None
    kept = {
        name: layer
        for name, layer in layers.items()
        if isinstance(layer, dict)
        and _count(layer.get("tokens_routed"))
        and _count(layer.get("tokens_dropped", 0))
        and isinstance(layer.get("expert_counts"), list)
        and all(_count(c) for c in layer["expert_counts"])
    }
    return kept or None


def compare_reference(
    reference: Path, rows: list[tuple[int, dict[str, Any], Any, str | None]], loss: str | None
) -> tuple[list[Finding], dict[str, Any]]:
    """The log's loss (and batch hash) against a reference curve (`reference record`'s file):
    R501-R506 as `trainguard run` reports them, step by step. A reference numbered from 1 (a
    `trainguard run` that logged completed steps) meets 0-based rows one step on."""
    from trainguard.guard.detectors.reference import ReferenceMonitor
    from trainguard.reference.curve import load_reference

    curve = load_reference(reference)
    monitor = ReferenceMonitor(curve, origin=f"the reference {reference}")
    shift = 1 if curve.steps and curve.steps[0] == 1 and rows and rows[0][0] == 0 else 0
    found: list[Finding] = []
    for step, values, _, hashed in rows:
        value = values.get(loss) if loss else None
        if value is not None:
            found += monitor.update(step + shift, {"loss": value, "batch_hash": hashed})
    return found, monitor.summary()


def watch_log(
    path: str | Path,
    metrics: list[str] | None = None,
    data_period: float | None = None,
    config: MonitorsConfig | None = None,
    reference: Path | None = None,
) -> tuple[list[Finding], dict[str, Any]]:
    """Findings of every detector over a finished log, and a summary (pure: prints nothing)."""
    state = LogState()
    rows = []
    for raw in read_rows(path):
        r = normalise(raw, state)
        if r is not None:  # normalise keeps numbers: the router counts and batch hash beside
            hashed = raw.get("batch_hash") if isinstance(raw.get("batch_hash"), str) else None
            rows.append((*r, _router(raw), hashed))
    if not rows:
        raise DataError(
            f"metric log {path} has no step rows",
            f"log one row per step with a `step` key and the metrics; accepted: {ACCEPTED}",
        )
    chosen = choose_metrics(state.keys, metrics)
    period = data_period or state.data_period
    hf = detect_format(Path(path)) == "hf_trainer_state"
    ms = Replay(config or MonitorsConfig(), chosen, period, state.keys, hf_filtered=hf)
    findings: list[Finding] = []
    for step, values, router, _ in rows:
        findings += ms.update(step, values, router)
    findings += ms.finalize()
    compared = None
    if reference is not None:
        loss = next((name for name, kind in chosen.items() if kind == "loss"), None)
        found, compared = compare_reference(reference, rows, loss)
        findings += found
    summary = {
        "source": str(path),
        "rows": len(rows),
        "metrics": chosen,
        "data_period_steps": period,
        # Findings this far apart or closer are one episode (a log written every N steps).
        "log_interval_steps": step_interval([step for step, *_ in rows]),
        **({"reference": compared} if compared is not None else {}),
    }
    return findings, summary


def _follow(
    path: Path,
    metrics: list[str] | None,
    data_period: float | None,
    config: MonitorsConfig,
    as_json: bool,
    idle_timeout: float | None,
) -> None:
    """Stream findings as they happen; end with the summary after `idle_timeout` or Ctrl-C."""
    state = LogState()
    ms: Replay | None = None
    findings: list[Finding] = []
    pending: list[tuple[int, dict]] = []
    gaps: Counter[int] = Counter()  # step_interval's count, kept as rows arrive (not redone)
    last: list[int] = []  # the previous step
    grouper = EpisodeGrouper()
    numbers: dict[int, int] = {}  # id(episode) -> its place in grouper.episodes

    def interval() -> int:
        return gaps.most_common(1)[0][0] if gaps else 1

    def show(found: list[Finding]) -> None:
        """JSON: every finding, with the number of its episode; text: an episode when it
        opens (its later findings are counted in the summary's table)."""
        if not found:
            return
        grouper.gap = interval()
        for f in found:
            episode, new = grouper.add(f)
            if as_json:
                number = numbers.setdefault(id(episode), len(numbers))
                line = json.dumps({"finding": f.to_dict(), "episode": number}, default=str)
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            elif new:
                console.print(episodes_table([episode], title="watch"))
        findings.extend(found)

    try:
        for raw in follow_rows(path, idle_timeout_s=idle_timeout):
            r = normalise(raw, state)
            if r is None:
                continue
            if ms is None:
                pending.append(r)
                ms = Replay(config, choose_metrics(state.keys, metrics), None, state.keys)
                rows, pending = pending, []
            else:
                rows = [r]
            ms.set_data_period(data_period or state.data_period)
            for step, values in rows:
                if last and step > last[0]:
                    gaps[step - last[0]] += 1
                last[:] = [step]
                show(ms.update(step, values))
    except KeyboardInterrupt:
        pass
    if ms is None:
        raise DataError(f"metric log {path} has no step rows", "log one row per step with `step`")
    show(ms.finalize())
    summary = {
        "ok": not has_errors(findings),
        "findings": [f.to_dict() for f in findings],
        "episodes": [e.to_dict() for e in grouper.episodes],
        "source": str(path),
        "rows": state.rows,
        "metrics": ms.metrics,
        "data_period_steps": data_period or state.data_period,
        "log_interval_steps": interval(),
    }
    if as_json:
        sys.stdout.write(json.dumps(summary, default=str) + "\n")
    else:
        if any(e.count > 1 for e in grouper.episodes):  # how each episode ended
            console.print(episodes_table(grouper.episodes, title="watch: episodes"))
        counts = episode_counts(grouper.episodes, len(findings))
        console.print(f"watch: {state.rows} rows, {counts}")
    raise typer.Exit(exit_status(findings))


def register(app: typer.Typer) -> None:
    @app.command("watch")
    def watch(
        metrics_log: Path = typer.Argument(
            ...,
            metavar="METRICS",
            help="Metric log: JSON Lines, CSV, a TensorBoard event file or run folder, a Hugging "
            "Face trainer_state.json (or its checkpoint folder), or a W&B chart's Export CSV.",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        follow: bool = typer.Option(
            False, "--follow", "-f", help="Tail a live log; findings are printed as they happen."
        ),
        metric: list[str] = typer.Option(
            None,
            "--metric",
            "-m",
            help="Metric to watch, NAME or NAME=KIND (loss, grad_norm, throughput); repeatable. "
            "Default: the known names in the log (loss, grad_norm, tokens_per_s, ...).",
        ),
        data_period: float = typer.Option(
            None,
            "--data-period",
            help="Known data period in steps (shard or epoch length): says whether a wave "
            "matches it. Default: from a meta row or an epoch column.",
        ),
        idle_timeout: float = typer.Option(
            None, "--idle-timeout", help="With --follow: stop after this many idle seconds."
        ),
        set_: list[str] = typer.Option(
            None, "--set", help="Detector setting, e.g. --set loss_spike_z=8 (see docs)."
        ),
        reference: Path = typer.Option(
            None,
            "--reference",
            help="A reference curve (`trainguard reference record`): compare the log's loss "
            "with it step by step (R501-R506), as `trainguard run` does.",
        ),
    ) -> None:
        """Run the in-run detectors (NaN, spikes, divergence, waves, throughput, loader
        stalls) over a log."""
        config = _config(set_)
        if data_period is not None and data_period <= 0:
            raise ConfigError(
                f"--data-period {data_period} is not positive", "give the period in steps"
            )
        if reference is not None and follow:
            raise ConfigError("--reference compares a finished log", "leave out --follow")
        if follow:
            _follow(metrics_log, metric or None, data_period, config, as_json, idle_timeout)
            return
        findings, summary = watch_log(metrics_log, metric or None, data_period, config, reference)
        gap = summary["log_interval_steps"]
        emit_episodes(findings, as_json, extra=summary, title="watch", gap=gap)
