"""Metric logs in and out: the one low module that `run`, `Guard`, `report` and `watch` share.

- `jsonl`: the run's own log, `RUN_DIR/metrics.jsonl` (`MetricsLog` writes it, `read_metrics`
  reads it back).
- `logfile`: any trainer's JSON Lines or CSV log, whole or followed live, normalised to step rows.
- `formats`: what `watch` accepts: those two plus a TensorBoard event file or folder, a Hugging
  Face `trainer_state.json` and a W&B UI "Export CSV" (`read_rows` picks the reader; the list
  and the event-file name are in `accepted`, which the TensorBoard reader shares).
- `sinks`: the `MetricsSink` protocol and `MetricsFanout`, through which `run` and `Guard` send
  every row to the JSONL record and to TensorBoard (`tensorboard_sink`) and W&B (`wandb_sink`);
  what those viewers show of a row is in `viewer_rows`.
- `config`: the recipe's `metrics` section.

Nothing here imports torch at module level, nor anything above `findings`/`errors`/`util`.
"""
