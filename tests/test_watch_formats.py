"""`trainguard watch` on the logs other tools write: TensorBoard event files (TensorBoard's own
writer, through torch's SummaryWriter and tensorboard's EventFileWriter), a `trainer_state.json`
and the TensorBoard folder of a real Hugging Face Trainer run, and W&B chart "Export CSV"
files. Unknown or broken files exit 2 naming the accepted formats."""

from __future__ import annotations

import csv
import json
import math
import os
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runhelpers import random_token_dataset
from trainguard.cli import app
from trainguard.cli.watch import watch_log
from trainguard.guard.detectors import synthetic as S

runner = CliRunner()
SPIKE = 30  # the Trainer step whose loss is multiplied by 1000
ACCEPTED_WORDS = ("JSON Lines", "TensorBoard", "trainer_state.json", "W&B")


def invoke(*args):
    result = runner.invoke(app, ["watch", *map(str, args)])
    return result.exit_code, result.output


def found(findings) -> set[tuple[str, int, str]]:
    return {(f.code, f.step, f.metric) for f in findings if f.severity != "info"}


@pytest.fixture(scope="session")
def hf_trainer_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real transformers Trainer run on CPU (tiny GPT-2, random tokens, 40 steps, no
    download) whose loss at step 30 is multiplied by 1000, logged every step to its
    trainer_state.json and to TensorBoard (the Trainer's own TensorBoardCallback)."""
    pytest.importorskip("tensorboard")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    class Spiky(transformers.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if self.state.global_step + 1 == SPIKE:  # the update that ends at step SPIKE
                return (out[0] * 1000, *out[1:]) if return_outputs else out * 1000
            return out

    out = tmp_path_factory.mktemp("hf_trainer")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=40, per_device_train_batch_size=8, logging_steps=1,
        save_strategy="steps", save_steps=40, report_to=["tensorboard"], use_cpu=True, seed=0,
        learning_rate=1e-3, disable_tqdm=True,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    trainer = Spiky(model=model, args=args, train_dataset=random_token_dataset(64, 16))
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return out


def test_hf_trainer_state_json(hf_trainer_run: Path) -> None:
    state = hf_trainer_run / "checkpoint-40" / "trainer_state.json"
    findings, summary = watch_log(state)
    assert summary["rows"] == 40  # the end-of-training summary entry is not a step
    assert summary["metrics"] == {"loss": "loss", "grad_norm": "grad_norm"}
    assert found(findings) == {("R102", SPIKE, "loss"), ("R103", SPIKE, "grad_norm")}
    # Fractional epochs give the data period: 64 samples / batch 8 = 8 steps per epoch.
    assert summary["data_period_steps"] == pytest.approx(8.0)
    # The checkpoint folder holding it reads the same.
    assert found(watch_log(state.parent)[0]) == found(findings)


def test_hf_trainer_tensorboard_folder(hf_trainer_run: Path) -> None:
    findings, summary = watch_log(hf_trainer_run / "runs")  # the callback's run subfolder
    assert summary["rows"] == 40
    assert summary["metrics"] == {"train/loss": "loss", "train/grad_norm": "grad_norm"}
    assert found(findings) == {("R102", SPIKE, "train/loss"), ("R103", SPIKE, "train/grad_norm")}
    code, out = invoke(next((hf_trainer_run / "runs").rglob("events.out.tfevents*")), "--json")
    assert code == 0, out  # spikes are warnings: the exit status counts errors
    assert {(f["code"], f["step"]) for f in json.loads(out)["findings"]} >= {("R102", SPIKE)}


def write_tb(folder: Path, loss: list[float], tag: str = "train/loss") -> Path:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(folder)) as w:
        for step, v in enumerate(loss):
            w.add_scalar(tag, v, step)
            w.add_text("notes", f"step {step}", step)  # text events are not metrics
    return folder


def test_tensorboard_file_and_folder_from_summary_writer(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    loss = S.clean_loss(300)
    loss[200] = math.nan
    loss[250] *= 20
    folder = write_tb(tmp_path / "tb", loss)
    (event_file,) = folder.glob("events.out.tfevents*")
    for target in (folder, event_file, tmp_path):  # a parent folder with one run reads too
        findings, summary = watch_log(target)
        assert summary["rows"] == 300
        assert {("R101", 200), ("R102", 250)} <= {(f.code, f.step) for f in findings}
    clean, _ = watch_log(write_tb(tmp_path / "clean", S.clean_loss(300)))
    assert not [f for f in clean if f.severity == "error"]


def test_tensorboard_tf2_style_scalar_tensors(tmp_path: Path) -> None:
    """Scalars stored as tensors (tf.summary.scalar in TF2, Keras), written here with
    tensorboard's own EventFileWriter and scalar summary protos."""
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    loss = S.clean_loss(200)
    loss[150] *= 30
    writer = EventFileWriter(str(tmp_path))
    for step, v in enumerate(loss):
        writer.add_event(Event(step=step, wall_time=1.0 + step, summary=scalar_pb("loss", v)))
    writer.close()
    findings, summary = watch_log(tmp_path)
    assert summary["metrics"] == {"loss": "loss"}
    assert ("R102", 150) in {(f.code, f.step) for f in findings}


def test_tensorboard_folder_with_two_runs_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    write_tb(tmp_path / "run_a", S.clean_loss(30))
    write_tb(tmp_path / "run_b", S.clean_loss(30))
    code, out = invoke(tmp_path)
    assert code == 2
    assert "2 TensorBoard runs" in out and "run_a" in out


def write_wandb_export(path: Path, runs: dict[str, list[float]], metric: str = "train/loss"):
    """A line chart's Export CSV as the W&B UI writes it: `Step`, then per run
    `<run> - <metric>` with its `__MIN` and `__MAX` companions (the bucket's range)."""
    n = len(next(iter(runs.values())))
    header = ["Step"]
    for run in runs:
        header += [f"{run} - {metric}", f"{run} - {metric}__MIN", f"{run} - {metric}__MAX"]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, quoting=csv.QUOTE_ALL)
        w.writerow(header)
        for step in range(n):
            row: list = [step]
            for values in runs.values():
                v = values[step]
                # The companions hold a bogus spike: read as metrics, they would raise R102.
                row += [v, v, v * (50 if step == 100 else 1)]
            w.writerow(row)
    return path


def test_wandb_export_csv_single_run(tmp_path: Path) -> None:
    loss = S.clean_loss(300)
    loss[220] *= 20
    path = write_wandb_export(tmp_path / "wandb_export.csv", {"dainty-sun-12": loss})
    findings, summary = watch_log(path)
    assert summary["metrics"] == {"train/loss": "loss"}  # the run prefix is stripped
    assert found(findings) == {("R102", 220, "train/loss")}  # nothing from __MAX at 100


def test_wandb_export_csv_several_runs(tmp_path: Path) -> None:
    spiky = S.clean_loss(300)
    spiky[180] *= 20
    path = write_wandb_export(
        tmp_path / "export.csv", {"calm-sky-1": S.clean_loss(300), "bold-fire-2": spiky}
    )
    code, out = invoke(path)  # which run? the columns are named for the user to pick
    assert code == 2
    assert "calm-sky-1 - train/loss" in out and "bold-fire-2 - train/loss" in out
    code, out = invoke(path, "--metric", "bold-fire-2 - train/loss", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert {(f["code"], f["step"]) for f in doc["findings"]} == {("R102", 180)}


@pytest.mark.parametrize(
    "name,content",
    [
        ("image.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64)),
        ("events.out.tfevents.123.host", random.Random(0).randbytes(256)),  # seeded: every run
        ("trainer_state.json", b'{"global_step": 3}'),
        ("notes.txt", b"just some prose\nwithout any numbers\n"),
        ("empty.csv", b""),
    ],
    ids=["png", "corrupt-tfevents", "trainer-state-without-history", "prose", "empty"],
)
def test_unknown_or_broken_files_exit_2_naming_the_formats(tmp_path: Path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    code, out = invoke(path)
    assert code == 2, out
    text = " ".join(out.split())
    assert all(word in text for word in ACCEPTED_WORDS), out
    assert "Traceback" not in out


def test_folder_without_logs_and_follow_of_whole_file_formats(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, out = invoke(tmp_path / "empty")
    assert code == 2 and "TensorBoard" in out
    path = write_wandb_export(tmp_path / "export.csv", {"r": S.clean_loss(30)})
    code, out = invoke(path, "--follow", "--idle-timeout", "1")
    assert code == 2 and "--follow" in out
