"""Local checkpoint store: commit protocol, verification, fallback, retention, failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainguard.checkpoint import CheckpointStore, RetryPolicy
from trainguard.checkpoint.manifest import MANIFEST
from trainguard.checkpoint.retention import plan_retention
from trainguard.errors import BadInputError, CorruptError, StorageError, exit_status_for
from trainguard.util.hashing import file_checksum

SRC = str(Path(__file__).resolve().parents[1] / "src")


def payload(step: int, size: int = 3000):
    """A write() callback producing the files a training loop would (content depends on step)."""

    def write(folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(bytes((step * 7 + i) % 251 for i in range(size)))
        (folder / "optimizer.pt").write_bytes(os.urandom(500))
        (folder / "loader.json").write_text(json.dumps({"epoch": 0, "position": step * 16}))
        (folder / "sub").mkdir()
        (folder / "sub" / "rng.pt").write_bytes(b"rng" * step)

    return write


def codes(findings) -> list[str]:
    return [f.code for f in findings]


def flip_byte(path: Path, offset: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(str(tmp_path / "ckpts"), keep=3)


def test_round_trip_writes_manifest_and_verifies(store: CheckpointStore) -> None:
    info = store.save(10, payload(10), meta={"loss": 2.5})
    folder = Path(info.location)
    assert folder.name == "step-10" and info.written and info.findings == []
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["step"] == 10 and manifest["meta"] == {"loss": 2.5}
    assert set(manifest["files"]) == {
        "model.safetensors",
        "optimizer.pt",
        "loader.json",
        "sub/rng.pt",
    }
    for name, entry in manifest["files"].items():
        assert entry["size"] == (folder / name).stat().st_size
        assert entry["checksum"] == file_checksum(folder / name)
    assert info.bytes == sum(e["size"] for e in manifest["files"].values())
    assert store.steps() == [10] and store.verify(10) == []
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 10 and loaded.findings == []
    assert loaded.path == folder and loaded.manifest == manifest
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]


def test_corrupt_byte_falls_back_with_corrupt_finding(store: CheckpointStore) -> None:
    store.save(1, payload(1))
    store.save(2, payload(2))
    bad = Path(store.backend.location(2)) / "model.safetensors"
    expected = json.loads((bad.parent / MANIFEST).read_text())["files"]["model.safetensors"]
    flip_byte(bad)
    actual = file_checksum(bad)
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 1
    assert codes(loaded.findings) == ["C101"]
    f = loaded.findings[0]
    assert f.severity == "error" and f.step == 2
    assert "corrupt" in f.message and "model.safetensors" in f.message
    assert expected["checksum"] in f.message and actual in f.message
    assert f.data["actual_checksum"] == actual
    assert codes(store.verify(2)) == ["C101"] and store.verify(1) == []
    with pytest.raises(CorruptError, match="model.safetensors"):
        store.load(2)


def test_truncated_and_missing_files(store: CheckpointStore) -> None:
    store.save(1, payload(1))
    store.save(2, payload(2))
    store.save(3, payload(3))
    folder2, folder3 = Path(store.backend.location(2)), Path(store.backend.location(3))
    with open(folder3 / "model.safetensors", "r+b") as f:
        f.truncate(100)
    (folder2 / "optimizer.pt").unlink()
    assert codes(store.verify(3)) == ["C102"]
    assert codes(store.verify(2)) == ["C103"]
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 1
    assert sorted(codes(loaded.findings)) == ["C102", "C103"]


@pytest.mark.parametrize("damage", ["missing", "truncated", "edited", "edited_checksum"])
def test_bad_manifest_is_never_loaded(store: CheckpointStore, damage: str) -> None:
    store.save(1, payload(1))
    store.save(2, payload(2))
    mpath = Path(store.backend.location(2)) / MANIFEST
    text = mpath.read_text()
    if damage == "missing":
        mpath.unlink()
    elif damage == "truncated":
        mpath.write_text(text[: len(text) // 2])
    elif damage == "edited":
        m = json.loads(text)
        m["meta"] = {"note": "edited by hand"}
        mpath.write_text(json.dumps(m))
    else:  # a checksum edited to match a damaged file: the self-checksum catches it
        m = json.loads(text)
        m["files"]["model.safetensors"]["checksum"] = "0" * 32
        mpath.write_text(json.dumps(m))
    if damage == "missing":
        assert store.steps() == [1]
    assert codes(store.verify(2)) == ["C104"]
    loaded = store.load_latest()
    assert loaded is not None and loaded.step == 1
    with pytest.raises(CorruptError):
        store.load(2)


def test_manifest_of_another_step_is_refused(store: CheckpointStore, tmp_path: Path) -> None:
    store.save(1, payload(1))
    root = Path(store.backend.location(1)).parent
    os.rename(root / "step-1", root / "step-5")
    assert codes(store.verify(5)) == ["C105"]
    assert store.load_latest() is None
    assert codes(store.last_findings) == ["C105", "C107"]


def test_temp_folders_ignored_and_stale_ones_cleaned(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    store = CheckpointStore(str(root), keep=2)
    store.save(1, payload(1))
    # A writer SIGKILLed just before its rename leaves a complete-looking temp folder.
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {SRC!r})
        from trainguard.checkpoint import CheckpointStore
        def kill(phase, step):
            os.kill(os.getpid(), signal.SIGKILL)
        def write(p):
            (p / "model.safetensors").write_bytes(b"x" * 1000)
        CheckpointStore({str(root)!r}, on_phase=kill).save(2, write)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -9
    temps = [p for p in root.iterdir() if p.name.startswith(".tmp-step-2-")]
    assert len(temps) == 1 and (temps[0] / MANIFEST).is_file()
    assert store.steps() == [1]
    assert store.load_latest().step == 1
    CheckpointStore(str(root), keep=2)  # opening cleans up after the dead writer
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_retention_keeps_newest_valid(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "c"), keep=2)
    deleted = [store.save(s, payload(s)).deleted for s in (1, 2, 3)]
    assert deleted == [[], [], [1]] and store.steps() == [2, 3]
    # Damage step 3: the next save keeps 4 and the newest valid older one (2), and moves 3 to
    # quarantine/ (never deleted: it is the evidence).
    with open(Path(store.backend.location(3)) / "model.safetensors", "r+b") as f:
        f.truncate(10)
    info = store.save(4, payload(4))
    assert info.deleted == [] and store.steps() == [2, 4]
    assert (tmp_path / "c" / "quarantine" / "step-3" / MANIFEST).is_file()


def test_plan_retention_rules() -> None:
    def plan(*args, **kwargs) -> tuple[list[int], list[int]]:
        p = plan_retention(*args, **kwargs)
        return p.delete, p.quarantine

    assert plan({1: True, 2: True, 3: True, 4: True}, keep=2) == ([1, 2], [])
    # invalid steps, older or newer than the valid ones, are quarantined, never deleted
    assert plan({1: False, 2: True, 3: True, 4: False}, keep=1) == ([2], [1, 4])
    # nothing valid: touch nothing
    assert plan({1: False, 2: False}, keep=1) == ([], [])
    # the newest valid survives even when only protected newer ones exist
    assert plan({1: True, 2: False, 3: False}, keep=1, protect=frozenset({3})) == ([], [2])
    # a step re-saved after a rollback is protected although a newer one exists
    assert plan({1: True, 2: True, 3: True}, keep=1, protect=frozenset({2})) == ([1], [])
    # uploads killed before their manifest: deleted once a newer valid step exists
    partial = frozenset({2, 5})
    assert plan({2: False, 3: True, 4: True, 5: False}, keep=2, partial=partial) == ([2], [])
    with pytest.raises(ValueError):
        plan_retention({1: True}, keep=0)


def test_resave_same_step_replaces_it(store: CheckpointStore) -> None:
    store.save(5, payload(5, size=100))
    info = store.save(5, payload(6, size=200))
    assert store.steps() == [5] and store.verify(5) == []
    assert info.manifest["files"]["model.safetensors"]["size"] == 200


# How each serialiser reports the failed write: a Python OSError, safetensors' Rust error
# ("os error 27"), torch.save's zip writer ("unexpected pos", no errno).
WRITERS = {
    "python": '(p / "model.safetensors").write_bytes(b"w" * (4 << 20))',
    "safetensors": "import numpy as np; from safetensors.numpy import save_file; "
    'save_file({"w": np.zeros(1 << 20, dtype=np.float32)}, str(p / "model.safetensors"))',
    "torch": 'import torch; torch.save({"w": torch.zeros(1 << 20)}, p / "optimizer.pt")',
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_disk_full_raises_storage_error_and_keeps_previous(tmp_path: Path, writer: str) -> None:
    root = tmp_path / "ckpts"
    CheckpointStore(str(root)).save(1, payload(1))
    # A real write that hits a file size limit: EFBIG from the kernel, as a full disk gives ENOSPC.
    script = textwrap.dedent(
        f"""
        import json, resource, signal, sys
        sys.path.insert(0, {SRC!r})
        from trainguard.checkpoint import CheckpointStore
        from trainguard.errors import StorageError, exit_status_for
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        store = CheckpointStore({str(root)!r})
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        def write(p):
            {WRITERS[writer]}
        try:
            store.save(2, write)
            print(json.dumps({{"saved": True}}))
        except StorageError as e:
            print(json.dumps({{"message": e.message, "fix": e.fix, "exit": exit_status_for(e)}}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert "saved" not in out
    assert "file size limit" in out["message"] and "step 1" in out["message"]
    assert "C106" in out["message"]
    assert "untouched" in out["message"] and "free disk space" in out["fix"]
    assert out["exit"] == 2
    store = CheckpointStore(str(root))
    assert store.steps() == [1] and store.load_latest().step == 1
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_unwritable_root_is_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    with pytest.raises(StorageError, match="cannot create checkpoint folder") as e:
        CheckpointStore(str(blocker / "ckpts"))
    assert exit_status_for(e.value) == 2 and e.value.fix
    with pytest.raises(StorageError, match="not a folder"):
        CheckpointStore(str(blocker))


def test_failing_commit_removes_partial_and_keeps_previous(tmp_path: Path) -> None:
    root = tmp_path / "c"
    CheckpointStore(str(root)).save(1, payload(1))

    def enospc(phase: str, step: int) -> None:
        raise OSError(28, "No space left on device")

    store = CheckpointStore(str(root), on_phase=enospc)
    with pytest.raises(StorageError, match="disk is full"):
        store.save(2, payload(2))
    assert store.steps() == [1] and store.verify(1) == []
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_write_errors_and_bad_arguments(store: CheckpointStore) -> None:
    def sneaky(folder: Path) -> None:
        (folder / MANIFEST).write_text("{}")

    with pytest.raises(BadInputError, match="reserves"):
        store.save(1, sneaky)

    def buggy(folder: Path) -> None:
        raise RuntimeError("bug in the caller")

    with pytest.raises(RuntimeError):
        store.save(2, buggy)
    assert store.steps() == []
    assert not list(Path(store.backend.root).iterdir())
    with pytest.raises(BadInputError):
        CheckpointStore(str(store.backend.root), keep=0)
    with pytest.raises(BadInputError):
        CheckpointStore(str(store.backend.root), rank=2, world_size=2)


def test_file_url_and_async_save(tmp_path: Path) -> None:
    store = CheckpointStore(f"file://{tmp_path}/c", keep=2, retry=RetryPolicy(attempts=2))
    handles = [store.save_async(s, payload(s), meta={"s": s}) for s in (1, 2, 3)]
    infos = [h.result(timeout=60) for h in handles]
    store.close()
    assert [i.step for i in infos] == [1, 2, 3] and all(h.stall_s >= 0 for h in handles)
    assert store.steps() == [2, 3]
    loaded = store.load_latest()
    assert loaded.step == 3 and loaded.manifest["meta"] == {"s": 3}


def test_async_failure_surfaces_on_handle(tmp_path: Path) -> None:
    def enospc(phase: str, step: int) -> None:
        if step == 2:
            raise OSError(28, "No space left on device")

    with CheckpointStore(str(tmp_path / "c"), on_phase=enospc) as store:
        store.save_async(1, payload(1)).result(timeout=60)
        handle = store.save_async(2, payload(2))
        assert isinstance(handle.exception(timeout=60), StorageError)
        with pytest.raises(StorageError):
            handle.result()
    assert store.steps() == [1]


def test_non_zero_rank_does_not_write_but_loads(tmp_path: Path) -> None:
    root = str(tmp_path / "c")
    worker = CheckpointStore(root, rank=1, world_size=2)
    info = worker.save(1, payload(1))
    assert not info.written and worker.steps() == []
    CheckpointStore(root, rank=0, world_size=2).save(1, payload(1))
    assert worker.load_latest().step == 1
