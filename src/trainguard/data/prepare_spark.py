"""`data prepare --engine spark`: the local engine's prepared folder, built with PySpark.

The source is cut into parts (`corpus.source_parts`: runs of files, JSONL byte ranges, Parquet
row groups) read by the executors with the local reader, one part per partition, so the
documents, ids, order and statistics are the local engine's.
1. Tokenizer: trained on the driver exactly as the local engine trains it, on the train split's
   texts in source order, streamed from the executors partition by partition (the BPE trainer
   is one sequential pass; it is what fixes the merges, so it must see the same texts in the
   same order).
2. Tokenize and pack per partition: each executor encodes its part's documents (one EOT after
   each) and keeps the token arrays; the driver gets only counts, document starts and labels,
   and from them every part's offset in each split's packed stream.
3. Shards: each part cuts its tokens at the global shard boundaries; the pieces of one shard
   meet in one task (a shuffle keyed by shard), which writes `<split>-<k>.bin` in the folder.
4. The driver writes the document index and the manifest with the local engine's code.
The result is byte for byte the local engine's folder (tested). The executors write into the
output folder, so it must be reachable by them: local mode, or a shared filesystem.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.config.schema import DataConfig, TokenizerConfig
from trainguard.data import corpus, shards
from trainguard.data.corpus import CorpusStats, split_of
from trainguard.data.parts import part_bytes
from trainguard.data.prepared_manifest import write_prepared_manifest
from trainguard.data.progress import Progress
from trainguard.data.tokenizer import eot_id, prepare_for_encoding, save_tokenizer, train_tokenizer
from trainguard.util.spark import executor_errors, get_spark

_ENCODE_BATCH_BYTES = 4 << 20


def _train_texts(parts: Any, field: str, val_fraction: float) -> Iterator[tuple[str, Any]]:
    """Executor: ("t", text) for train-split documents, then ("s", stats) per part."""
    for part in parts:
        stats = CorpusStats()
        for doc in corpus.iter_part(part, field, stats):
            if split_of(doc.id, val_fraction) == "train":
                yield "t", doc.text
        yield "s", stats.to_dict()


class _Packed:
    """One split's share of a part: token arrays, document starts (part-local), labels, bytes."""

    def __init__(self) -> None:
        self.tokens: list[np.ndarray] = []
        self.starts: list[int] = []
        self.labels: list[str] = []
        self.n_tokens = 0
        self.bytes = 0

    def add(self, tokens: np.ndarray, label: str, n_bytes: int) -> None:
        self.starts.append(self.n_tokens)
        self.tokens.append(tokens)
        self.labels.append(label)
        self.n_tokens += len(tokens)
        self.bytes += n_bytes

    def result(self, dtype: str) -> tuple[np.ndarray, list[int], list[str], int]:
        stream = np.concatenate(self.tokens) if self.tokens else np.zeros(0, dtype)
        return stream, self.starts, self.labels, self.bytes


def _tokenize(parts: Any, tok_json: str, field: str, val_fraction: float, dtype: str):
    """Executor: per part, (index, {split: (tokens, doc starts, labels, bytes)}), encoded in
    batches as the local engine encodes (a document's tokens do not depend on its batch)."""
    from tokenizers import Tokenizer

    tok = prepare_for_encoding(Tokenizer.from_str(tok_json))
    eot = eot_id(tok)
    for part in parts:
        out = {s: _Packed() for s in shards.SPLITS}
        docs = corpus.iter_part(part, field, CorpusStats())
        while batch := _next_batch(docs):
            encs = tok.encode_batch_fast([d.text for d in batch], add_special_tokens=False)
            for doc, enc in zip(batch, encs, strict=True):
                tokens = np.append(np.asarray(enc.ids, dtype=np.int64), eot).astype(dtype)
                out[split_of(doc.id, val_fraction)].add(
                    tokens, doc.source, len(doc.text.encode("utf-8"))
                )
        yield part.index, {s: packed.result(dtype) for s, packed in out.items()}


def _next_batch(docs: Iterator[Any]) -> list[Any]:
    batch, size = [], 0
    for doc in docs:
        batch.append(doc)
        size += len(doc.text)
        if size >= _ENCODE_BATCH_BYTES:
            break
    return batch


def _pieces(row: tuple[int, dict], offsets: dict[str, list[int]], shard_tokens: int):
    """Executor: a part's tokens cut at the global shard boundaries: ((split, k), (at, tokens))."""
    index, splits = row
    for split, (tokens, *_rest) in splits.items():
        start = offsets[split][index]
        pos = 0
        while pos < len(tokens):
            g = start + pos
            k = g // shard_tokens
            end = min(len(tokens), (k + 1) * shard_tokens - start)
            yield (split, k), (g - k * shard_tokens, tokens[pos:end])
            pos = end


