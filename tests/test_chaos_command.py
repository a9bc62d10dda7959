"""`trainguard drill --chaos DURATION --command "..."` (issue 24 item 2, a user's command): the
command's parsing and refusals, the rank-1 worker found in a real process tree, the newest
checkpoint of a real Checkpointer root corrupted, the run's length and checkpoint interval read
from a real loop's record, and a short soak of `torchrun examples/ddp_loop.py` that fails if
anything was lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from publicloop import public_loop
from runhelpers import run_cli
from trainguard.drills.chaos import corrupt_newest
from trainguard.drills.chaos_command import (
    COMMAND_KINDS,
    command_kinds,
    command_nproc,
    parse_command,
)
from trainguard.drills.chaos_external import CommandLauncher, rank_process, workers
from trainguard.drills.chaos_plan import checkpoint_root, plan_of
from trainguard.drills.chaos_schedule import Fault
from trainguard.errors import BadInputError
from trainguard.util.processes import descendants, signal_process

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def test_a_command_is_split_as_a_shell_would_and_needs_its_run_dir() -> None:
    argv = parse_command("torchrun --nproc-per-node 2 'my loop.py' --out {run_dir}/x")
    assert argv == ["torchrun", "--nproc-per-node", "2", "my loop.py", "--out", "{run_dir}/x"]
    with pytest.raises(BadInputError, match=r"no \{run_dir\}"):
        parse_command("torchrun train.py --out runs/a")
    with pytest.raises(BadInputError, match="empty"):
        parse_command("   ")
    with pytest.raises(BadInputError, match="cannot be split"):
        parse_command("python 'train.py --out {run_dir}")


@pytest.mark.parametrize(
    ("words", "nproc"),
    [
        ("torchrun --nproc-per-node 2 t.py", 2),
        ("torchrun --nproc_per_node=4 t.py", 4),
        ("python -m torch.distributed.run --nproc-per-node=3 t.py", 3),
        ("torchrun --nproc-per-node auto t.py", None),
        ("python t.py", None),
    ],
)
def test_the_processes_a_command_starts(words: str, nproc: int | None) -> None:
    assert command_nproc(words.split()) == nproc


def test_faults_that_need_a_hook_inside_the_loop_are_refused() -> None:
    two = ["torchrun", "--nproc-per-node", "2", "t.py", "--out", "{run_dir}"]
    one = ["torchrun", "--nproc-per-node", "1", "t.py", "--out", "{run_dir}"]
    assert command_kinds(None, two) == COMMAND_KINDS
    assert command_kinds(None, one) == ("kill", "corrupt")
    for kind in ("nan", "hang"):
        with pytest.raises(BadInputError, match="from outside"):
            command_kinds([f"kill,{kind}"], two)
    with pytest.raises(BadInputError, match="several processes"):
        command_kinds(["rank_kill"], one)
    # A command that does not say (a script that launches torchrun): the reference run decides.
    assert command_kinds(["hung_rank"], ["sh", "train.sh", "{run_dir}"]) == ("hung_rank",)


def test_the_rank_1_worker_is_found_in_a_real_process_tree() -> None:
    """A launcher (RANK unset) with one worker of RANK=1: the worker is found by its
    environment, and a signal for a process that ended is never sent to its pid's next owner."""
    worker = (
        "import os, subprocess, sys; subprocess.run([sys.executable, '-c', "
        "'import time; time.sleep(60)'], env={**os.environ, 'RANK': '1'})"
    )
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    launcher = subprocess.Popen([sys.executable, "-c", worker], env=env, start_new_session=True)
    try:
        found = None
        for _ in range(200):  # the worker starts within a few seconds
            found = rank_process(launcher.pid, 1)
            if found is not None:
                break
            time.sleep(0.05)
        assert found is not None
        pid, start = found
        assert pid != launcher.pid and (pid, start) in descendants(launcher.pid)
        assert rank_process(launcher.pid, 0) is None
        assert not signal_process(pid, str(int(start) + 1), signal.SIGKILL)  # not that process
        assert signal_process(pid, start, signal.SIGKILL)
        launcher.wait(timeout=30)
        assert not signal_process(pid, start, 0)  # it has ended
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)  # its own group: the worker too
        launcher.wait()


def test_a_workers_children_are_not_workers() -> None:
    """A worker's child (a data-loader worker, a compiler) inherits its RANK: the hung-rank
    reaper watches the worker, the nearest process of each RANK, not the child, whose exit
    would otherwise count as a survivor ending."""
    worker = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        "'import time; time.sleep(60)'])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", worker], env={**os.environ, "RANK": "0"}, start_new_session=True
    )
    try:
        found: list = []
        for _ in range(200):  # both start within a few seconds
            ours = {proc.pid, *(pid for pid, _ in descendants(proc.pid))}
            # This process's other children (a Spark JVM of another test) are not ours.
            found = [p for p in descendants(os.getpid()) if p[0] in ours]
            if len(found) >= 2:
                break
            time.sleep(0.05)
        assert len(found) == 2, found
        assert {r: pid for r, (pid, _) in workers(found).items()} == {"0": proc.pid}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_workdir_with_an_earlier_soaks_runs_is_refused(tmp_path: Path) -> None:
    """Its runs would resume there, not start over: refused before anything starts."""
    (tmp_path / "reference").mkdir()
    with pytest.raises(BadInputError, match="earlier soak"):
        CommandLauncher(["t", "{run_dir}"], tmp_path, ("kill",))
    assert [p.name for p in tmp_path.iterdir()] == ["reference"]


