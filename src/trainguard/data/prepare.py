"""Prepare a corpus once: train the tokenizer, pack token shards, cache them, verify on open.

The cache folder is `cache_dir/<key>/`, key = hash(source fingerprint, tokenizer settings,
shard settings, format version). It is built in a temporary folder and renamed into place, so a
killed prepare never leaves a half cache; concurrent prepares (one per rank) take a file lock
and all but the first reuse its result.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from trainguard.config.schema import DataConfig, TokenizerConfig
from trainguard.data import corpus, shards
from trainguard.data.corpus import CorpusStats, Document, iter_documents, split_of
from trainguard.data.prepared_manifest import TOKENIZER_FILE, write_prepared_manifest
from trainguard.data.progress import Progress
from trainguard.data.shards import FORMAT_VERSION, ShardWriter, TokenDataset
from trainguard.data.tokenizer import eot_id, load_tokenizer, save_tokenizer, train_tokenizer
from trainguard.errors import DataError, OutputWriteError
from trainguard.findings import Finding
from trainguard.util.atomic import check_writable, fsync_dir
from trainguard.util.hashing import stable_json_hash
from trainguard.util.paths import is_url, refuse_overwrite

_ENCODE_BATCH_BYTES = 4 << 20  # documents per encode_batch call, by size: parallel, bounded


def default_cache_dir() -> Path:
    return Path(os.environ.get("TRAINGUARD_CACHE") or Path.home() / ".cache" / "trainguard")


def cache_key(data_cfg: DataConfig, tok_cfg: TokenizerConfig) -> str:
    """Everything that changes the prepared bytes, hashed; seq_len is not in it (read-time)."""
    return stable_json_hash(
        {
            "format": FORMAT_VERSION,
            "source": corpus.source_fingerprint(data_cfg.source, data_cfg.text_field),
            "tokenizer": {"vocab": tok_cfg.vocab_size, "min_frequency": tok_cfg.min_frequency},
            "shards": {"tokens": data_cfg.shard_tokens, "val_fraction": data_cfg.val_fraction},
        }
    )


@dataclass
class PreparedData:
    """A verified prepared folder: tokenizer, train and val streams, manifest, corpus stats."""

    dir: Path
    tokenizer: Tokenizer
    tokenizer_path: Path
    eot_id: int
    vocab_size: int
    train: TokenDataset
    val: TokenDataset
    manifest: dict[str, Any]
    stats: CorpusStats
    reused: bool = field(default=True)
    """False when this call built the folder, True when it opened an existing one."""
    remote: Any = field(default=None, repr=False)
    """The `data.remote.RemotePrepared` its shards come through (None: a local folder)."""

    def close(self) -> None:
        """Release the node-cache entries of remote data (nothing for a local folder)."""
        if self.remote is not None:
            self.remote.close()

    @classmethod
    def from_dir(cls, path: str | Path, reused: bool = True) -> PreparedData:
        """Open and verify a prepared folder; raises CorruptError naming any damaged file."""
        path = Path(path)
        what = "prepared data folder"
        fix = "give the folder `trainguard data prepare SOURCE --out DIR` printed as `dir`"
        if not path.exists():
            raise DataError(f"{what} {path} does not exist", fix)
        if not path.is_dir():
            raise DataError(f"{what} {path} is a file, not a folder", fix)
        if not (path / shards.MANIFEST).exists():
            # Not damaged data: a folder trainguard never prepared (nothing to move or rebuild).
            raise DataError(
                f"{path} is not a prepared data folder: it has no {shards.MANIFEST}", fix
            )
        problems = shards.verify_dir(path)
        shards.raise_if_corrupt(problems, path)
        manifest, _ = shards.read_manifest(path)
        assert manifest is not None  # verify_dir found no problem
        tok_path = path / manifest["tokenizer"]["file"]
        tok = load_tokenizer(tok_path)
        return cls(
            dir=path,
            tokenizer=tok,
            tokenizer_path=tok_path,
            eot_id=eot_id(tok),
            vocab_size=tok.get_vocab_size(),
            train=TokenDataset(path, manifest["splits"]["train"]),
            val=TokenDataset(path, manifest["splits"]["val"]),
            manifest=manifest,
            stats=CorpusStats.from_dict(manifest["stats"]),
            reused=reused,
        )

    def findings(self, seq_len: int | None = None) -> list[Finding]:
        """Warnings about what preparing saw (skipped files)."""
        out = []
        if self.stats.skipped_non_utf8:
            out.append(
                Finding.of(
                    "D101",
                    f"{self.stats.skipped_non_utf8} documents of {self.manifest['source']!r} "
                    "are not valid UTF-8 and were skipped",
                    data=self.stats.to_dict(),
                )
            )
        if self.stats.skipped_links:
            out.append(
                Finding.of(
                    "D105",
                    f"{self.stats.skipped_links} file(s) of {self.manifest['source']!r} are "
                    "symbolic links to files outside the folder and were not read",
                    data=self.stats.to_dict(),
                )
            )
        return out


@contextlib.contextmanager
def _undo_on_failure(created: list[Path]) -> Iterator[None]:
    """Remove the lock file and cache folder this call created when preparing fails (bad
    input, a full disk): a failed command leaves nothing behind. A folder is removed only
    while empty."""
    try:
        yield
    except BaseException:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                if path.is_dir():
                    path.rmdir()
                else:
                    path.unlink()
        raise


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock (POSIX flock); a no-op where flock does not exist."""
    try:
        import fcntl
    except ImportError:  # Windows: single-process prepares only
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _train_texts(data_cfg: DataConfig, stats: CorpusStats, error: list) -> Iterator[str]:
    # The tokenizer sees only the train split: val must stay unseen for an honest val loss.
    # Errors are parked and re-raised after training: raising inside the Rust trainer's
    # iterator would lose the DataError type.
    try:
        for doc in iter_documents(data_cfg.source, data_cfg.text_field, stats):
            if split_of(doc.id, data_cfg.val_fraction) == "train":
                yield doc.text
    except Exception as e:  # noqa: BLE001 - re-raised right after training
        error.append(e)


