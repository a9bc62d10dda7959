"""`trainguard watch`: trainguard run logs, generic JSONL and CSV, --follow on a live file."""

from __future__ import annotations

import csv
import json
import math
import threading
import time

import pytest
from typer.testing import CliRunner

from trainguard.cli import app
from trainguard.cli.watch import watch_log
from trainguard.guard.detectors import synthetic as S

runner = CliRunner()
N = 1200


def invoke(*args):
    result = runner.invoke(app, ["watch", *map(str, args)])
    return result.exit_code, result.output


def payload(output):
    """The JSON document of a --json run (the last object when several lines are printed)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("{"))
    return json.loads("\n".join(lines[start:]))


def write_run_log(path, loss, grad=None, tps=None, extra_rows=True, meta=None):
    """A metrics.jsonl as `trainguard run` writes it: step, eval and finding rows."""
    with open(path, "w") as fh:
        if meta:
            fh.write(json.dumps({"kind": "meta", **meta}) + "\n")
        for i, v in enumerate(loss):
            row = {"kind": "step", "step": i, "loss": v, "lr": 1e-3, "batch_hash": "abc"}
            row["grad_norm"] = float(grad[i]) if grad is not None else 0.5
            row["tokens_per_s"] = float(tps[i]) if tps is not None else 1e4
            fh.write(json.dumps(row) + "\n")
            if extra_rows and i % 100 == 0:
                fh.write(json.dumps({"kind": "eval", "step": i, "val_loss": 99.0}) + "\n")
                fh.write(json.dumps({"kind": "finding", "code": "H101", "step": i}) + "\n")


@pytest.mark.parametrize(
    "kw", [dict(noise=0.0), dict(noise=0.03), dict(noise=0.02, warmup=100, heavy_tails=True)]
)
def test_clean_log_is_ok(tmp_path, kw):
    log = tmp_path / "metrics.jsonl"
    write_run_log(log, S.clean_loss(N, seed=1, **kw), S.clean_grad_norm(N), S.clean_throughput(N))
    code, out = invoke(log, "--json")
    assert code == 0
    p = payload(out)
    assert p["ok"] is True and p["findings"] == []
    assert p["rows"] == N
    assert p["metrics"] == {"loss": "loss", "grad_norm": "grad_norm", "tokens_per_s": "throughput"}


def test_run_log_with_planted_faults(tmp_path):
    loss = S.plant_wave(S.clean_loss(N, seed=2, warmup=50), 60, 0.02)
    loss[500] *= 2.5
    loss[900] = math.nan
    tps = S.clean_throughput(N, seed=2)
    tps[1000:1100] *= 0.4
    log = tmp_path / "metrics.jsonl"
    write_run_log(log, loss, tps=tps, meta={"data_period_steps": 60})
    code, out = invoke(log, "--json")
    assert code == 1  # R101 is an error
    p = payload(out)
    got = {(f["code"], f["step"]) for f in p["findings"] if f["code"] != "R105"}
    assert got == {("R102", 500), ("R101", 900), ("R106", 1004)}
    waves = [f for f in p["findings"] if f["code"] == "R105"]
    assert len(waves) == 1
    assert waves[0]["data"]["period_steps"] == pytest.approx(60, rel=0.1)
    assert waves[0]["data"]["matches_data_period"] is True
    assert p["data_period_steps"] == 60
    for f in p["findings"]:
        assert set(f) >= {"code", "severity", "step", "metric", "message", "data", "fix"}


def test_data_period_flag_and_epoch_column(tmp_path):
    loss = S.plant_wave(S.clean_loss(N, seed=3), 100, 0.02)
    log = tmp_path / "m.jsonl"
    with open(log, "w") as fh:
        for i, v in enumerate(loss):
            fh.write(json.dumps({"step": i, "loss": v, "epoch": i // 100}) + "\n")
    findings, summary = watch_log(log)
    assert summary["data_period_steps"] == 100
    assert [f.data["matches_data_period"] for f in findings] == [True]
    code, out = invoke(log, "--json", "--data-period", 37)
    assert code == 0
    assert [f["data"]["matches_data_period"] for f in payload(out)["findings"]] == [False]


def test_generic_csv_with_named_metric(tmp_path):
    loss = S.clean_loss(N, seed=4, noise=0.02)
    loss[700] *= 3.0
    log = tmp_path / "trainer.csv"
    with open(log, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["global_step", "train/loss", "learning_rate", "note"])
        for i, v in enumerate(loss):
            w.writerow([i * 10, v, 1e-3, "x"])
    code, out = invoke(log, "--json", "--metric", "train/loss")
    assert code == 0
    p = payload(out)
    assert [(f["code"], f["step"], f["metric"]) for f in p["findings"]] == [
        ("R102", 7000, "train/loss")
    ]
    # Without --metric the known name is found too.
    assert payload(invoke(log, "--json")[1])["metrics"] == {"train/loss": "loss"}


def test_table_output(tmp_path):
    loss = S.clean_loss(300, seed=5)
    loss[200] = math.inf
    log = tmp_path / "m.jsonl"
    write_run_log(log, loss)
    code, out = invoke(log)
    assert code == 1
    assert "R101" in out and "watch" in out


@pytest.mark.parametrize(
    "content,args,needle",
    [
        (None, [], "does not exist"),
        ('{"step": 0, "loss": 1}\nnot json\n{"step": 2, "loss": 1}\n', [], "not valid JSON"),
        ('{"kind": "eval", "val_loss": 1}\n', [], "no step rows"),
        ('{"step": 0, "acc": 1}\n', [], "no known metric"),
        ('{"step": 0, "loss": 1}\n', ["--metric", "nope"], "no numeric column"),
        ('{"step": 0, "loss": 1}\n', ["--metric", "loss=weird"], "unknown kind"),
        ('{"step": 0, "loss": 1}\n', ["--set", "loss_spike_z=-1"], "invalid --set"),
        ('{"step": 0, "loss": 1}\n', ["--set", "bogus=1"], "invalid --set"),
    ],
)
def test_bad_input_exits_2(tmp_path, content, args, needle):
    log = tmp_path / "m.jsonl"
    if content is not None:
        log.write_text(content)
    code, out = invoke(log, *args)
    assert code == 2
    assert needle in out


def test_short_logs_and_truncated_last_line(tmp_path):
    log = tmp_path / "m.jsonl"
    log.write_text('{"step": 0, "loss": 3.0}\n{"step": 1, "loss": 2.9}\n{"step": 2, "lo')
    code, out = invoke(log, "--json")
    assert code == 0
    assert payload(out)["rows"] == 2


def test_follow_a_live_log(tmp_path):
    log = tmp_path / "metrics.jsonl"
    loss = S.clean_loss(400, seed=6)
    loss[300] = math.nan
    log.write_text("")

    def writer():
        with open(log, "a") as fh:
            for i, v in enumerate(loss):
                row = json.dumps({"kind": "step", "step": i, "loss": v, "grad_norm": 0.5})
                if i == 250:  # a line arriving in two pieces
                    fh.write(row[:10])
                    fh.flush()
                    time.sleep(0.05)
                    fh.write(row[10:] + "\n")
                else:
                    fh.write(row + "\n")
                if i % 50 == 0:
                    fh.flush()
                    time.sleep(0.02)

    t = threading.Thread(target=writer)
    t.start()
    code, out = invoke(log, "--follow", "--json", "--idle-timeout", 1.5)
    t.join()
    assert code == 1
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    streamed = [x["finding"] for x in lines if "finding" in x]
    assert [(f["code"], f["step"]) for f in streamed] == [("R101", 300)]
    summary = lines[-1]
    assert summary["rows"] == 400 and summary["ok"] is False
