"""Trust in `trainguard run`'s exits: the run-dir lock, one JSON object per exit, signals, D104,
errors never masked by cleanup, and bad input that is refused before any work."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from runhelpers import invoke_cli, run_cli, tiny_recipe_dict, tree_snapshot
from trainguard.cli import app
from trainguard.errors import ExitStatus, RunDirBusyError
from trainguard.util.runlock import LOCK_FILE, FolderLock, read_holder

# A finished 12-step copy resumes from step 12. Use-case evals are not under test here: off,
# to keep these runs short (the run dir's recipe does not record the flag).
RESUME = ["--no-evals", "--set", "train.max_steps=16"]


def start_cli(*args: str, inject: str = "", stdout: int = subprocess.PIPE) -> subprocess.Popen:
    """`python -m trainguard ARGS` in the background, as a user's terminal would run it."""
    env = {**os.environ, "CI": "1"}
    env.pop("TRAINGUARD_INJECT", None)
    if inject:
        env["TRAINGUARD_INJECT"] = inject
    return subprocess.Popen(
        [sys.executable, "-m", "trainguard", *args],
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(proc: subprocess.Popen, ready, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"exited {proc.returncode} before {what}:\n{out}\n{err[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count('"kind": "step"') if path.exists() else 0


def one_json(stdout: str) -> dict:
    """stdout holds exactly one JSON object (json.loads refuses anything after it)."""
    return json.loads(stdout)


def codes(payload: dict) -> list[str]:
    return [f["code"] for f in payload["findings"]]


# --- the run-dir lock ------------------------------------------------------------------------
@pytest.mark.xdist_group("timing-serial")  # a hang watchdog with a short floor
def test_run_dir_lock_refuses_a_second_run_and_a_killed_holder_is_taken_over(
    tiny_recipe: Path, tiny_run_copy: Path
) -> None:
    args = ["run", str(tiny_recipe), "--run-dir", str(tiny_run_copy), "-q", *RESUME]
    first = start_cli(*args, inject="hang@13")  # resumes from 12; hangs in step 13 (0-based)
    backstop = tiny_run_copy / f"hang-backstop-{first.pid}.txt"  # its watchdog is armed
    try:
        wait_until(first, lambda: steps_logged(tiny_run_copy) >= 13, "the first run's step 13")
        wait_until(first, backstop.exists, "the first run's armed watchdog")
        second = run_cli(*args, "--json")
        assert second.returncode == 2, second.stderr[-3000:]
        assert f"pid {first.pid}" in second.stderr and "--run-dir" in second.stderr
        assert "Traceback" not in second.stderr
        refused = one_json(second.stdout)
        assert refused["ok"] is False and refused["exit_status"] == 2
        assert f"pid {first.pid}" in refused["error"]["message"]
        assert steps_logged(tiny_run_copy) == 13  # the refused run wrote nothing
    finally:
        first.kill()  # SIGKILL: no cleanup at all; the kernel releases the flock
        first.communicate()
    # The run that takes over also meets a NaN batch: its guard skips the update, the run
    # finishes, so it is ok with an R101 finding of its own severity.
    third = run_cli(*args, "--json", env={"TRAINGUARD_INJECT": "nan@13"})
    assert third.returncode == 0, third.stderr[-3000:]
    done = one_json(third.stdout)
    assert done["ok"] is True and done["exit_status"] == 0
    assert done["resumed_from"] == 12 and done["final_step"] == 16
    assert "R101" in codes(done) and any(f["severity"] == "error" for f in done["findings"])
    assert read_holder(tiny_run_copy / LOCK_FILE) is None  # released at the end
    assert not backstop.exists()  # the killed run's unused backstop file was cleared


def test_folder_lock_names_its_holder_and_refuses_a_symlink(tmp_path: Path) -> None:
    held = FolderLock(tmp_path / "run", "trainguard run").acquire()
    holder = read_holder(tmp_path / "run" / LOCK_FILE)
    assert holder is not None and holder["pid"] == os.getpid()
    assert holder["command"] == "trainguard run" and holder["host"] and holder["started"]
    # flock locks belong to an open file: a second open in this very process is refused too.
    with pytest.raises(RunDirBusyError, match=f"pid {os.getpid()}") as e:
        FolderLock(tmp_path / "run", "trainguard scale run").acquire()
    assert e.value.exit_status == 2 and "--run-dir" in e.value.fix
    held.release()
    FolderLock(tmp_path / "run", "trainguard run").acquire().release()
    (tmp_path / "elsewhere").write_text("x")
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Exception, match="cannot lock"):
        FolderLock(tmp_path / "planted", "trainguard run").acquire()
    assert (tmp_path / "elsewhere").read_text() == "x"


def test_scale_run_refuses_a_locked_output_folder(tiny_recipe: Path, tmp_path: Path) -> None:
    out = tmp_path / "scale"
    held = FolderLock(out, "trainguard scale run").acquire()
    try:
        res = run_cli(
            "scale", "run", str(tiny_recipe), "--grid", "train.max_steps=2", "--out", str(out)
        )
    finally:
        held.release()
    assert res.returncode == 2, res.stderr[-3000:]
    assert f"pid {os.getpid()}" in res.stderr and "Traceback" not in res.stderr
    assert not (out / "runs.csv").exists() and not list(out.glob("*=*"))


@pytest.mark.slow  # two torchrun workers (~15 s); the --nproc launcher's lock is exercised by
# test_distributed_gloo.py's elastic resume, whose workers must not wait on their launcher
def test_external_torchrun_job_is_refused_on_every_rank(tiny_recipe: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
    launcher += ["--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-id", "job1"]
    launcher += ["--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1"]
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_INJECT"}
    with FolderLock(run_dir, "a test holder"):
        res = subprocess.run(
            [*launcher, "-m", "trainguard", "run", str(tiny_recipe), "--run-dir", str(run_dir)]
            + ["-q", "--json"],
            capture_output=True,
            text=True,
            env={**env, "CI": "1"},
            timeout=300,
        )
    assert res.returncode != 0
    assert res.stderr.count(f"in use by pid {os.getpid()}") == 2, res.stderr[-3000:]  # each rank
    payload = one_json(res.stdout)  # rank 0 alone prints
    assert payload["exit_status"] == 2 and payload["error"]["type"] == "RunDirBusyError"
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]


# --- `run --json`: one object on every exit, `ok` agrees with the exit status ------------------
@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--nproc", "0"], "--nproc 0"),
        (["--nproc", "-3"], "--nproc -3"),
        (["--max-restarts", "-1"], "--max-restarts -1"),
        (["--nproc", "two"], "--nproc"),  # a usage error found by the parser
        (["--set", "train.nope=1"], "train.nope"),
    ],
)
def test_run_json_bad_input_is_one_object_and_exit_2(
    tiny_recipe: Path, tmp_path: Path, flags: list[str], says: str
) -> None:
    run_dir = tmp_path / "run"
    res = CliRunner().invoke(
        app, ["run", str(tiny_recipe), "--run-dir", str(run_dir), "--json", *flags]
    )
    assert res.exit_code == 2, res.output
    payload = one_json(res.stdout)
    assert payload["ok"] is False and payload["exit_status"] == 2
    assert says in payload["error"]["message"]
    assert not run_dir.exists()  # refused before anything was written