def _encode_all(
    tok: Tokenizer, data_cfg: DataConfig, writers: dict[str, ShardWriter], progress: Progress
) -> None:
    eot = eot_id(tok)
    batch: list[Document] = []
    size = 0

    def flush() -> None:
        encs = tok.encode_batch_fast([d.text for d in batch], add_special_tokens=False)
        for doc, enc in zip(batch, encs, strict=True):
            tokens = np.append(np.asarray(enc.ids, dtype=np.int64), eot)  # one EOT per doc
            n_bytes = len(doc.text.encode("utf-8"))
            writers[split_of(doc.id, data_cfg.val_fraction)].add(tokens, doc.source, n_bytes)
            progress.advance(n_bytes)
        batch.clear()

    for doc in iter_documents(data_cfg.source, data_cfg.text_field):
        batch.append(doc)
        size += len(doc.text)
        if size >= _ENCODE_BATCH_BYTES:
            flush()
            size = 0
    if batch:
        flush()


def _build(folder: Path, data_cfg: DataConfig, tok_cfg: TokenizerConfig, progress: Progress):
    stats, error = CorpusStats(), []
    progress.phase(f"training a {tok_cfg.vocab_size}-token byte-level BPE on {data_cfg.source}")
    tok = train_tokenizer(
        _train_texts(data_cfg, stats, error), tok_cfg.vocab_size, tok_cfg.min_frequency
    )
    if error:
        raise error[0]
    tok_path = folder / TOKENIZER_FILE
    save_tokenizer(tok, tok_path)
    dtype = shards.dtype_for(tok.get_vocab_size())
    writers = {s: ShardWriter(folder, s, dtype, data_cfg.shard_tokens) for s in shards.SPLITS}
    progress.phase(f"tokenizing {stats.docs} documents", total=stats.bytes)
    _encode_all(tok, data_cfg, writers, progress)
    splits = {s: w.close() for s, w in writers.items()}
    write_prepared_manifest(folder, data_cfg, tok_cfg, tok, stats, splits)


