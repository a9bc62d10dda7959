"""Which metrics of a log the detectors watch: `KNOWN_METRICS` and `choose_metrics`.

Reading the log itself (JSON Lines, CSV, TensorBoard, `trainer_state.json`, W&B CSV) is
`trainguard.metrics`'s job (`metrics.formats.read_rows`).
"""

from __future__ import annotations

from trainguard.errors import DataError
from trainguard.guard.detectors.monitor_set import MetricKind, infer_kind
from trainguard.metrics.accepted import ACCEPTED

# Names trainers give the metrics the detectors know: trainguard's own log and its TensorBoard
# tags (`train/...`), Hugging Face (`loss`, `grad_norm`; `train/loss` in its TensorBoard and
# W&B callbacks), Lightning (`train_loss`, `train_loss_step`).
KNOWN_METRICS: dict[str, MetricKind] = {
    "loss": "loss",
    "train_loss": "loss",
    "train/loss": "loss",
    "training_loss": "loss",
    "train_loss_step": "loss",
    "grad_norm": "grad_norm",
    "gradient_norm": "grad_norm",
    "train/grad_norm": "grad_norm",
    "tokens_per_s": "throughput",
    "tokens_per_sec": "throughput",
    "train/tokens_per_s": "throughput",
    "throughput": "throughput",
}


def choose_metrics(keys: set[str], requested: list[str] | None) -> dict[str, MetricKind]:
    """The metrics to watch: `--metric NAME[=KIND]` or the known names present in the log."""
    if requested:
        out: dict[str, MetricKind] = {}
        for spec in requested:
            name, _, kind = spec.partition("=")
            if kind and kind not in ("loss", "grad_norm", "throughput"):
                raise DataError(
                    f"--metric {spec}: unknown kind {kind!r}",
                    "write --metric NAME or NAME=KIND with KIND one of loss, grad_norm, throughput",
                )
            if keys and name not in keys:
                raise DataError(
                    f"--metric {name}: the log has no numeric column {name!r}",
                    f"choose among: {', '.join(sorted(keys)) or '(no numeric columns)'}",
                )
            out[name] = kind or infer_kind(name)  # type: ignore[assignment]
        return out
    if not keys:
        raise DataError(
            "the log has no numeric values: not a metric log trainguard reads",
            f"give one of: {ACCEPTED}",
        )
    found = {k: v for k, v in KNOWN_METRICS.items() if k in keys}
    if not found:
        raise DataError(
            f"no known metric in the log (columns: {', '.join(sorted(keys)) or 'none'})",
            f"name them with --metric NAME[=loss|grad_norm|throughput]; known names: "
            f"{', '.join(KNOWN_METRICS)}",
        )
    return found