@pytest.mark.xdist_group("timing-serial")  # a hang watchdog with a short floor
def test_run_json_hang_is_one_object_and_exit_3(small_corpus: Path, cache_dir: Path, tmp_path):
    recipe = tiny_recipe_dict(small_corpus, cache_dir)
    recipe["guards"] = {"hang_floor_s": 2}
    path = tmp_path / "hang.yaml"
    path.write_text(yaml.safe_dump(recipe))
    args = ["run", str(path), "--run-dir", str(tmp_path / "run"), "--json", "-q", "--no-evals"]
    res = run_cli(*args, env={"TRAINGUARD_INJECT": "hang@2"})
    assert res.returncode == ExitStatus.HANG, res.stderr[-3000:]
    payload = one_json(res.stdout)
    assert payload["ok"] is False and payload["exit_status"] == ExitStatus.HANG
    assert "R210" in codes(payload) and "resume" in payload["error"]["fix"]


# --- D104: data changed since the checkpoint --------------------------------------------------
def test_changed_data_stops_the_resume_unless_accepted(small_corpus: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus / "email", corpus / "email")
    recipe = tiny_recipe_dict(corpus, tmp_path / "cache")
    recipe["train"]["max_steps"] = 2
    recipe["checkpoint"]["interval"] = 2
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    run_dir = tmp_path / "run"
    args = ["run", str(path), "--run-dir", str(run_dir), "--json", "-q", "--no-evals"]
    assert invoke_cli(*args).returncode == 0
    with open(corpus / "email" / "utils.py", "a") as f:
        f.write("\n# an edit after the run started\n")
    more = ["--set", "train.max_steps=4"]
    before = tree_snapshot(run_dir)
    stopped = invoke_cli(*args, *more)
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    # Refused before the first write: tokenizer.json, recipe.yaml (its max_steps), the log and
    # the report are as they were (issue 26).
    assert tree_snapshot(run_dir) == before
    payload = one_json(stopped.stdout)  # a halted run prints its one object too
    assert payload["ok"] is False and payload["exit_status"] == 1 and "D104" in codes(payload)
    assert payload["error"]["type"] == "RunHalted" and "step 2" in payload["error"]["message"]
    assert "--accept-data-change" in stopped.stderr
    assert steps_logged(run_dir) == 2  # stopped before training on the new data
    accepted = invoke_cli(*args, *more, "--accept-data-change")
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    payload = one_json(accepted.stdout)
    assert payload["ok"] is True and payload["final_step"] == 4 and "D104" in codes(payload)


# --- errors are never masked by cleanup ------------------------------------------------------
def _limit_file_size(limit: int):
    def apply() -> None:
        # A real kernel limit: writes past `limit` bytes fail (EFBIG), as on a full disk.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