def prepare_data(
    data_cfg: DataConfig,
    tok_cfg: TokenizerConfig,
    progress: bool = True,
    engine: str = "local",
    spark_master: str | None = None,
) -> PreparedData:
    """The prepared, verified data of a recipe, built on first use and cached after.

    `engine="spark"` builds it with PySpark (`prepare_spark.py`; a running session is reused,
    else one for `spark_master`); both engines write the same bytes, so the cache serves either.
    With `data.prepared`, that folder is opened instead (remote: through the node cache).
    """
    if data_cfg.prepared:
        data = open_prepared(data_cfg)
        _check_fits(data, data_cfg.seq_len)
        return data
    cache = Path(data_cfg.cache_dir).expanduser() if data_cfg.cache_dir else default_cache_dir()
    refuse_overwrite({"data.cache_dir": cache}, {"data.source": data_cfg.source})
    key = cache_key(data_cfg, tok_cfg)
    final = cache / key
    reused = True
    if not final.exists():
        created = [] if cache.exists() else [cache]
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputWriteError(
                f"cannot create the data cache folder {cache}: {e.strerror or e}",
                "set data.cache_dir (or $TRAINGUARD_CACHE) to a writable folder",
            ) from e
        check_writable(final)  # a read-only cache fails here, before the lock and the work
        lock = cache / f".{key}.lock"
        created += [] if lock.exists() else [lock]
        with _undo_on_failure(created), _lock(lock):
            if not final.exists():  # another process may have built it while we waited
                reused = False
                for stale in cache.glob(f".tmp-{key}-*"):  # left by a killed prepare
                    shutil.rmtree(stale, ignore_errors=True)
                tmp = cache / f".tmp-{key}-{os.getpid()}"
                tmp.mkdir()
                bar = Progress(progress)
                outcome = "failed"
                try:
                    if engine == "spark":
                        from trainguard.data.prepare_spark import build_spark

                        build_spark(tmp, data_cfg, tok_cfg, bar, spark_master)
                    else:
                        _build(tmp, data_cfg, tok_cfg, bar)
                    _fsync_files(tmp)
                    os.rename(tmp, final)
                    fsync_dir(cache)
                    outcome = f"prepared {final}"
                except OSError as e:  # reads are DataError (corpus.py): this is a write
                    raise OutputWriteError(
                        f"cannot write prepared data under {cache}: {e.strerror or e}",
                        "free disk space or set data.cache_dir to a writable folder; "
                        "nothing was left half-written",
                    ) from e
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                    bar.close(outcome)
    data = PreparedData.from_dir(final, reused=reused)
    _check_fits(data, data_cfg.seq_len)
    return data


def open_prepared(data_cfg: DataConfig) -> PreparedData:
    """`data.prepared`: a local folder, verified; a URL, through the node cache (remote.py)."""
    url = data_cfg.prepared
    assert url is not None
    if not is_url(url) or url.startswith("file://"):
        return PreparedData.from_dir(Path(url.removeprefix("file://")).expanduser())
    from trainguard.data.remote import RemotePrepared

    remote = RemotePrepared(
        url,
        data_cfg.storage_options,
        data_cfg.node_cache_dir,
        max_bytes=max(1, int(data_cfg.node_cache_max_gb * 1e9)),
    )
    folder = remote.open_meta()
    manifest = remote.manifest
    tok_path = folder / manifest["tokenizer"]["file"]
    tok = load_tokenizer(tok_path)
    return PreparedData(
        dir=folder,
        tokenizer=tok,
        tokenizer_path=tok_path,
        eot_id=eot_id(tok),
        vocab_size=tok.get_vocab_size(),
        train=TokenDataset(folder, manifest["splits"]["train"], remote.shard_path),
        val=TokenDataset(folder, manifest["splits"]["val"], remote.shard_path),
        manifest=manifest,
        stats=CorpusStats.from_dict(manifest["stats"]),
        remote=remote,
    )


def _fsync_files(folder: Path) -> None:
    # Data on disk before the rename publishes the folder: a power cut cannot leave a
    # published cache whose shards are still in the page cache (verification would catch it,
    # but as a CorruptError instead of a clean rebuild).
    for path in folder.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def _check_fits(data: PreparedData, seq_len: int) -> None:
    for name, ds in (("train", data.train), ("val", data.val)):
        if ds.num_samples(seq_len) < 1:
            raise DataError(
                f"the {name} split has {ds.n_tokens} tokens, fewer than one sample of "
                f"data.seq_len+1={seq_len + 1}",
                "add data, lower data.seq_len, or raise data.val_fraction for a larger val split",
            )
