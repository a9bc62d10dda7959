"""The data pre-flight of a recipe in one call: tokenizer audit on the prepared data and
shuffle quality of the loader's order. `trainguard run` and `check-tokenizer --prepared` use it.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import numpy as np

from trainguard.checks.shuffle_quality import order_shuffle_quality
from trainguard.checks.tokenizer_audit import audit_tokenizer
from trainguard.findings import Finding

_CHUNK = 1 << 23  # tokens per bincount pass: bounded memory on large corpora
_PACKED = 1 << 20  # tokens of the stream checked for document framing


def token_counts(dataset: Any, vocab_size: int) -> np.ndarray:
    """How often each token id occurs in a TokenDataset (exact, over the whole stream)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, int(dataset.n_tokens), _CHUNK):
        stop = min(start + _CHUNK, int(dataset.n_tokens))
        counts += np.bincount(dataset.tokens(start, stop), minlength=vocab_size)[:vocab_size]
    return counts


def data_preflight(
    prepared: Any,
    seq_len: int,
    seed: int,
    corpus_texts: list[str] | None = None,
    max_docs: int = 200,
    expect_bos: bool = False,
    expect_eos: bool = True,
    shuffle_samples: int = 20_000,
) -> tuple[list[Finding], dict[str, Any]]:
    """Findings and statistics for a `PreparedData`: T101-T109 (never-seen tokens counted over
    the whole train split; round trip on `corpus_texts`, by default the first `max_docs`
    documents of the recipe's source; framing on the first 1M tokens of the train stream) and
    D301/D302 for `ElasticOrder(num_samples, seed)`, the order `trainguard run` trains in."""
    from trainguard.data.order import ElasticOrder

    if corpus_texts is None:
        from trainguard.data.corpus import iter_documents

        source = prepared.manifest.get("source", "stdlib")
        field = prepared.manifest.get("text_field", "text")
        corpus_texts = [d.text for d in islice(iter_documents(source, field), max_docs)]
    train = prepared.train
    vocab = int(prepared.tokenizer.get_vocab_size(with_added_tokens=True))
    audit = audit_tokenizer(
        prepared.tokenizer,
        corpus_texts,
        packed_sample=train.tokens(0, min(int(train.n_tokens), _PACKED)),
        expect_bos=expect_bos,
        expect_eos=expect_eos,
        max_docs=max_docs,
        token_counts=token_counts(train, vocab),
    )
    n = int(train.num_samples(seq_len))
    shuffle, s_stats = order_shuffle_quality(
        train, ElasticOrder(n, seed), seq_len, count=min(n, shuffle_samples)
    )
    return audit.findings + shuffle, {"tokenizer": audit.stats, "shuffle": s_stats}
