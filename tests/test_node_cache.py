"""The node cache: one fetch per key however many processes ask at once, verified hits,
refetch of damaged or stale copies, bounded size with LRU eviction that spares entries in use.

Concurrency uses threads: flock locks belong to open file descriptions, so two threads with
their own descriptors exclude each other exactly as two processes do."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from trainguard.errors import CorruptError
from trainguard.util.node_cache import NodeCache, table_of


def writer(payload: dict[str, bytes], calls: list[int] | None = None, delay: float = 0.0):
    def fill(folder: Path) -> None:
        if calls is not None:
            calls.append(1)
        time.sleep(delay)  # a slow download: the others must wait, not fetch too
        for name, data in payload.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)

    return fill


def test_one_fetch_for_many_concurrent_readers(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "node")
    payload = {"a.bin": os.urandom(5000), "sub/b.json": b"{}"}
    calls: list[int] = []
    got: list[tuple[Path, bool, bytes]] = []
    lock = threading.Lock()

    def reader() -> None:
        with cache.get("s3://b/run/step-4#abc", writer(payload, calls, delay=0.3)) as entry:
            data = (entry.path / "a.bin").read_bytes()
            with lock:
                got.append((entry.path, entry.hit, data))

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1  # one fetch; three waited and read the copy
    assert sorted(hit for _p, hit, _d in got) == [False, True, True, True]
    assert {p for p, _h, _d in got} == {got[0][0]} and {d for _p, _h, d in got} == {
        payload["a.bin"]
    }


def test_damaged_or_stale_copies_are_fetched_again(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "node")
    payload = {"a.bin": b"x" * 100}
    expect = table_of_payload(tmp_path, payload)
    first = cache.get("k", writer(payload), expect=expect)
    first.release()
    (first.path / "a.bin").write_bytes(b"y" * 100)  # same size, other bytes
    calls: list[int] = []
    again = cache.get("k", writer(payload, calls), expect=expect)
    again.release()
    assert calls == [1] and not again.hit and "sealed checksum" in again.notes[0]
    assert (again.path / "a.bin").read_bytes() == payload["a.bin"]
    # A newer version of the source (another expected table) is not served from the old copy.
    newer = {"a.bin": b"z" * 120}
    with cache.get("k", writer(newer), expect=table_of_payload(tmp_path, newer)) as e:
        assert not e.hit and (e.path / "a.bin").read_bytes() == newer["a.bin"]
    # A fetch that does not produce what the source's manifest says is refused, not cached.
    with pytest.raises(CorruptError, match="does not match"):
        cache.get("k2", writer({"a.bin": b"short"}), expect=expect)
    with pytest.raises(KeyError):
        cache.get("k2", None)
    assert not [p for p in (tmp_path / "node").iterdir() if p.name.startswith(".tmp")]


def test_killed_fetch_leaves_no_entry(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "node")

    def dies(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"1" * 10)
        raise ConnectionResetError("store went away")

    with pytest.raises(ConnectionResetError):
        cache.get("k", dies)
    assert cache.entries() == []
    with cache.get("k", writer({"half.bin": b"2" * 10})) as e:
        assert not e.hit and (e.path / "half.bin").read_bytes() == b"2" * 10


def test_size_limit_evicts_least_recently_used_but_not_entries_in_use(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "node", max_bytes=2500)
    blob = {"x.bin": b"0" * 1000}
    cache.get("old", writer(blob)).release()
    time.sleep(0.02)
    held = cache.get("held", writer(blob))  # in use: share-locked
    time.sleep(0.02)
    cache.get("old", writer(blob)).release()  # a hit: now "old" is the more recently used
    time.sleep(0.02)
    cache.get("new", writer(blob)).release()  # 3000 bytes > 2500: one must go
    names = {cache._name(k) for k in ("old", "held", "new")}
    left = {n for n, _b, _t in cache.entries()}
    # "held" is least recently used, but in use; "old" goes instead.
    assert left == names - {cache._name("old")}
    held.release()
    cache.get("newer", writer(blob)).release()
    assert cache._name("held") not in {n for n, _b, _t in cache.entries()}


def table_of_payload(tmp_path: Path, payload: dict[str, bytes]) -> dict:
    folder = tmp_path / f"src-{len(os.listdir(tmp_path))}"
    writer(payload)(folder.mkdir() or folder)
    return table_of(folder)
