"""Scalars of a TensorBoard run, through TensorBoard's own `EventAccumulator`.

EventAccumulator (in the `tensorboard` package, the same one the writer needs) rather than
tbparse: tbparse wraps the same accumulator and returns pandas DataFrames, a heavy dependency
for what is a list of (step, value) per tag here. The accumulator also drops the events a
restarted writer purged (`purge_step`, out-of-order steps), as TensorBoard's UI shows them.
Scalars written as simple values (torch's SummaryWriter, tensorboardX, Lightning, the Hugging
Face TensorBoard callback) and as TF2-style scalar tensors are both read.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.errors import DataError
from trainguard.metrics.accepted import ACCEPTED, EVENT_GLOB

# Names other trainers give what the reader knows under another name.
_ALIASES = {"train/epoch": "epoch"}


def _run_folder(path: Path) -> Path:
    if path.is_file():
        return path
    runs = sorted({p.parent for p in path.rglob(EVENT_GLOB) if p.is_file()})
    if len(runs) > 1:
        listing = ", ".join(str(r.relative_to(path)) or "." for r in runs[:6])
        raise DataError(
            f"{path} holds {len(runs)} TensorBoard runs ({listing})",
            "give the folder (or event file) of one run",
        )
    return runs[0]


def tensorboard_rows(path: Path) -> Iterator[dict[str, Any]]:
    """One row per step: {"step": s, tag: value, ...} over every scalar tag."""
    try:
        from tensorboard.backend.event_processing import event_accumulator as ea
        from tensorboard.util import tensor_util
    except ImportError:
        raise DataError(
            "reading TensorBoard files needs the tensorboard package",
            "pip install 'trainguard[tensorboard]'",
        ) from None
    target = _run_folder(path)
    acc = ea.EventAccumulator(str(target), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    try:
        acc.Reload()
    except Exception as e:  # a corrupt record: the reader's own error types vary by version
        raise DataError(
            f"{path} is not a readable TensorBoard event file ({type(e).__name__}: {e})",
            f"give an events.out.tfevents.* file or the folder of one run; accepted: {ACCEPTED}",
        ) from None
    by_step: dict[int, dict[str, float]] = {}
    tags = acc.Tags()
    for tag in tags.get("scalars", []):
        for ev in acc.Scalars(tag):
            by_step.setdefault(int(ev.step), {})[tag] = float(ev.value)
    for tag in tags.get("tensors", []):
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue  # text (trainguard's findings), histograms, ...
        for ev in acc.Tensors(tag):
            value = tensor_util.make_ndarray(ev.tensor_proto)
            if value.size == 1:
                by_step.setdefault(int(ev.step), {})[tag] = float(value.reshape(()))
    if not by_step:
        raise DataError(
            f"{path} holds no TensorBoard scalars",
            f"give the event file of a run that logged scalars (add_scalar); accepted: {ACCEPTED}",
        )
    for step in sorted(by_step):
        values = by_step[step]
        for tag, alias in _ALIASES.items():
            if tag in values and alias not in values:
                values[alias] = values[tag]
        yield {"step": step, **values}
