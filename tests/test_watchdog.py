"""The hang watchdog: a real process that hangs is dumped and exits 3; a healthy one is not."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from trainguard.errors import ExitStatus
from trainguard.guard.hang_report import read_hang_reports
from trainguard.guard.watchdog import Watchdog

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from trainguard.guard.watchdog import Watchdog

    run_dir, mode = sys.argv[1], sys.argv[2]
    wd = Watchdog(run_dir, floor_s=0.6, factor=5.0, rank=0, backstop_s=1.0).start()

    def stuck_in_backward():
        time.sleep(120)  # a collective that never returns

    def stuck_in_c_holding_the_gil():
        import re
        re.match(r"(a+)+$", "a" * 64 + "b")  # catastrophic backtracking, GIL held throughout

    for step in range(25):
        with wd.phase("data"):
            time.sleep(0.005)
        with wd.phase("forward"):
            time.sleep(0.01)
        if mode == "hang" and step == 20:
            with wd.phase("backward"):
                stuck_in_backward()
        if mode == "gil" and step == 20:
            with wd.phase("forward"):
                stuck_in_c_holding_the_gil()
        wd.heartbeat(step)
    wd.stop()
    print("finished")
    """
)


# timing-based (stragglers, hangs, watchdogs, doctor): one after the other on one worker under xdist
pytestmark = pytest.mark.xdist_group("timing-serial")


def _run(tmp_path, mode):
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(script), str(run_dir), mode],
        capture_output=True,
        text=True,
        timeout=90,
    )
    return proc, run_dir


def test_hang_dumps_stacks_and_exits_3(tmp_path):
    proc, run_dir = _run(tmp_path, "hang")
    assert proc.returncode == ExitStatus.HANG, proc.stderr
    assert "finished" not in proc.stdout
    dumps = list(run_dir.glob("hang-*-rank0.txt"))
    assert len(dumps) == 1
    text = dumps[0].read_text()
    assert "phase backward" in text
    assert "stuck_in_backward" in text  # the main thread's frame is in the dump
    assert "last completed step 19" in text
    finding = json.loads(dumps[0].with_suffix(".json").read_text())
    assert finding["code"] == "R210" and finding["severity"] == "error"
    assert finding["step"] == 19 and finding["rank"] == 0
    assert finding["data"]["phase"] == "backward"
    assert "stuck_in_backward" in finding["data"]["stuck_at"]
    # Recorded to the millisecond, so a firing just past the timeout can round to equal it.
    assert finding["data"]["elapsed_s"] >= finding["data"]["timeout_s"] >= 0.6
    reports = read_hang_reports(run_dir)
    assert [(f.code, f.where) for f in reports] == [("R210", "backward")]
    assert not list(run_dir.glob("hang-backstop-*"))  # the Python path fired, not the backstop


def test_hang_holding_the_gil_is_caught_by_the_backstop(tmp_path):
    proc, run_dir = _run(tmp_path, "gil")
    assert proc.returncode == 1, proc.stderr  # faulthandler's fixed exit status
    assert "finished" not in proc.stdout
    backstops = list(run_dir.glob("hang-backstop-*.txt"))
    assert len(backstops) == 1
    assert "stuck_in_c_holding_the_gil" in backstops[0].read_text()


def test_healthy_loop_is_never_killed(tmp_path):
    proc, run_dir = _run(tmp_path, "clean")
    assert proc.returncode == 0, proc.stderr
    assert "finished" in proc.stdout
    assert list(run_dir.glob("hang-*")) == []
    assert read_hang_reports(run_dir) == []


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_timeout_is_learned_from_step_times(tmp_path):
    clock = FakeClock()
    wd = Watchdog(tmp_path, floor_s=10.0, factor=5.0, window=8, clock=clock)
    assert wd.timeout() == 10.0  # nothing learned yet: the floor
    assert wd.current_phase == "startup"
    for step, dt in enumerate([1.0, 3.0, 4.0, 4.0, 5.0, 4.0]):
        clock.t += dt
        wd.heartbeat(step)
    # The first heartbeat starts the clock; durations 3, 4, 4, 5, 4 -> median 4 -> 5 * 4 = 20.
    assert wd.timeout() == pytest.approx(20.0)
    clock.t += 19.0
    assert not wd.overdue()
    clock.t += 2.0
    assert wd.overdue()
    with wd.phase("checkpoint"):
        wd.phase_floors["checkpoint"] = 60.0
        assert wd.timeout() == 60.0 and not wd.overdue()
    assert wd.current_phase == "loop"  # between phases after the first step
    # Fast steps never take the timeout below the floor.
    for step in range(6, 20):
        clock.t += 0.01
        wd.heartbeat(step)
    assert wd.timeout() == 10.0


def test_from_guards_config(tmp_path):
    from trainguard.guard.config import GuardsConfig

    wd = Watchdog.from_config(tmp_path, GuardsConfig(hang_floor_s=42.0, hang_window=4), rank=1)
    assert (wd.floor_s, wd.factor, wd.durations.maxlen, wd.rank) == (42.0, 5.0, 4, 1)


def test_fire_without_exit_writes_the_report(tmp_path):
    wd = Watchdog(tmp_path, floor_s=1.0, exit_process=False, rank=3)
    wd.heartbeat(41)
    wd.set_phase("collective")
    seen = []
    wd.on_timeout = seen.append
    f = wd.fire(elapsed=12.5, timeout=10.0)
    assert (f.code, f.step, f.rank, f.data["phase"]) == ("R210", 41, 3, "collective")
    assert seen == [f]
    assert (tmp_path / f.data["stack_file"]).read_text().count("--- thread") >= 1


def test_watchdog_thread_fires_in_process(tmp_path):
    # A heartbeat that stops in a worker thread's loop: the real thread, no exit.
    wd = Watchdog(tmp_path, floor_s=0.3, poll_s=0.05, exit_process=False)
    done = threading.Event()
    wd.on_timeout = lambda f: done.set()
    wd.start()
    for step in range(3):
        time.sleep(0.02)
        wd.heartbeat(step)
    assert done.wait(10.0)
    wd.stop()
    assert wd.fired is not None and wd.fired.step == 2


def test_resume_logs_each_earlier_hang_once(tmp_path):
    """What the relaunch adds to metrics.jsonl: the hangs in hang-*.json not logged yet."""
    from trainguard.metrics.jsonl import MetricsLog
    from trainguard.train.start import unlogged_hang_reports

    assert unlogged_hang_reports(tmp_path) == []
    first = Watchdog(tmp_path, floor_s=1.0, exit_process=False, rank=0)
    first.heartbeat(7)
    hang = first.fire(elapsed=3.0, timeout=1.0)
    (found,) = unlogged_hang_reports(tmp_path)
    assert (found.code, found.step, found.data["stack_file"]) == (
        "R210",
        7,
        hang.data["stack_file"],
    )
    log = MetricsLog(tmp_path)
    log.write({"kind": "finding", **found.to_dict()})
    log.close()
    assert unlogged_hang_reports(tmp_path) == []  # logged once: a second resume adds nothing
    time.sleep(0.01)  # a later hang gets a later timestamped file name
    second = Watchdog(tmp_path, floor_s=1.0, exit_process=False, rank=0)
    second.heartbeat(9)
    later = second.fire(elapsed=3.0, timeout=1.0)
    assert [f.data["stack_file"] for f in unlogged_hang_reports(tmp_path)] == [
        later.data["stack_file"]
    ]
