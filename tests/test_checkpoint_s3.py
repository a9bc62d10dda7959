"""Checkpoints on S3: a real moto server on 127.0.0.1, through the real s3fs client.

Faults are injected at the fsspec call boundary (FaultyFS wraps the real S3FileSystem); the
store itself is never mocked.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

import s3fs  # noqa: E402

from runhelpers import forge_manifest  # noqa: E402
from s3_server import Traffic, make_bucket, s3_server, storage_options  # noqa: E402
from trainguard.checkpoint import CheckpointStore, RetryPolicy  # noqa: E402
from trainguard.errors import BadInputError, StorageError  # noqa: E402
from trainguard.util.hashing import bytes_checksum  # noqa: E402

# under pytest-xdist the module's tests run on one worker, so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_checkpoint_s3")

FAST = dict(base_delay_s=0.002, max_delay_s=0.01, stagger_s=0.0)


@pytest.fixture(scope="module")
def endpoint():
    with s3_server() as url:
        make_bucket(url, "ckpt")
        yield url


@pytest.fixture
def url(endpoint: str) -> str:
    return f"s3://ckpt/{uuid.uuid4().hex[:8]}"


def fresh_fs(endpoint: str) -> Any:
    return s3fs.S3FileSystem(**storage_options(endpoint))


def payload(step: int, size: int = 20_000):
    data = random.Random(step).randbytes(size)

    def write(folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(data)
        (folder / "loader.json").write_text(json.dumps({"position": step}))

    write.model = data  # type: ignore[attr-defined]
    return write


class FaultyFS:
    """A real fsspec filesystem whose calls fail or stall at random (seeded), and whose uploads
    can be silently truncated: the failures object stores and proxies really produce."""

    CALLS = {"open", "info", "find", "cat_file", "rm", "rm_file"}

    def __init__(self, fs: Any, fail: float = 0.0, stall: float = 0.0, seed: int = 0) -> None:
        self._fs, self.fail, self.stall = fs, fail, stall
        self._rng = random.Random(seed)
        self.injected = 0
        self.truncate: set[str] = set()  # path suffixes whose uploads lose their second half
        self.truncate_times = 10**9
        self.calls: list[tuple[str, str]] = []  # (method, path) of every request made

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name not in self.CALLS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            r = self._rng.random()
            if r < self.fail:
                self.injected += 1
                raise self._rng.choice(
                    [
                        ConnectionResetError("injected: connection reset by peer"),
                        TimeoutError("injected: read timeout"),
                        OSError(errno.EBUSY, "injected: 503 SlowDown"),
                    ]
                )
            if r < self.fail + self.stall:
                time.sleep(0.02)
            self.calls.append((name, str(args[0]) if args else ""))
            if name == "open":
                f = attr(*args, **kwargs)
                mode = args[1] if len(args) > 1 else kwargs.get("mode", "rb")
                hit = any(str(args[0]).endswith(s) for s in self.truncate)
                if "w" in mode and hit and self.truncate_times > 0:
                    self.truncate_times -= 1
                    return _Truncating(f)
                return f
            return attr(*args, **kwargs)

        return call


class _Truncating:
    """A write handle that silently drops every other chunk (a mangled upload body)."""

    def __init__(self, f: Any) -> None:
        self.f, self.n = f, 0

    def write(self, b: bytes) -> int:
        self.f.write(b[: len(b) // 2])
        return len(b)

    def __enter__(self) -> _Truncating:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def all_committed_valid(endpoint: str, url: str, tmp: Path) -> list[int]:
    """Every committed step of `url` verifies in full through a fault-free client."""
    clean = CheckpointStore(
        url, cache_dir=str(tmp / uuid.uuid4().hex), filesystem=fresh_fs(endpoint)
    )
    steps = clean.steps()
    for s in steps:
        assert clean.verify(s) == [], f"committed step {s} is not valid"
    return steps


def test_round_trip_and_retention(endpoint: str, url: str, tmp_path: Path) -> None:
    opts = storage_options(endpoint)
    store = CheckpointStore(url, keep=2, cache_dir=str(tmp_path / "a"), storage_options=opts)
    writes = {s: payload(s) for s in (1, 2, 3)}
    infos = [store.save(s, writes[s], meta={"s": s}) for s in (1, 2, 3)]
    assert [i.deleted for i in infos] == [[], [], [1]]
    assert infos[-1].location == f"{url}/step-3" and infos[-1].findings == []
    assert store.steps() == [2, 3] and store.verify(3) == []
    keys = sorted(k.rsplit("/", 2)[-2] for k in fresh_fs(endpoint).find(url[5:]))
    assert set(keys) == {"step-2", "step-3"}
    other = CheckpointStore(url, cache_dir=str(tmp_path / "b"), storage_options=opts)
    loaded = other.load_latest()
    assert loaded.step == 3 and not loaded.from_cache and loaded.manifest["meta"] == {"s": 3}
    assert (loaded.path / "model.safetensors").read_bytes() == writes[3].model
    assert str(loaded.path).startswith(str(tmp_path / "b"))
    # Saved again after a rollback: the old objects are replaced, never mixed with the new.
    store.save(3, payload(30, size=5000))
    assert store.steps() == [2, 3] and store.verify(3) == []
    again = other.load(3)
    assert (again.path / "model.safetensors").read_bytes() == payload(30, size=5000).model


def test_missing_bucket_is_a_clear_storage_error(endpoint: str, tmp_path: Path) -> None:
    store = CheckpointStore(
        "s3://no-such-bucket-tg/run",
        cache_dir=str(tmp_path / "c"),
        storage_options=storage_options(endpoint),
        retry=RetryPolicy(attempts=3, **FAST),
    )
    assert store.steps() == [] and store.load_latest() is None
    with pytest.raises(StorageError) as e:
        store.save(1, payload(1))
    assert "C201" in e.value.message and "no-such-bucket-tg" in e.value.message
    assert "bucket" in e.value.fix


def test_interrupted_upload_before_manifest_is_never_loaded(
    endpoint: str, url: str, tmp_path: Path
) -> None:
    class Killed(BaseException):
        """Stands in for SIGKILL: nothing after the kill point runs, no cleanup."""

    def kill_at_commit(phase: str, step: int) -> None:
        if step == 2:
            raise Killed

    opts = storage_options(endpoint)
    store = CheckpointStore(
        url, keep=3, cache_dir=str(tmp_path / "a"), storage_options=opts, on_phase=kill_at_commit
    )
    store.save(1, payload(1))
    with pytest.raises(Killed):
        store.save(2, payload(2))
    listed = fresh_fs(endpoint).find(f"{url[5:]}/step-2")
    names = {k.rsplit("/", 1)[-1] for k in listed}
    assert names == {"model.safetensors", "loader.json"}  # payload uploaded, no manifest
    reader = CheckpointStore(url, cache_dir=str(tmp_path / "b"), storage_options=opts)
    assert reader.steps() == [1]
    assert reader.load_latest().step == 1
    # The next successful save removes the partial upload and says so.
    info = CheckpointStore(url, keep=3, cache_dir=str(tmp_path / "a"), storage_options=opts).save(
        3, payload(3)
    )
    assert info.deleted == [2] and [f.code for f in info.findings] == ["C204"]


def test_unreliable_store_saves_through_retries(endpoint: str, url: str, tmp_path: Path) -> None:
    faulty = FaultyFS(fresh_fs(endpoint), fail=0.15, stall=0.1, seed=7)
    policy = RetryPolicy(attempts=10, seed=3, **FAST)
    store = CheckpointStore(
        url, keep=2, cache_dir=str(tmp_path / "c"), filesystem=faulty, retry=policy
    )
    writes = {s: payload(s) for s in (1, 2, 3)}
    retries = 0
    for s in (1, 2, 3):
        info = store.save(s, writes[s])
        retries += sum(f.data.get("retries", 0) for f in info.findings if f.code == "C203")
    assert faulty.injected > 0 and retries > 0
    assert all_committed_valid(endpoint, url, tmp_path) == [2, 3]
    reader = CheckpointStore(url, cache_dir=str(tmp_path / "r"), filesystem=faulty, retry=policy)
    loaded = reader.load_latest()
    assert loaded.step == 3 and (loaded.path / "model.safetensors").read_bytes() == writes[3].model


def test_failing_store_never_exposes_a_partial_checkpoint(
    endpoint: str, url: str, tmp_path: Path
) -> None:
    # Few attempts against many faults: some saves fail. Whatever happens, every committed
    # step must verify in full, and the newest successful save must be the one loaded.
    faulty = FaultyFS(fresh_fs(endpoint), fail=0.35, seed=11)
    policy = RetryPolicy(attempts=2, seed=5, verify_checksums=False, **FAST)
    store = CheckpointStore(
        url, keep=2, cache_dir=str(tmp_path / "c"), filesystem=faulty, retry=policy
    )
    ok, failed = [], []
    for s in range(1, 5):
        try:
            store.save(s, payload(s, size=2000))
            ok.append(s)
        except StorageError as e:
            assert "C201" in e.message and e.fix
            failed.append(s)
        all_committed_valid(endpoint, url, tmp_path)
    assert ok and failed  # the seed gives both outcomes
    clean = CheckpointStore(url, cache_dir=str(tmp_path / "r"), filesystem=fresh_fs(endpoint))
    assert clean.load_latest().step == max(ok)


def test_verify_before_prune(endpoint: str, url: str, tmp_path: Path) -> None:
    faulty = FaultyFS(fresh_fs(endpoint))
    policy = RetryPolicy(attempts=3, seed=0, **FAST)
    store = CheckpointStore(
        url, keep=1, cache_dir=str(tmp_path / "c"), filesystem=faulty, retry=policy
    )
    store.save(1, payload(1))
    # One mangled upload: detected by the size check, uploaded again, then step 1 is pruned.
    faulty.truncate, faulty.truncate_times = {"step-2/model.safetensors"}, 1
    info = store.save(2, payload(2))
    assert info.deleted == [1] and "C202" in [f.code for f in info.findings]
    # Every upload of step 3 is mangled: the save fails and step 2 is NOT pruned.
    faulty.truncate, faulty.truncate_times = {"step-3/model.safetensors"}, 10**9
    with pytest.raises(StorageError, match="C201"):
        store.save(3, payload(3))
    assert all_committed_valid(endpoint, url, tmp_path) == [2]


def test_resume_from_local_cache_and_remote_corruption(
    endpoint: str, url: str, tmp_path: Path
) -> None:
    opts = storage_options(endpoint)
    cache = str(tmp_path / "cache")
    writer = CheckpointStore(url, keep=3, cache_dir=cache, storage_options=opts)
    writer.save(1, payload(1))
    writer.save(2, payload(2))
    assert [p.name for p in Path(cache).iterdir()] == ["step-2"]  # only the latest is cached
    counting = FaultyFS(fresh_fs(endpoint))
    resumed = CheckpointStore(url, cache_dir=cache, filesystem=counting)
    loaded = resumed.load_latest()
    assert loaded.step == 2 and loaded.from_cache and loaded.findings == []
    assert counting.calls and not [p for _, p in counting.calls if "model.safetensors" in p]
    # A damaged cache is not trusted: downloaded again, with a C205 note.
    model = loaded.path / "model.safetensors"
    model.write_bytes(b"\0" * model.stat().st_size)
    again = CheckpointStore(url, cache_dir=cache, filesystem=fresh_fs(endpoint)).load_latest()
    assert again.step == 2 and not again.from_cache and [f.code for f in again.findings] == ["C205"]
    assert (
        bytes_checksum(model.read_bytes())
        == again.manifest["files"]["model.safetensors"]["checksum"]
    )
    # A corrupt remote object (same size, one byte flipped): fall back to step 1 with C101.
    fs = fresh_fs(endpoint)
    key = f"{url[5:]}/step-2/model.safetensors"
    data = bytearray(fs.cat_file(key))
    data[100] ^= 0x01
    fs.pipe_file(key, bytes(data))
    other = CheckpointStore(url, cache_dir=str(tmp_path / "other"), storage_options=opts)
    fallback = other.load_latest()
    assert fallback.step == 1
    (finding,) = fallback.findings
    assert finding.code == "C101" and "corrupt" in finding.message
    assert "model.safetensors" in finding.message
    assert finding.data["expected_checksum"] in finding.message
    assert finding.data["actual_checksum"] == bytes_checksum(bytes(data))
    assert [f.code for f in other.verify(2)] == ["C101"]


def test_async_save_overlaps_upload(endpoint: str, url: str, tmp_path: Path) -> None:
    store = CheckpointStore(
        url, keep=2, cache_dir=str(tmp_path / "c"), storage_options=storage_options(endpoint)
    )
    handles = [store.save_async(s, payload(s)) for s in (1, 2)]
    infos = [h.result(timeout=120) for h in handles]
    store.close()
    assert [i.step for i in infos] == [1, 2] and store.steps() == [1, 2]
    assert all_committed_valid(endpoint, url, tmp_path) == [1, 2]


def test_manifest_keys_cannot_escape_the_cache(endpoint: str, url: str, tmp_path: Path) -> None:
    opts = storage_options(endpoint)
    cache = tmp_path / "cache"
    CheckpointStore(url, cache_dir=str(cache), storage_options=opts).save(1, payload(1))
    # Staged in cache/.tmp-step-5-<pid>/, the old code wrote this to tmp_path/escaped/x.
    name, data = "../../escaped/x", b"written outside the cache"
    fs = fresh_fs(endpoint)
    fs.pipe_file(f"{url[5:]}/step-5/{name}", data)
    assert fs.cat_file(f"{url[5:]}/step-5/{name}") == data  # the key is stored as written
    entry = {"size": len(data), "checksum": bytes_checksum(data)}
    fs.pipe_file(f"{url[5:]}/step-5/manifest.json", forge_manifest(5, {name: entry}))
    reader = CheckpointStore(url, cache_dir=str(cache), storage_options=opts)
    loaded = reader.load_latest()
    assert not (tmp_path / "escaped").exists()
    assert loaded.step == 1 and [f.code for f in loaded.findings] == ["C108"]
    assert sorted(p.name for p in cache.iterdir()) == ["step-1"]


def test_retention_quarantines_on_the_object_store(endpoint: str, url: str, tmp_path: Path) -> None:
    opts = storage_options(endpoint)
    store = CheckpointStore(url, keep=2, cache_dir=str(tmp_path / "c"), storage_options=opts)
    for s in (1, 2, 3):
        store.save(s, payload(s))
    fs = fresh_fs(endpoint)
    key = f"{url[5:]}/step-3/model.safetensors"
    data = bytearray(fs.cat_file(key))
    data[100] ^= 0x01
    fs.pipe_file(key, bytes(data))
    reader = CheckpointStore(url, keep=2, cache_dir=str(tmp_path / "r"), storage_options=opts)
    assert reader.load_latest().step == 2  # step 3 failed verification (C101)
    info = reader.save(4, payload(4))
    assert (
        reader.steps() == [2, 4]
        and info.deleted == []
        and "C112" in [f.code for f in info.findings]
    )
    assert fs.cat_file(f"{url[5:]}/quarantine/step-3/model.safetensors") == bytes(data)
    assert fs.exists(f"{url[5:]}/quarantine/step-3/manifest.json")
    assert not fs.find(f"{url[5:]}/step-3")


def test_missing_backend_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = importlib.import_module("fsspec.registry")

    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if the [s3] extra were not installed
    monkeypatch.delitem(registry._registry, "s3", raising=False)
    with pytest.raises(BadInputError) as e:
        CheckpointStore("s3://bucket/run", cache_dir=os.devnull + "-unused")
    assert "trainguard[s3]" in e.value.fix and "s3://bucket/run" in e.value.message
    with pytest.raises(BadInputError, match="unknown|not installed|Protocol"):
        CheckpointStore("nosuchproto://bucket/run")


def test_a_store_that_does_not_answer_is_a_storage_error_before_any_work(tmp_path: Path) -> None:
    """run's first listing (probe_store): an endpoint nobody listens on is a StorageError
    naming the root (exit 2), not a botocore traceback after the data was prepared."""
    import socket

    from trainguard.errors import exit_status_for
    from trainguard.train.start import probe_store

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing answers there
    url = f"s3://bucket-{uuid.uuid4().hex[:8]}/run"
    store = CheckpointStore(
        url,
        cache_dir=str(tmp_path / "c"),
        storage_options=storage_options(f"http://127.0.0.1:{port}"),
        retry=RetryPolicy(attempts=1, base_delay_s=0.0, stagger_s=0.0),
    )
    with pytest.raises(StorageError, match=f"cannot list the checkpoint store {url}") as e:
        probe_store(store, url)
    assert exit_status_for(e.value) == 2 and "trainguard doctor" in e.value.fix


def test_every_retry_is_ours_and_counted_on_a_throttled_store(tmp_path: Path) -> None:
    """The store `trainguard run` writes through (`checkpoint.dir` = an s3:// URL, its
    `storage_options`): s3fs (5 tries) and botocore (4 retries of a 503) retry nothing
    underneath, so the server sees exactly our attempts and C203 counts every one of them.
    With the client's retries on, one failing PUT would reach the server up to 25 times."""
    traffic = Traffic(fail_every=2, fail_methods=("PUT",))  # every 2nd object PUT: 503
    policy = RetryPolicy(attempts=3, seed=1, **FAST)
    with s3_server(traffic) as endpoint:
        make_bucket(endpoint, "ckpt")
        options = storage_options(endpoint)
        store = CheckpointStore("s3://ckpt/run", cache_dir=str(tmp_path / "a"),
                                storage_options=options, retry=policy)  # fmt: skip
        traffic.reset()
        info = store.save(1, payload(1))
        counted = sum(f.data["retries"] for f in info.findings if f.code == "C203")
        assert traffic.slowdowns > 0 and counted == traffic.slowdowns

        traffic.fail_every = 1  # every PUT fails: our 3 attempts, then the error
        traffic.reset()
        with pytest.raises(StorageError, match="C201"):
            store.save(2, payload(2))
        assert traffic.slowdowns == policy.attempts  # the first file's attempts, no more
