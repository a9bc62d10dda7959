"""Nothing trainguard writes or moves in a run dir goes through a link (issue 26, item 6): a
symlinked metrics.jsonl, guard.jsonl, quarantine/ or stack-dump file is refused with an error
naming it (LinkRefused, an OutputWriteError: exit 1), and the link's target is unchanged. The
command-line cases (run, report) are rows of tests/test_bad_input_matrix.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainguard.checkpoint import CheckpointStore
from trainguard.errors import OutputWriteError
from trainguard.metrics.jsonl import MetricsLog
from trainguard.util.atomic import atomic_write_text


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


def test_metrics_log_never_appends_through_a_link(tmp_path: Path, victim: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(OutputWriteError, match="metrics.jsonl.*symbolic link"):
        MetricsLog(run).write({"kind": "step", "step": 1})
    log = MetricsLog(tmp_path / "run2")  # a link planted after the log was made
    (tmp_path / "run2").mkdir()
    (tmp_path / "run2" / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(OutputWriteError, match="symbolic link"):
        log.write({"kind": "step", "step": 1})
    with pytest.raises(OutputWriteError, match="symbolic link"):
        log.truncate_after(0)
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "run2" / "metrics.jsonl").is_symlink()
    (tmp_path / "run2" / "metrics.jsonl").unlink()  # its own file: appended and cut as before
    log.write({"step": 1})
    log.write({"step": 2, "loss": float("nan")})
    log.close()
    assert log.truncate_after(1) == [{"step": 2, "loss": "nan"}]
    log.write({"step": 2})
    log.close()
    rows = (tmp_path / "run2" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in rows] == [{"step": 1}, {"step": 2}]


@pytest.mark.timeout(30)  # the old code blocked forever opening the FIFO for appending
def test_guard_refuses_a_linked_or_fifo_guard_jsonl(tmp_path: Path, victim: Path) -> None:
    from trainguard.findings import Finding
    from trainguard.guard.core import Guard

    linked, fifo = tmp_path / "linked", tmp_path / "fifo"
    linked.mkdir()
    fifo.mkdir()
    (linked / "guard.jsonl").symlink_to(victim)
    os.mkfifo(fifo / "guard.jsonl")
    finding = Finding.of("C101", "a finding to record", step=1)
    for run, kind in ((linked, "symbolic link"), (fifo, "FIFO")):
        with pytest.raises(OutputWriteError, match=f"guard.jsonl: it is a {kind}"):
            Guard(run_dir=run).report([finding])
    assert victim.read_text() == "precious\n"


def test_whole_file_writes_refuse_a_link_and_leave_its_target(tmp_path: Path, victim: Path) -> None:
    (tmp_path / "report.html").symlink_to(victim)
    with pytest.raises(OutputWriteError, match="report.html: it is a symbolic link"):
        atomic_write_text(tmp_path / "report.html", "<html>")
    assert victim.read_text() == "precious\n" and (tmp_path / "report.html").is_symlink()


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_quarantine_never_moves_a_step_out_through_a_link(tmp_path: Path) -> None:
    def write(folder: Path) -> None:
        (folder / "model.bin").write_bytes(b"w" * 100)

    root = tmp_path / "ckpts"
    store = CheckpointStore(str(root))
    store.save(1, write)
    store.save(2, write)
    _flip(root / "step-2" / "model.bin")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "quarantine").symlink_to(elsewhere)
    assert store.load_latest().step == 1
    info = store.save(3, write)  # retention would quarantine step 2
    assert list(elsewhere.iterdir()) == []
    assert (root / "step-2").is_dir() and (root / "quarantine").is_symlink()
    (warning,) = [f for f in info.findings if "quarantine" in f.message]
    assert "symbolic link" in warning.message and warning.severity == "warning"
    (root / "quarantine").unlink()  # a real folder: the step is moved there, kept
    store.save(4, write)
    assert [p.name for p in (root / "quarantine").iterdir()] == ["step-2"]


def test_framework_quarantine_never_moves_a_folder_out_through_a_link(tmp_path: Path) -> None:
    from trainguard.integrations.verified import commit_folder, newest_verified, quarantine_rejected

    root = tmp_path / "out"
    for step in (1, 2):
        (root / f"checkpoint-{step}").mkdir(parents=True)
        (root / f"checkpoint-{step}" / "model.bin").write_bytes(b"w" * 10)
        commit_folder(root / f"checkpoint-{step}", step)
    _flip(root / "checkpoint-2" / "model.bin")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "quarantine").symlink_to(elsewhere)
    found = newest_verified(root, "checkpoint-")
    assert found.step == 1
    with pytest.raises(OutputWriteError, match="quarantine: it is a symbolic link"):
        quarantine_rejected(found)
    assert list(elsewhere.iterdir()) == [] and (root / "checkpoint-2").is_dir()


def test_stack_dumps_never_truncate_through_a_planted_link(tmp_path: Path, victim: Path) -> None:
    from trainguard.guard.hang_report import SigtermStackDump

    run = tmp_path / "run"
    run.mkdir()
    (run / f"stacks-rank0-{os.getpid()}.txt").symlink_to(victim)  # the name is predictable
    dump = SigtermStackDump(run, 0)
    try:
        with pytest.raises(OutputWriteError, match="symbolic link"):
            dump.arm()
    finally:
        dump.disarm()
    assert victim.read_text() == "precious\n"


def test_a_temporary_file_swapped_for_a_link_is_never_followed(
    tmp_path: Path, victim: Path
) -> None:
    """Between a block's write and the rename, the temporary name is swapped for a link (as a
    process watching the folder could): the commit must neither chmod, fsync nor install it."""
    from trainguard.util.atomic import atomic_paths

    os.chmod(victim, 0o600)
    target = tmp_path / "run" / "report.html"
    target.parent.mkdir()
    with pytest.raises(OutputWriteError, match="report.html"), atomic_paths(target) as (tmp,):
        tmp.write_text("<html>")
        tmp.unlink()
        tmp.symlink_to(victim)
    assert victim.read_text() == "precious\n"
    assert (victim.stat().st_mode & 0o777) == 0o600  # the old commit chmodded the link's target
    assert not target.exists() and not target.is_symlink()
    assert sorted(p.name for p in target.parent.iterdir()) == []  # no temporary left behind


def test_temporary_files_live_in_a_folder_only_their_writer_can_enter(tmp_path: Path) -> None:
    from trainguard.util.atomic import atomic_paths

    with atomic_paths(tmp_path / "out.png") as (tmp,):
        assert tmp.name == "out.png" and tmp.parent != tmp_path
        assert (tmp.parent.stat().st_mode & 0o777) == 0o700
        tmp.write_bytes(b"png")
    assert (tmp_path / "out.png").read_bytes() == b"png"
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]