def test_each_fault_says_what_is_sent_to_the_job(tmp_path: Path) -> None:
    """The JSON's `inject` of a command's fault is the signal and its moment, not the
    TRAINGUARD_INJECT item a `trainguard run` would read (the user's loop reads none)."""
    launcher = CommandLauncher(["t", "{run_dir}"], tmp_path, ("rank_kill",))
    said = launcher.describe([Fault("rank_kill", 14), Fault("hung_rank", 20)])
    assert said == (
        "SIGKILL of rank 1 once step 13 is recorded, SIGSTOP of rank 1 once step 19 is recorded"
    )


def test_the_plan_and_the_checkpoint_root_come_from_the_loops_record(tmp_path: Path) -> None:
    public_loop(
        tmp_path / "run", steps=14, every=4, checkpoints="ckpt", keep=2
    )  # saves 4, 8, 12 and none at the end
    assert checkpoint_root(tmp_path / "run") == tmp_path / "run" / "ckpt"
    assert plan_of(tmp_path / "run", 0, tmp_path / "log") == (14, 4)
    with pytest.raises(BadInputError, match="exited 1"):
        plan_of(tmp_path / "run", 1, tmp_path / "log")
    with pytest.raises(BadInputError, match="no step rows"):
        plan_of(tmp_path / "empty", 0, tmp_path / "log")
    # Checkpoints outside the run dir: every run of the soak would resume from the same ones.
    public_loop(tmp_path / "shared", steps=6, every=3, checkpoints="../elsewhere")
    with pytest.raises(BadInputError, match="outside its run dir"):
        plan_of(tmp_path / "shared", 0, tmp_path / "log")


def test_the_newest_committed_checkpoint_is_corrupted_and_the_resume_records_it(
    tmp_path: Path,
) -> None:
    """The root the record names (not RUN_DIR/checkpoints): its newest step gets a flipped
    byte; the loop's resume passes over it to the one before and puts C101 on record."""
    run = tmp_path / "run"
    public_loop(run, steps=9, every=3, checkpoints="ckpt", keep=2)
    root = checkpoint_root(run)
    assert root is not None
    assert corrupt_newest(root) == "a byte of step-9/state.safetensors flipped"
    public_loop(
        run, steps=12, every=3, checkpoints="ckpt", keep=2
    )  # resumes from 6, trains on to 12
    rows = [json.loads(line) for line in (run / "guard.jsonl").read_text().splitlines()]
    assert any(r["code"] in ("C101", "C102") and r["step"] == 9 for r in rows)
    assert corrupt_newest(tmp_path / "none") == "no checkpoint to corrupt"


@pytest.mark.slow  # a reference run and five launches of a two-process torchrun: ~1.5 minutes
def test_a_soak_of_a_torchrun_command_loses_nothing(tmp_path: Path) -> None:
    command = [*TORCHRUN, "--nproc-per-node", "2", str(EXAMPLES / "ddp_loop.py")]
    command += ["--out", "{run_dir}", "--max-steps", "40", "--checkpoint-every", "5"]
    command += ["--device", "cpu"]
    args = ["drill", "--chaos", "1s", "--json", "--seed", "103", "--faults", "4"]
    args += ["--fault-kind", "kill,rank_kill,hung_rank,corrupt", "--workdir", str(tmp_path)]
    res = run_cli(*args, "--command", " ".join(command), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    (r,) = out["rounds"]
    # The hung rank lands 14 steps into its launch (which resumed from checkpoint 15): past
    # its warm-up, with the saved step times, so its collective timeout is the 15 s floor.
    labels = ["rank_kill@14", "corrupt@23", "hung_rank@29", "kill@31"]
    assert [f["label"] for f in r["faults"]] == labels
    assert all(f["detected"] for f in r["faults"]), r["faults"]
    rank_kill, corrupt, hung, kill = r["faults"]
    assert "R302" in rank_kill["codes"] and "R301" in hung["codes"]
    assert set(corrupt["codes"]) & {"C101", "C102"} and "flipped" in corrupt["note"]
    assert kill["codes"] == ["exit -9"]
    assert rank_kill["inject"] == "SIGKILL of rank 1 once step 13 is recorded"
    assert r["finished"] and r["final_step"] == 40
    assert r["bitwise_equal"] is True  # the fault-free run's weights, bit for bit
    assert len(r["goodput"]["restarts"]) == 4 and r["goodput"]["redone_steps"] > 0
    assert all(f["steps_lost"] is not None and f["recovery_s"] > 0 for f in r["faults"])
    assert Path(out["plot"]).is_file()
    # Nothing of the jobs outlives the soak: the stopped rank included.
    left = []
    for proc in Path("/proc").iterdir():
        try:
            if str(tmp_path).encode() in (proc / "cmdline").read_bytes():
                left.append(proc.name)
        except OSError:
            continue
    assert left == []
