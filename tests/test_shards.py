"""Prepared shards: packing, samples across shards, cache reuse, atomicity, damage detection."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path

import numpy as np
import pytest

from trainguard.config.schema import DataConfig, TokenizerConfig
from trainguard.data.corpus import iter_documents, split_of, stdlib_files, stdlib_root
from trainguard.data.prepare import PreparedData, cache_key, default_cache_dir, prepare_data
from trainguard.data.shards import compare_identity, data_identity, verify_dir
from trainguard.errors import CorruptError, DataError, StorageError

# under pytest-xdist the module's tests run on one worker, so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_shards")

TOK = TokenizerConfig(vocab_size=300, min_frequency=2)


def _corpus(root: Path) -> Path:
    """40 small real stdlib modules in nested folders, plus one Latin-1 file."""
    root.mkdir(parents=True)
    small = [(i, p) for i, p in stdlib_files() if 2000 < p.stat().st_size < 6000][:40]
    for ident, path in small:
        (root / ident).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, root / ident)
    (root / "latin1.txt").write_bytes("café".encode("latin-1"))
    return root


def _cfg(tmp: Path, source: Path, **kw) -> DataConfig:
    return DataConfig(
        source=str(source), cache_dir=str(tmp / "cache"), val_fraction=0.2, seq_len=32,
        shard_tokens=4096, **kw,
    )  # fmt: skip


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DataConfig, PreparedData]:
    tmp = tmp_path_factory.mktemp("shards")
    cfg = _cfg(tmp, _corpus(tmp / "corpus"))
    return tmp, cfg, prepare_data(cfg, TOK, progress=False)


@pytest.fixture
def damaged(env, tmp_path: Path) -> Path:
    """A private copy of the prepared folder to break."""
    _, _, data = env
    copy = tmp_path / "prepared"
    shutil.copytree(data.dir, copy)
    return copy


def test_stream_is_documents_joined_by_eot(env) -> None:
    _, cfg, data = env
    assert not data.reused and data.vocab_size == 300 and data.eot_id == 0
    docs = list(iter_documents(cfg.source))
    for split, ds in (("train", data.train), ("val", data.val)):
        mine = [d for d in docs if split_of(d.id, cfg.val_fraction) == split]
        want = [t for d in mine for t in data.tokenizer.encode(d.text).ids + [data.eot_id]]
        assert ds.tokens(0, ds.n_tokens).tolist() == want
        assert ds.docs == len(mine) and ds.bytes == sum(len(d.text.encode()) for d in mine)
        assert ds.bytes_per_token == ds.bytes / len(want)
        assert ds.doc_offsets[0] == 0 and len(ds.doc_offsets) == len(mine)
    assert len(data.manifest["splits"]["train"]["shards"]) > 2  # several shards to cross
    assert data.manifest["splits"]["train"]["shards"][0]["dtype"] == "uint16"
    assert data.stats.skipped_non_utf8 == 1
    assert [f.code for f in data.findings()] == ["D101"]


def test_samples_cross_shard_boundaries_seamlessly(env) -> None:
    _, _, data = env
    ds, seq = data.train, 32
    stream = ds.tokens(0, ds.n_tokens)
    n = ds.num_samples(seq)
    assert n == (ds.n_tokens - 1) // seq
    ids = np.arange(n)
    got = ds.samples(ids, seq)
    assert got.shape == (n, seq + 1) and got.dtype == np.int64
    for i in (0, 4096 // seq - 1, 4096 // seq, n - 1):  # the sample around shard 0's end
        assert got[i].tolist() == stream[i * seq : i * seq + seq + 1].tolist()
    with pytest.raises(IndexError):
        ds.samples(np.array([n]), seq)


def test_sample_sources_name_the_starting_document(env) -> None:
    _, cfg, data = env
    ds, seq = data.train, 32
    ids = np.arange(ds.num_samples(seq))
    labels = ds.sample_sources(ids, seq)
    train_docs = [d for d in iter_documents(cfg.source) if split_of(d.id, 0.2) == "train"]
    for i in ids[::7]:
        doc = int(np.searchsorted(ds.doc_offsets, i * seq, side="right")) - 1
        assert labels[i] == train_docs[doc].source
    assert labels[0] == train_docs[0].id


def test_second_prepare_reuses_the_cache(env) -> None:
    _, cfg, data = env
    before = {p.name: p.stat().st_mtime_ns for p in data.dir.iterdir()}
    again = prepare_data(cfg, TOK, progress=False)
    assert again.reused and again.dir == data.dir
    assert {p.name: p.stat().st_mtime_ns for p in data.dir.iterdir()} == before
    assert data_identity(again.manifest) == data_identity(data.manifest)


def test_preparing_twice_gives_the_same_bytes(env, tmp_path: Path) -> None:
    _, cfg, data = env
    other = prepare_data(cfg.model_copy(update={"cache_dir": str(tmp_path)}), TOK, False)
    assert other.dir != data.dir and not other.reused
    assert data_identity(other.manifest) == data_identity(data.manifest)
    assert other.manifest["splits"] == data.manifest["splits"]


def test_clean_prepared_folder_has_no_findings(env) -> None:
    assert verify_dir(env[2].dir) == []


def _shard(folder: Path) -> Path:
    return folder / "train-00001.bin"


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_shard_is_corrupt_and_named(damaged: Path, damage: str) -> None:
    shard = _shard(damaged)
    raw = bytearray(shard.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x01
        shard.write_bytes(bytes(raw))
    elif damage == "truncate":
        shard.write_bytes(bytes(raw[:-2]))
    else:
        shard.unlink()
    findings = verify_dir(damaged)
    assert [f.code for f in findings] == ["D102"]
    with pytest.raises(CorruptError, match=r"corrupt .*train-00001\.bin") as e:
        PreparedData.from_dir(damaged)
    if damage == "flip":
        assert "expected" in str(e.value) and "actual" in str(e.value)
    assert str(damaged) in e.value.fix


@pytest.mark.parametrize("name", ["tokenizer.json", "val.doc_index.npy", "train.doc_labels.json"])
def test_damaged_side_files_are_corrupt(damaged: Path, name: str) -> None:
    path = damaged / name
    path.write_bytes(path.read_bytes().replace(b"a", b"b", 1))
    assert [f.code for f in verify_dir(damaged)] == ["D102"]
    with pytest.raises(CorruptError, match=rf"corrupt .*{name}"):
        PreparedData.from_dir(damaged)


def test_edited_manifest_is_corrupt(damaged: Path) -> None:
    path = damaged / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["splits"]["train"]["n_tokens"] -= 1  # still valid JSON, still plausible
    path.write_text(json.dumps(manifest))
    assert [f.code for f in verify_dir(damaged)] == ["D103"]
    with pytest.raises(CorruptError, match=r"corrupt .*manifest\.json: checksum mismatch"):
        PreparedData.from_dir(damaged)


def test_truncated_or_missing_manifest_is_corrupt(damaged: Path) -> None:
    path = damaged / "manifest.json"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CorruptError, match=r"corrupt .*manifest\.json: not valid JSON"):
        PreparedData.from_dir(damaged)
    path.unlink()
    assert [f.code for f in verify_dir(damaged)] == ["D103"]


def test_damaged_cache_is_never_silently_used(env) -> None:
    tmp, cfg, data = env
    shard = _shard(data.dir)
    original = shard.read_bytes()
    try:
        shard.write_bytes(original[:-2] + bytes([original[-2] ^ 0xFF]) + original[-1:])
        with pytest.raises(CorruptError, match="train-00001.bin"):
            prepare_data(cfg, TOK, progress=False)
    finally:
        shard.write_bytes(original)
    assert verify_dir(data.dir) == []


def test_failed_prepare_leaves_no_cache_and_clears_stale_temp(tmp_path: Path) -> None:
    good = {"text": "def f():\n    return 1\n" * 20}
    src = tmp_path / "d.jsonl"
    src.write_text("\n".join([json.dumps(good)] * 30 + ["{truncated"]) + "\n")
    cfg = _cfg(tmp_path, src)
    with pytest.raises(DataError, match="d.jsonl:31 is not valid JSON"):
        prepare_data(cfg, TOK, progress=False)
    # Nothing left behind: the cache folder and lock file this call created are removed again.
    assert not (tmp_path / "cache").exists()
    # a prepare killed earlier left its temp folder: the next one removes it
    src.write_text("\n".join(json.dumps({"text": f"doc {i} " * 40}) for i in range(60)) + "\n")
    key = cache_key(cfg, TOK)
    stale = tmp_path / "cache" / f".tmp-{key}-999999"
    stale.mkdir(parents=True)
    (stale / "train-00000.bin").write_bytes(b"\0" * 10)
    data = prepare_data(cfg, TOK, progress=False)
    assert not stale.exists() and data.dir.name == key and not data.reused


def _prepare_in_child(cfg: DataConfig, out) -> None:
    data = prepare_data(cfg, TOK, progress=False)
    out.put((str(data.dir), data.reused))


def test_concurrent_prepares_build_once(tmp_path: Path) -> None:
    # Every rank of a torchrun job calls prepare_data: one builds, the others wait and reuse.
    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(json.dumps({"text": f"line {i} " * 50}) for i in range(80)) + "\n")
    cfg = _cfg(tmp_path, src)
    ctx = multiprocessing.get_context("fork")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=_prepare_in_child, args=(cfg, out)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    results = sorted(out.get() for _ in procs)
    assert len({d for d, _ in results}) == 1
    assert [reused for _, reused in results] == [False, True, True]
    assert verify_dir(results[0][0]) == []


def test_split_too_small_is_bad_input(tmp_path: Path) -> None:
    src = tmp_path / "d.jsonl"
    src.write_text(json.dumps({"text": "only one document"}) + "\n")
    with pytest.raises(DataError, match="split of .* is empty"):
        prepare_data(_cfg(tmp_path, src), TOK, progress=False)
    src.write_text("\n".join(json.dumps({"text": f"doc {i}"}) for i in range(40)) + "\n")
    cfg = _cfg(tmp_path, src).model_copy(update={"seq_len": 4096})
    with pytest.raises(DataError, match="fewer than one sample"):
        prepare_data(cfg, TOK, progress=False)


def test_plain_progress_lines_on_stderr(tmp_path: Path, capsys) -> None:
    src = tmp_path / "d.jsonl"
    src.write_text("\n".join(json.dumps({"text": f"doc {i} " * 30}) for i in range(40)) + "\n")
    prepare_data(_cfg(tmp_path, src), TOK, progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    assert "tokenizing" in err and "prepared" in err and len(err.splitlines()) <= 5


def test_changed_data_on_resume_is_d104(env) -> None:
    manifest = env[2].manifest
    recorded = data_identity(manifest)
    assert compare_identity(recorded, data_identity(manifest)) == []
    changed = json.loads(json.dumps(recorded))
    changed["splits"]["train"]["shards"][0] = "0" * 32
    findings = compare_identity(recorded, changed)
    assert [f.code for f in findings] == ["D104"] and "train tokens" in findings[0].message


def test_unusable_cache_dir_is_a_storage_error(tmp_path: Path) -> None:
    src = tmp_path / "d.jsonl"
    src.write_text(json.dumps({"text": "x"}) + "\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cfg = _cfg(tmp_path, src).model_copy(update={"cache_dir": str(blocker / "cache")})
    with pytest.raises(StorageError, match="cannot create the data cache folder") as e:
        prepare_data(cfg, TOK, progress=False)
    assert "writable" in e.value.fix


def test_default_cache_dir_honours_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRAINGUARD_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("TRAINGUARD_CACHE")
    assert default_cache_dir() == Path.home() / ".cache" / "trainguard"


@pytest.mark.slow
def test_default_stdlib_prepare(tmp_path: Path) -> None:
    data = prepare_data(DataConfig(cache_dir=str(tmp_path)), TokenizerConfig(), progress=False)
    assert data.vocab_size == 4096 and data.train.n_tokens > 1_000_000
    assert data.val.num_samples(128) > 100 and 2.0 < data.train.bytes_per_token < 6.0
    first = next(i for i, _ in stdlib_files() if split_of(i, 0.05) == "train")
    sample = data.train.samples(np.array([0]), 128)[0]
    text = data.tokenizer.decode(sample.tolist(), skip_special_tokens=False)
    assert (stdlib_root() / first).read_text("utf-8").startswith(text[:200])
    assert data.train.sample_sources(np.array([0]), 128) == [first]
