"""Metrics out: `run` and `Guard` fan every row out to metrics.jsonl, TensorBoard and W&B
through one sink interface; findings are text events at their step; the report marks
findings and non-finite values on its curves. Files are read back with TensorBoard's own
EventAccumulator and W&B's own record protos, never with our reader alone."""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import pytest
import yaml

from runhelpers import invoke_cli, tiny_recipe_dict
from trainguard.errors import ConfigError
from trainguard.guard.core import Guard
from trainguard.guard.detectors import synthetic as S
from trainguard.metrics.jsonl import MetricsLog, read_metrics
from trainguard.metrics.sinks import MetricsFanout, MetricsSink

# under pytest-xdist the module's tests run on one worker, so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_metrics_out")

tb = pytest.importorskip("tensorboard")
try:
    import wandb  # noqa: F401

    HAVE_WANDB = True
except ImportError:  # the `wandb` extra is optional: its tests skip without it
    HAVE_WANDB = False


def accumulator(folder: Path):
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    return acc


def tb_scalars(folder: Path, tag: str) -> dict[int, float]:
    return {e.step: e.value for e in accumulator(folder).Scalars(tag)}


def tb_texts(folder: Path) -> dict[tuple[str, int], str]:
    """{(code, step): text} of the findings/<code>[/<metric>] text events."""
    acc = accumulator(folder)
    out = {}
    for tag in acc.Tags()["tensors"]:
        if tag.startswith("findings/"):
            for e in acc.Tensors(tag):
                out[(tag.split("/")[1], e.step)] = e.tensor_proto.string_val[0].decode()
    return out


