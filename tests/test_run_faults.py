"""Faults and bad input around a real run: corrupt checkpoints, damaged shards, bad corpora,
unwritable run dirs, a disk that fills during a checkpoint write."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runhelpers import invoke_cli, run_cli, tiny_recipe_dict
from trainguard.config.load import validate_recipe
from trainguard.data.prepare import cache_key, prepare_data


def write_recipe(path: Path, recipe: dict) -> Path:
    path.write_text(yaml.safe_dump(recipe))
    return path


def flip_byte(path: Path, offset: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_checkpoint_falls_back_to_previous(tiny_recipe: Path, tiny_run_copy: Path) -> None:
    run_dir = tiny_run_copy
    args = ["run", str(tiny_recipe), "--run-dir", str(run_dir), "-q", "--json"]
    flip_byte(run_dir / "checkpoints" / "step-12" / "state.safetensors")
    res = invoke_cli(*args, "--set", "train.max_steps=16")
    payload = json.loads(res.stdout)
    assert payload["resumed_from"] == 8 and payload["final_step"] == 16
    corrupt = [f for f in payload["findings"] if "corrupt" in f["message"]]
    assert corrupt, payload["findings"]
    assert "state.safetensors" in corrupt[0]["message"]
    assert res.returncode == 0  # recovered: the run finished; the finding says what was lost


def test_checkpoint_with_broken_manifest_is_never_loaded(
    tiny_recipe: Path, tiny_run_copy: Path
) -> None:
    run_dir = tiny_run_copy
    args = ["run", str(tiny_recipe), "--run-dir", str(run_dir), "-q", "--json"]
    manifest12 = run_dir / "checkpoints" / "step-12" / "manifest.json"
    manifest12.write_text(manifest12.read_text()[:40])  # truncated
    manifest8 = run_dir / "checkpoints" / "step-8" / "manifest.json"
    doc = json.loads(manifest8.read_text())
    first = next(iter(doc["files"]))
    doc["files"][first]["checksum"] = "0" * 32  # edited
    manifest8.write_text(json.dumps(doc))
    payload = json.loads(invoke_cli(*args, "--set", "train.max_steps=14").stdout)
    assert payload["resumed_from"] == 4
    assert payload["final_step"] == 14


def test_damaged_shard_is_an_error_naming_the_file(
    small_corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    # The session's prepared data of the tiny recipe, copied (never damage the shared cache).
    recipe = tiny_recipe_dict(small_corpus, cache_dir)
    config = validate_recipe(recipe)
    key = cache_key(config.data, config.tokenizer)
    prepare_data(config.data, config.tokenizer, progress=False)
    shutil.copytree(cache_dir / key, tmp_path / "cache" / key)
    recipe["data"]["cache_dir"] = str(tmp_path / "cache")
    path = write_recipe(tmp_path / "r.yaml", recipe)
    shard = sorted((tmp_path / "cache").rglob("*.bin"))[0]
    flip_byte(shard, offset=10)
    res = invoke_cli("run", str(path), "--run-dir", str(tmp_path / "b"), "-q")
    assert res.returncode == 2
    assert shard.name in res.stderr and "corrupt" in res.stderr


def test_missing_and_empty_corpus_are_clear_errors(small_corpus: Path, tmp_path: Path) -> None:
    recipe = tiny_recipe_dict(small_corpus, tmp_path / "cache")
    recipe["data"]["source"] = str(tmp_path / "nowhere")
    res = invoke_cli(
        "run", str(write_recipe(tmp_path / "a.yaml", recipe)), "--run-dir", str(tmp_path / "a")
    )
    assert res.returncode == 2 and "nowhere" in res.stderr
    (tmp_path / "empty").mkdir()
    recipe["data"]["source"] = str(tmp_path / "empty")
    res = invoke_cli(
        "run", str(write_recipe(tmp_path / "b.yaml", recipe)), "--run-dir", str(tmp_path / "b")
    )
    assert res.returncode == 2 and "empty" in res.stderr


def test_unwritable_run_dir_exit_2(tiny_recipe: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    res = invoke_cli("run", str(tiny_recipe), "--run-dir", str(blocker / "run"))
    assert res.returncode == 2
    assert "cannot write to run dir" in res.stderr and "--run-dir" in res.stderr


def _limit_file_size() -> None:
    # A real kernel limit: writes past 100 kB fail with EFBIG, like a disk that fills up. The
    # checkpoint write fails first; the report written while the run closes would fail too.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))


def test_disk_full_during_checkpoint_keeps_previous(tiny_recipe: Path, tiny_run_copy: Path) -> None:
    run_dir = tiny_run_copy
    args = [sys.executable, "-m", "trainguard", "run", str(tiny_recipe), "--run-dir", str(run_dir)]
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_INJECT"}
    res = subprocess.run(
        [*args, "-q", "--json", "--set", "train.max_steps=16"],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=_limit_file_size,
    )
    # Exit 1: an output (the checkpoint) could not be written after training ran; not 2, which
    # says the input was bad and nothing was started.
    assert res.returncode == 1, res.stderr
    # The error is the checkpoint's, not a traceback from the cleanup that failed after it.
    assert "checkpoint" in res.stderr.lower() and "Traceback" not in res.stderr
    payload = json.loads(res.stdout)  # exactly one JSON object
    assert payload["exit_status"] == 1 and "checkpoint" in payload["error"]["message"].lower()
    assert "free disk space" in payload["error"]["fix"]
    assert not (run_dir / "checkpoints" / "step-16").exists()
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept == ["step-12", "step-4", "step-8"], kept
    res = invoke_cli(*args[3:], "-q", "--json", "--set", "train.max_steps=16")
    payload = json.loads(res.stdout)
    assert payload["resumed_from"] == 12 and payload["final_step"] == 16


@pytest.mark.slow  # ~35 s; test_watchdog.py covers unlogged_hang_reports in process
def test_a_hang_is_in_the_log_once_after_the_relaunch(tiny_recipe: Path, tmp_path: Path) -> None:
    """The hung process exits at once (status 3) and writes its R210 only to hang-*.json; the
    relaunch puts it in metrics.jsonl, and a later resume does not log it again."""
    run_dir = tmp_path / "run"
    args = ["run", str(tiny_recipe), "--run-dir", str(run_dir), "-q"]
    fast_hang = ["--set", "guards.hang_floor_s=1"]
    res = run_cli(*args, *fast_hang, env={"TRAINGUARD_INJECT": "hang@6"})
    assert res.returncode == 3, res.stderr[-2000:]
    assert len(list(run_dir.glob("hang-*.json"))) == 1

    def r210_rows() -> list[dict]:
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if r.get("kind") == "finding" and r["code"] == "R210"]

    assert r210_rows() == []  # the hung process could not log it
    assert run_cli(*args, *fast_hang).returncode == 0
    (logged,) = r210_rows()
    assert logged["step"] == 5 and logged["where"] == "forward"
    assert logged["data"]["stack_file"].startswith("hang-")
    # Re-running the finished run (it re-evaluates) resumes again: still the one row.
    assert run_cli(*args, *fast_hang).returncode == 0
    assert len(r210_rows()) == 1


SLOW_DISK = """
import sys, time
import yaml
import trainguard
from trainguard.config.load import validate_recipe
from trainguard.faults import FaultPlan

