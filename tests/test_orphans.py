"""No orphaned ranks (issue 26 item 1): the workers a trainguard command starts end with it,
however it ends, so a run dir's lock (held by `run --nproc`'s launcher) covers the whole job.

The launcher is SIGKILLed (no cleanup of its own can run), and its workers must be gone within
seconds: at start-up (fast, default suite) for `run --nproc 2` and `doctor --nproc 2`, and in
the middle of training (slow): no checkpoint appears afterwards, and a second `run` on the run
dir is accepted and resumes with no writer of the killed job alive beside it. The mechanism
itself (util/processes.py) is tested without torch: a direct child, a child of a fork server,
and a worker whose launcher ended before it looked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from runhelpers import run_cli, tiny_recipe_dict

# Processes of the killed job are polled for this long; they end within milliseconds.
GONE_WITHIN_S = 10.0
# Two processes on purpose, on a machine of any size (the count rule is tested elsewhere).
TWO = ["--nproc", "2", *(["--oversubscribe"] if len(os.sched_getaffinity(0)) < 2 else [])]


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(ppid, state, start time) of a live process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[1]), fields[0], fields[19]


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of the live children of `pid` that run `python -m trainguard`."""
    out = []
    for entry in Path("/proc").iterdir():
        st = _stat(int(entry.name)) if entry.name.isdigit() else None
        if st and st[0] == pid and st[1] not in ("Z", "X"):
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"\0-m\0trainguard\0" in cmdline:
                out.append((int(entry.name), st[2]))
    return out


def _alive(procs: list[tuple[int, str]]) -> list[int]:
    return [p for p, start in procs if (st := _stat(p)) and st[2] == start and st[1] != "Z"]


def _wait_for(what, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(interval)
    return what()


def _kill_all(procs: list[tuple[int, str]]) -> None:
    """The test's own cleanup (old code left the workers running)."""
    for p in _alive(procs):
        os.kill(p, signal.SIGKILL)


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainguard", *args],
        cwd=cwd,
        env={**os.environ, "CI": "1"},
        stdout=subprocess.DEVNULL,
        stderr=open(cwd / "launcher.err", "w"),  # noqa: SIM115 (closed with the process)
    )


def _workers(launcher: subprocess.Popen, n: int, timeout: float = 180) -> list[tuple[int, str]]:
    """The launcher's `n` worker processes, once the elastic agent has started them."""
    workers = _wait_for(lambda: len(kids := _children(launcher.pid)) >= n and kids, timeout)
    assert workers and len(workers) == n, (workers, launcher.poll())
    return workers


def _kill_launcher(launcher: subprocess.Popen) -> None:
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=30)


@pytest.mark.parametrize("command", ["run", "doctor"])
def test_workers_die_with_a_launcher_killed_at_start_up(
    command: str, tiny_recipe: Path, tmp_path: Path
) -> None:
    """SIGKILL of `run --nproc 2` (`doctor --nproc 2`) as soon as its two workers exist: both
    are gone within seconds (before: they went on for minutes, training and saving)."""
    if command == "run":
        args = ["run", str(tiny_recipe), "--run-dir", str(tmp_path / "run"), *TWO, "-q"]
    else:
        args = ["doctor", str(tiny_recipe), "--quick", *TWO, "--json"]
    launcher = _start(args, tmp_path)
    workers: list[tuple[int, str]] = []
    try:
        workers = _workers(launcher, 2)
        _kill_launcher(launcher)
        _wait_for(lambda: not _alive(workers), GONE_WITHIN_S)
        assert _alive(workers) == []
    finally:
        launcher.kill()
        _kill_all(workers)


def _steps(run_dir: Path) -> set[str]:
    root = run_dir / "checkpoints"
    return (
        {p.name for p in root.iterdir() if p.name.startswith("step-")} if root.is_dir() else set()
    )


@pytest.mark.slow  # ~30 s: a 2-process job trains until its first checkpoints, then a resume
def test_a_killed_launcher_leaves_no_writer_and_the_run_dir_resumes(
    small_corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL of `run --nproc 2` mid-training: its workers are gone within seconds, no
    checkpoint appears afterwards, and `run` on the same dir is accepted (the lock is free) and
    resumes from the last checkpoint with no writer of the killed job beside it."""
    recipe = tiny_recipe_dict(small_corpus, cache_dir)
    recipe["train"]["max_steps"] = 2000  # far more than the test lets it train
    recipe["checkpoint"]["interval"] = 2
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe))
    run_dir = tmp_path / "run"
    launcher = _start(
        ["run", str(path), "--run-dir", str(run_dir), *TWO, "-q", "--no-evals"], tmp_path
    )
    workers: list[tuple[int, str]] = []
    try:
        workers = _workers(launcher, 2)
        assert _wait_for(lambda: len(_steps(run_dir)) >= 2, 300), launcher.poll()
        _kill_launcher(launcher)
        _wait_for(lambda: not _alive(workers), GONE_WITHIN_S)
        assert _alive(workers) == []
        saved = _steps(run_dir)
        time.sleep(2.0)  # a writer still alive would add step folders meanwhile
        assert _steps(run_dir) == saved
        last = max(int(s.split("-")[1]) for s in saved)
    finally:
        launcher.kill()
        _kill_all(workers)
    res = run_cli(
        *("run", str(path), "--run-dir", str(run_dir), "--no-evals", "--json"),
        *("--set", f"train.max_steps={last + 2}"),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout)
    assert result["final_step"] == last + 2
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r["step"] for r in steps if r.get("kind") == "step"]
    # Resumed from the last checkpoint (`last` completed steps): steps last and last + 1, from 0.
    assert trained[-2:] == [last, last + 1]


def test_a_worker_refuses_a_run_dir_its_launcher_does_not_hold(
    tiny_recipe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torch_globals
) -> None:
    """A worker told that its launcher holds the lock (TRAINGUARD_LOCK_HOLDER) while nobody
    does: the launcher has ended, so rank 0 refuses instead of taking the lock itself and
    writing without the job's lock holder (before: it trained the whole run)."""
    from typer.testing import CliRunner

    from trainguard.cli import app
    from trainguard.util.runlock import HOLDER_ENV

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    monkeypatch.setenv(HOLDER_ENV, str(ended.pid))
    run_dir = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(tiny_recipe), "--run-dir", str(run_dir), "-q"])
    assert res.exit_code == 2, res.output
    assert "not held by the process that launched this job" in " ".join(res.output.split())
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()