def _write_shard(item: tuple[tuple[str, int], Any], folder: str) -> tuple[str, int, dict]:
    """Executor: one shard from its pieces, in order."""
    (split, k), pieces = item
    ordered = sorted(pieces, key=lambda p: p[0])
    tokens = np.concatenate([t for _, t in ordered])
    return split, k, shards.write_shard(Path(folder), split, k, tokens)


def build_spark(
    folder: Path,
    data_cfg: DataConfig,
    tok_cfg: TokenizerConfig,
    progress: Progress,
    spark_master: str | None = None,
) -> None:
    """Write the prepared folder for `data_cfg` into `folder` (the local engine's bytes)."""
    spark = get_spark(spark_master)
    sc = spark.sparkContext
    field, vf, size = data_cfg.text_field, data_cfg.val_fraction, data_cfg.shard_tokens
    target = part_bytes(corpus.source_bytes(data_cfg.source), sc.defaultParallelism)
    parts = corpus.source_parts(data_cfg.source, target)
    rdd = sc.parallelize(parts, len(parts))

    progress.phase(f"training a {tok_cfg.vocab_size}-token byte-level BPE on {data_cfg.source}")
    stats, error = CorpusStats(), []

    def texts() -> Iterator[str]:
        # Errors are parked and re-raised after training, as the local engine does: raising
        # inside the Rust trainer's iterator would lose their type.
        try:
            with executor_errors():
                stream = rdd.mapPartitions(lambda it: _train_texts(it, field, vf))
                for kind, value in stream.toLocalIterator(prefetchPartitions=True):
                    if kind == "t":
                        yield value
                    else:
                        for key, n in value.items():
                            setattr(stats, key, getattr(stats, key) + n)
        except Exception as e:  # noqa: BLE001 - re-raised right after training
            error.append(e)

    tok = train_tokenizer(texts(), tok_cfg.vocab_size, tok_cfg.min_frequency)
    if error:
        raise error[0]
    if stats.docs == 0:
        raise corpus.no_documents(data_cfg.source, stats)
    save_tokenizer(tok, folder / "tokenizer.json")
    dtype = shards.dtype_for(tok.get_vocab_size())

    progress.phase(f"tokenizing {stats.docs} documents in {len(parts)} Spark partitions")
    tok_json = sc.broadcast(tok.to_str())
    tokenized = rdd.mapPartitions(lambda it: _tokenize(it, tok_json.value, field, vf, dtype))
    tokenized = tokenized.persist()
    try:
        with executor_errors():
            meta = dict(
                tokenized.map(
                    lambda r: (r[0], {s: (len(v[0]), v[1], v[2], v[3]) for s, v in r[1].items()})
                ).collect()
            )
        offsets, splits_docs = _offsets(meta, len(parts))
        off = sc.broadcast(offsets)
        out = str(folder)
        with executor_errors():
            written = (
                tokenized.flatMap(lambda r: _pieces(r, off.value, size))
                .groupByKey()
                .map(lambda item: _write_shard(item, out))
                .collect()
            )
    finally:
        tokenized.unpersist()
        tok_json.unpersist()
    splits = {}
    for split in shards.SPLITS:
        entries = [e for s, _, e in sorted(written, key=lambda w: (w[0], w[1])) if s == split]
        starts, label_ids, labels, n_bytes = splits_docs[split]
        splits[split] = shards.split_entry(
            folder, split, dtype, entries, starts, label_ids, labels, n_bytes
        )
    write_prepared_manifest(folder, data_cfg, tok_cfg, tok, stats, splits)


def _offsets(meta: dict[int, dict], n_parts: int):
    """Per split: every part's offset in the packed stream, and the global document index
    (starts, label ids in order of first appearance, label names, bytes)."""
    offsets: dict[str, list[int]] = {}
    docs: dict[str, tuple[list[int], list[int], list[str], int]] = {}
    for split in shards.SPLITS:
        at, starts, label_ids, names, n_bytes = 0, [], [], {}, 0
        offsets[split] = []
        for index in range(n_parts):
            n_tokens, local_starts, labels, part_bytes = meta[index][split]
            offsets[split].append(at)
            starts += [at + s for s in local_starts]
            label_ids += [names.setdefault(label, len(names)) for label in labels]
            at += n_tokens
            n_bytes += part_bytes
        docs[split] = (starts, label_ids, list(names), n_bytes)
    return offsets, docs