class SlowDisk(trainguard.Callback):
    name = "slow-disk"
    priority = 10  # before the faults callback (-100) hears of the write
    def on_checkpoint_write(self, ctx, step):
        time.sleep(1.0)  # a slow disk, or a machine too loaded to run the writer thread

recipe = validate_recipe(yaml.safe_load(open(sys.argv[1])))
plan = FaultPlan.parse("kill@3:checkpoint_write")  # the write of checkpoint 4 (after step 3)
trainguard.run_recipe(
    recipe, sys.argv[2], progress=False, report=False, evals=False, faults=plan,
    callbacks=[SlowDisk()],
)
"""


def test_a_kill_mid_write_stops_the_loop_at_the_next_step_however_slow_the_write(
    tiny_recipe: Path, tmp_path: Path
) -> None:
    """`kill@N:checkpoint_write` strikes in the writer thread while step N + 1 waits in its
    data phase, so the steps logged before the kill (and a drill's steps lost) do not depend
    on how fast the write gets there. Before, a 1 s write let the loop log steps past N."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", SLOW_DISK, str(tiny_recipe), str(run_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == -signal.SIGKILL, res.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("kind") == "step"] == [0, 1, 2, 3]
    assert not (run_dir / "checkpoints" / "step-4" / "manifest.json").exists()  # never committed