# Nothing can be written (a read-only run dir). A checkpoint write that fails, with the
# report after it failing too, is test_run_faults.py's disk-full test.
@pytest.mark.parametrize(("limit", "says"), [(0, "cannot write to run dir")])
def test_write_failure_is_exit_2_not_a_traceback_from_cleanup(
    tiny_recipe: Path, tiny_run_copy: Path, limit: int, says: str
) -> None:
    before = (tiny_run_copy / "metrics.jsonl").read_bytes()
    args = ["run", str(tiny_recipe), "--run-dir", str(tiny_run_copy), "-q", "--json", *RESUME]
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_INJECT"}
    res = subprocess.run(
        [sys.executable, "-m", "trainguard", *args],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=_limit_file_size(limit),
        timeout=240,
    )
    assert res.returncode == 2, res.stderr[-3000:]
    assert says in res.stderr.lower() and "Traceback" not in res.stderr
    payload = one_json(res.stdout)
    assert payload["exit_status"] == 2 and says in payload["error"]["message"].lower()
    if limit == 0:
        assert (tiny_run_copy / "metrics.jsonl").read_bytes() == before


# --- signals ---------------------------------------------------------------------------------
def test_sigterm_stops_like_ctrl_c_and_leaves_no_backstop_file(
    tiny_recipe: Path, tiny_run_copy: Path
) -> None:
    args = ["run", str(tiny_recipe), "--run-dir", str(tiny_run_copy), "-q", "--json", *RESUME]
    proc = start_cli(*args, inject="hang@13")
    backstop = tiny_run_copy / f"hang-backstop-{proc.pid}.txt"
    wait_until(proc, backstop.exists, "the hang watchdog's backstop file")
    wait_until(proc, lambda: steps_logged(tiny_run_copy) >= 13, "step 13")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitStatus.TERMINATED, err[-3000:]
    assert "Traceback" not in err and "Fatal Python error" not in err
    payload = one_json(out)
    assert payload["exit_status"] == ExitStatus.TERMINATED and payload["final_step"] == 13
    assert not list(tiny_run_copy.glob("hang-*")), list(tiny_run_copy.iterdir())


def _fill(fd: int) -> None:
    """Fill the pipe behind `fd` to the brim: its next write blocks."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    try:
        for chunk in (4096, 1):
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(fd, b" " * chunk)
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)


def _drain(fd: int) -> None:
    while os.read(fd, 1 << 16):
        pass


def test_a_second_ctrl_c_during_shutdown_exits_130(tiny_recipe: Path, tiny_run_copy: Path) -> None:
    """The run's shutdown after Ctrl-C writes the report, then its one JSON object to stdout: a
    stdout pipe filled to the brim holds it there, alive and in its shutdown, for certain, until
    the second Ctrl-C."""
    read_end, write_end = os.pipe()
    report = tiny_run_copy / "report.html"
    written = report.stat().st_mtime_ns
    args = ["run", str(tiny_recipe), "--run-dir", str(tiny_run_copy), "--json", *RESUME]
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, read_end)
        proc = start_cli(*args, inject="hang@13", stdout=write_end)
        stack.callback(lambda: proc.poll() is None and proc.kill())
        wait_until(proc, lambda: steps_logged(tiny_run_copy) >= 13, "step 13")
        _fill(
            write_end
        )  # step 13 (0-based) hangs in its forward: nothing else writes to stdout now
        os.close(write_end)
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 120
        while report.stat().st_mtime_ns == written:  # the first Ctrl-C's shutdown has begun
            assert proc.poll() is None, "exited before the second Ctrl-C"
            assert time.monotonic() < deadline, "the interrupted run never wrote its report"
            time.sleep(0.01)
        assert proc.poll() is None, "exited before the second Ctrl-C"  # held by the full pipe
        proc.send_signal(signal.SIGINT)
        drained = threading.Thread(target=_drain, args=(read_end,), daemon=True)
        drained.start()
        _, err = proc.communicate(timeout=120)
        drained.join(30)
    assert proc.returncode == ExitStatus.INTERRUPTED, err[-3000:]
    assert "SIGINT again: exiting now" in err, err[-3000:]  # cli/_signals.py, on the second
    assert "Fatal Python error" not in err and "Traceback" not in err


# --- drill: its recipe and --set are checked before any drill runs ----------------------------
@pytest.mark.parametrize(
    "flags",
    [["--recipe", "MISSING.yaml"], ["--set", "train.nope=1"], ["--set", "train.lr"]],
)
def test_drill_bad_recipe_or_set_is_exit_2_before_any_drill(
    tmp_path: Path, flags: list[str]
) -> None:
    res = CliRunner().invoke(app, ["drill", "--workdir", str(tmp_path / "w"), *flags])
    assert res.exit_code == 2, res.output
    assert (flags[1].split("=")[0]) in res.output
    assert not (tmp_path / "w").exists() or not list((tmp_path / "w").iterdir())