# --- the mechanism, without torch -------------------------------------------------------------

_LAUNCHER = textwrap.dedent(
    """
    import multiprocessing, subprocess, sys, time
    from trainguard.util.processes import child_env, die_with_launcher, launcher_token

    CHILD = (
        "from trainguard.util.processes import die_with_launcher as d; import time; "
        "d(); time.sleep(600)"
    )

    def worker(token):
        die_with_launcher(token)
        time.sleep(600)

    if __name__ == "__main__":
        direct = subprocess.Popen([sys.executable, "-c", CHILD], env=child_env())
        ctx = multiprocessing.get_context("forkserver")
        served = ctx.Process(target=worker, args=(launcher_token(),))
        served.start()
        print(direct.pid, served.pid, flush=True)
        time.sleep(600)
    """
)


def test_direct_and_fork_server_children_die_with_a_killed_launcher(tmp_path: Path) -> None:
    """A child started with `child_env()` (parent-death signal and watcher) and a child of a
    fork server given the launcher's token (watcher only: its parent is the fork server) both
    end when the launcher is SIGKILLed."""
    script = tmp_path / "launcher.py"
    script.write_text(_LAUNCHER)
    launcher = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    kids: list[tuple[int, str]] = []
    try:
        line = launcher.stdout.readline()
        kids = [(p, st[2]) for p in map(int, line.split()) if (st := _stat(p))]
        assert len(kids) == 2, line
        time.sleep(0.5)  # both have called die_with_launcher by now (no torch to import)
        assert _alive(kids) == [p for p, _ in kids]
        _kill_launcher(launcher)
        _wait_for(lambda: not _alive(kids), GONE_WITHIN_S)
        assert _alive(kids) == []
    finally:
        launcher.kill()
        _kill_all(kids)


def test_a_worker_whose_launcher_has_already_ended_stops_at_once(tmp_path: Path) -> None:
    """The start-up race: the launcher ended before the worker looked (its pid may even be
    reused: the start time tells). `python -m trainguard` ends by SIGKILL before any command."""
    from trainguard.util.processes import LAUNCHER_ENV, launcher_token

    gone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    token = launcher_token(gone.pid)
    gone.kill()
    gone.wait()
    res = subprocess.run(
        [sys.executable, "-m", "trainguard", "recipes"],
        env={**os.environ, LAUNCHER_ENV: token},
        capture_output=True,
        timeout=120,
    )
    assert res.returncode == -signal.SIGKILL and res.stdout == b""
    alive = launcher_token()  # this process: alive, so the same command runs
    res = subprocess.run(
        [sys.executable, "-m", "trainguard", "recipes"],
        env={**os.environ, LAUNCHER_ENV: alive},
        capture_output=True,
        timeout=120,
    )
    assert res.returncode == 0 and b"default" in res.stdout


def test_a_workers_own_children_are_not_workers() -> None:
    """A worker's subprocess (a user's tool, `trainguard report` from a hook) must not inherit
    the launcher's name: it would die with the launcher, or kill itself at start once the
    launcher had ended (found in review)."""
    from trainguard.util.processes import LAUNCHER_ENV, launcher_token

    script = (
        "import os, sys\n"
        "from trainguard.util.processes import die_with_launcher, LAUNCHER_ENV\n"
        "die_with_launcher()\n"
        "sys.stdout.write(repr(os.environ.get(LAUNCHER_ENV)))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, LAUNCHER_ENV: launcher_token()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and res.stdout == "None", (res.stdout, res.stderr)


def test_a_run_started_by_a_worker_for_another_run_dir_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's hook that starts `trainguard run --run-dir OTHER` inherits the holder's
    name; with the launcher alive that is a nested run, not an orphan (found in review)."""
    from trainguard.train.rundir import hold_run_dir
    from trainguard.train.world import Dist
    from trainguard.util.runlock import HOLDER_ENV

    monkeypatch.setenv(HOLDER_ENV, str(os.getpid()))  # alive, holding some other run dir
    (tmp_path / "other").mkdir()
    with hold_run_dir(tmp_path / "other", Dist()) as lock:
        assert lock is not None  # taken, not refused