def wandb_records(root: Path) -> list:
    """The records of the offline W&B run under `root`, from its run-<id>.wandb file: a
    LevelDB-format log (7-byte header; 32 KiB blocks of crc/length/type-framed chunks) of
    wandb's own `Record` protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = root.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, block, buf, records = path.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block  # block trailer padding
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):
            break  # a record still being written
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            continue  # zero padding
        if kind in (1, 4):  # a full record, or the last chunk of one
            records.append(pb.Record.FromString(buf))
            buf = b""
    return records


def wandb_history(root: Path) -> list[dict[str, str]]:
    """History rows of the offline run. wandb's service process writes the file behind
    `run.finish()`, so wait (up to a generous bound) for its closing `exit` record."""
    deadline = time.monotonic() + 60
    records = wandb_records(root)
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, "the W&B run file never got its exit record"
        time.sleep(0.2)
        records = wandb_records(root)
    return [
        # "a/b" keys are stored split, in nested_key
        {i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]


# --- the sink interface ------------------------------------------------------------------------
def test_tensorboard_sink_scalars_text_and_purge_on_resume(tmp_path: Path) -> None:
    from trainguard.metrics.tensorboard_sink import TensorBoardSink

    sink = TensorBoardSink(tmp_path)
    assert isinstance(sink, MetricsSink)
    for step in range(1, 7):
        loss = math.nan if step == 3 else 10.0 - step
        sink.write({"kind": "step", "step": step, "loss": loss, "batch_hash": "ab", "time": 1.0})
    sink.write({"kind": "finding", "code": "R101", "severity": "error", "step": 3,
                "metric": "loss", "message": "loss is nan at step 3", "fix": "skip"})  # fmt: skip
    sink.write({"kind": "eval", "step": 6, "val_loss": 4.5, "tokens": 99})
    # A resume from the checkpoint of step 4: steps 5-6 are recomputed with other values.
    sink.truncate_after(4)
    for step in (5, 6):
        sink.write({"kind": "step", "step": step, "loss": 100.0 + step})
    sink.close()
    loss = tb_scalars(tmp_path, "train/loss")
    assert sorted(loss) == [1, 2, 3, 4, 5, 6]
    assert math.isnan(loss[3]) and loss[4] == 6.0
    assert (loss[5], loss[6]) == (105.0, 106.0)  # the purged first attempt is hidden
    tags = accumulator(tmp_path).Tags()["scalars"]
    assert "train/batch_hash" not in tags and "train/time" not in tags
    texts = tb_texts(tmp_path)
    assert list(texts) == [("R101", 3)]
    assert "**R101** error (loss): loss is nan at step 3" in texts[("R101", 3)]


def test_missing_tensorboard_package_is_a_config_error(tmp_path, monkeypatch) -> None:
    import importlib.util

    from trainguard.metrics.tensorboard_sink import TensorBoardSink

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "tensorboard" else real(n, *a)
    )
    with pytest.raises(ConfigError, match="trainguard\\[tensorboard\\]"):
        TensorBoardSink(tmp_path)


def test_guard_writes_steps_and_findings_to_tensorboard_and_sinks(tmp_path: Path) -> None:
    loss = S.clean_loss(100)
    loss[60] = math.inf
    extra = MetricsLog(tmp_path, "mine.jsonl")  # any MetricsSink: the same rows as run's
    with Guard(run_dir=tmp_path, tensorboard_dir=tmp_path / "tb", sinks=[extra]) as guard:
        for i, v in enumerate(loss):
            guard.step(i, loss=float(v), grad_norm=1.0)
    scalars = tb_scalars(tmp_path / "tb", "train/loss")
    assert sorted(scalars) == list(range(100))
    assert math.isinf(scalars[60])
    assert tb_scalars(tmp_path / "tb", "train/grad_norm")[99] == 1.0
    assert set(tb_texts(tmp_path / "tb")) == {("R101", 60), ("R201", 60)}
    rows = [json.loads(line) for line in (tmp_path / "mine.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert len(steps) == 100 and steps[60]["action"] == "skip" and steps[60]["loss"] == "inf"
    assert [(r["code"], r["step"]) for r in rows if r["kind"] == "finding"] == [
        ("R101", 60),
        ("R201", 60),
    ]
    # guard.jsonl keeps holding the findings only, as before.
    kept = (tmp_path / "guard.jsonl").read_text().splitlines()
    assert [json.loads(line)["code"] for line in kept] == ["R101", "R201"]


@pytest.mark.skipif(not HAVE_WANDB, reason="the wandb extra is not installed")
def test_wandb_sink_offline(tmp_path: Path, monkeypatch) -> None:
    from trainguard.metrics.wandb_sink import WandbSink

    monkeypatch.setenv("WANDB_SILENT", "true")
    fanout = MetricsFanout(None, [WandbSink(tmp_path, project="tg-test")])
    fanout.write({"kind": "finding", "code": "C150", "severity": "info", "step": 2,
                  "message": "resumed", "fix": None})  # fmt: skip
    for step in (3, 4, 5):
        fanout.write({"kind": "step", "step": step, "loss": math.nan if step == 4 else 2.0})
    fanout.write({"kind": "finding", "code": "R101", "severity": "error", "step": 4,
                  "metric": "loss", "message": "loss is nan at step 4", "fix": "skip"})  # fmt: skip
    fanout.close()
    history = wandb_history(tmp_path)
    loss = {int(r["trainguard/step"]): r["train/loss"] for r in history if "train/loss" in r}
    assert loss == {3: "2", 4: "NaN", 5: "2"}
    texts = {(k, int(r["trainguard/step"])) for r in history for k in r if k.startswith("find")}
    assert {("findings/C150", 2), ("findings/R101", 4)} <= texts
    table = [r for r in history if r.get("findings/_type") == '"table-file"']
    assert table and table[0]["findings/nrows"] == "2"


# --- `trainguard run` with a fault, TensorBoard (and W&B when installed) -------------------------
@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory, small_corpus: Path, cache_dir: Path) -> Path:
    """A tiny run with a NaN batch at step 4 (the fifth), logging to RUN/tb. (W&B goes through
    the same fan-out; its sink is tested on its own above, sparing the suite a wandb start-up.)"""
    base = tmp_path_factory.mktemp("faulty")
    recipe = tiny_recipe_dict(small_corpus, cache_dir)
    recipe["train"]["max_steps"] = 8  # checkpoints at 4 and 8, evaluations at 6 and 8
    recipe["metrics"] = {"tb_dir": "tb"}
    (base / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    env = {"TRAINGUARD_INJECT": "nan@4"}
    res = invoke_cli("run", str(base / "tiny.yaml"), "--run-dir", str(base / "run"), "-q", env=env)
    assert res.returncode == 0, res.stderr
    return base / "run"


def test_run_writes_metrics_and_findings_to_tensorboard(faulty_run: Path) -> None:
    loss = tb_scalars(faulty_run / "tb", "train/loss")
    assert sorted(loss) == list(range(8)) and math.isnan(loss[4])  # steps count from 0
    rows = {r["step"]: r for r in read_metrics(faulty_run) if r["kind"] == "step"}
    assert loss[7] == pytest.approx(rows[7]["loss"], rel=1e-6)  # the same rows as the JSONL
    assert sorted(tb_scalars(faulty_run / "tb", "eval/val_loss")) == [6, 8]  # steps done
    texts = tb_texts(faulty_run / "tb")
    assert ("R101", 4) in texts and ("R201", 4) in texts
    # ... and `watch` reads the run's TensorBoard output back to the same finding.
    from typer.testing import CliRunner

    from trainguard.cli import app

    res = CliRunner().invoke(app, ["watch", str(faulty_run / "tb"), "--json"])
    assert res.exit_code == 1, res.output
    found = {(f["code"], f["step"]) for f in json.loads(res.output)["findings"]}
    assert ("R101", 4) in found


def test_run_sinks_follow_the_recipe(tmp_path: Path) -> None:
    from trainguard.metrics.config import MetricsConfig
    from trainguard.metrics.sinks import open_run_sinks
    from trainguard.metrics.tensorboard_sink import TensorBoardSink

    plain = open_run_sinks(tmp_path)
    assert plain.path == tmp_path / "metrics.jsonl" and plain.viewers == []
    fanout = open_run_sinks(tmp_path, MetricsConfig(tb_dir="tb", wandb=HAVE_WANDB))
    kinds = [type(v).__name__ for v in fanout.viewers]
    assert kinds == ["TensorBoardSink"] + (["WandbSink"] if HAVE_WANDB else [])
    assert isinstance(fanout.viewers[0], TensorBoardSink)
    assert fanout.viewers[0].log_dir == tmp_path / "tb"  # relative: inside the run dir
    assert not (tmp_path / "tb").exists() and not (tmp_path / "wandb").exists()  # lazy


def test_report_marks_findings_and_non_finite_values(faulty_run: Path) -> None:
    from trainguard.report import plots
    from trainguard.report.build import collect

    info = collect(faulty_run)
    assert any(r["loss"] == "nan" for r in info["steps"])  # as metrics.jsonl stores NaN
    fig = plots.loss_figure(info["steps"], info["evals"], info["findings"])
    marks = {c.get_gid(): c for c in fig.axes[0].collections if c.get_gid()}
    # nan@4 hits the step of index 4 (the fifth): every tool sees 0-based steps.
    assert [x for x, _ in marks["non-finite"].get_offsets()] == [4.0]
    assert {x for x, _ in marks["findings-error"].get_offsets()} == {4.0}  # R101
    assert {x for x, _ in marks["findings-info"].get_offsets()} >= {4.0}  # R201 skip
    assert marks["findings-error"].get_facecolor()[0].tolist() != (
        marks["findings-info"].get_facecolor()[0].tolist()
    )
    grad = plots.series_figure(info["steps"], "grad_norm", "g", "n", info["findings"])
    grad_marks = {c.get_gid(): c for c in grad.axes[0].collections if c.get_gid()}
    assert [x for x, _ in grad_marks["non-finite"].get_offsets()] == [4.0]
    # The HTML embeds the marked plots.
    html = (faulty_run / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3
    # ... and the report counts the skipped update (run averages no training loss).
    assert "| skipped updates | 1 (steps 4) |" in (faulty_run / "report.md").read_text()
