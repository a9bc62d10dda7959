"""Pre-flight tokenizer audit: vocabulary round trip, unseen tokens, whitespace merges, text
round trip, and end-of-text / BOS framing of packed documents (codes T101-T109).

`check_tokenizer(...)` returns findings; `audit_tokenizer(...)` also returns the statistics
(counts per class, examples) that the CLI prints with `--json`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from trainguard.checks.tokenizer_special import packing_findings, special_token_findings
from trainguard.checks.tokenizer_vocab import VocabEntry, VocabInfo, read_vocab
from trainguard.errors import BadInputError
from trainguard.findings import Finding

EOT = "<|endoftext|>"
_EXAMPLES = 20
# Punctuation (or underscore) immediately followed by whitespace, inside one token.
_PUNCT_SPACE = re.compile(r"(?:[^\w\s]|_)\s")
_BATCH = 1024
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass
class TokenizerAudit:
    findings: list[Finding]
    stats: dict[str, Any] = field(default_factory=dict)
    # Token ids known to be unused: the reference set of the under-trained indicator (T110).
    unreachable_ids: list[int] = field(default_factory=list)
    unseen_ids: list[int] = field(default_factory=list)


def load_tokenizer_file(path: str | Path) -> Tokenizer:
    """A tokenizer.json (or a folder holding one), loaded the way trainguard's pipeline loads it."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise BadInputError(
            f"no tokenizer file at {p}",
            "give the path of a Hugging Face tokenizer.json (or a folder holding one)",
        )
    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises a bare Exception on parse errors
        raise BadInputError(
            f"{p} is not a Hugging Face tokenizer.json: {e}",
            "save the tokenizer with tokenizer.save(path) from the `tokenizers` library",
        ) from None
    # trainguard encodes documents with special tokens treated as text (data/tokenizer.py).
    tok.encode_special_tokens = True
    return tok


def _show(entries: list[VocabEntry]) -> list[dict[str, Any]]:
    return [
        {"id": e.id, "token": e.token, "bytes": e.raw.hex() if e.raw is not None else None}
        for e in entries[:_EXAMPLES]
    ]


def _encode_ids(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text: one batched call per `_BATCH` documents, in Rust, without the
    character offsets the audit never reads (`encode_batch_fast`), on every core the machine
    gives it (TOKENIZERS_PARALLELISM), with the GIL released."""
    out: list[list[int]] = []
    for i in range(0, len(texts), _BATCH):
        batch = tok.encode_batch_fast(texts[i : i + _BATCH], add_special_tokens=False)
        out += [e.ids for e in batch]
    return out


def _corpus_pass(tok: Tokenizer, texts: list[str]) -> tuple[list[list[int]], list[str]]:
    """Encode and decode the corpus sample (the text round trip and the token counts both
    come from it): the two batched calls release the GIL, so this runs beside the
    vocabulary audit."""
    ids = _encode_ids(tok, texts)
    return ids, tok.decode_batch(ids, skip_special_tokens=False)


def _unreachable(tok: Tokenizer, candidates: list[VocabEntry]) -> list[VocabEntry]:
    """Tokens that encoding their own text never yields, alone or after a newline (a neutral
    context that lets prefix-space tokenizers and context-only tokens show themselves)."""
    # One encode call per token: for such short strings the per-call cost of a parallel
    # encode_batch outweighs its gain (measured in benchmarks/bench_tokenizer_audit.py).
    encode = tok.encode
    missed = [
        e for e in candidates if e.id not in encode(e.text or "", add_special_tokens=False).ids
    ]
    return [
        e for e in missed if e.id not in encode("\n" + (e.text or ""), add_special_tokens=False).ids
    ]


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _round_trip(texts: list[str], decoded: list[str]) -> tuple[list[Finding], dict[str, Any]]:
    bad = [(t, d) for t, d in zip(texts, decoded, strict=True) if t != d]
    stats = {"round_trip_docs": len(texts), "round_trip_failures": len(bad)}
    if not bad:
        return [], stats
    t, d = bad[0]
    i = _first_difference(t, d)
    msg = (
        f"{len(bad)} of {len(texts)} corpus documents change in decode(encode(text)); first at "
        f"character {i}: {t[max(0, i - 20) : i + 20]!r} became {d[max(0, i - 20) : i + 20]!r}"
    )
    data = {
        "failures": len(bad),
        "docs": len(texts),
        "original": t[i : i + 40],
        "decoded": d[i : i + 40],
    }
    return [Finding.of("T105", msg, data=data)], stats


def _vocab_findings(
    tok: Tokenizer, info: VocabInfo
) -> tuple[list[Finding], dict[str, Any], set[int]]:
    merged = [e for e in info.entries if not e.special and not e.base]
    undecodable = [e for e in merged if e.raw is None or e.text is None]
    decodable = [e for e in merged if e.text is not None]
    unreachable = _unreachable(tok, decodable)
    fused = [e for e in decodable if _PUNCT_SPACE.search(e.text or "")]
    findings = []
    if undecodable:
        findings.append(
            Finding.of(
                "T101",
                f"{len(undecodable)} merged tokens are not valid UTF-8 on their own "
                f"(e.g. {[e.token for e in undecodable[:5]]})",
                data={"count": len(undecodable), "examples": _show(undecodable)},
            )
        )
    if unreachable:
        findings.append(
            Finding.of(
                "T102",
                f"{len(unreachable)} tokens are never produced by encoding their own text "
                f"(e.g. {[e.text for e in unreachable[:5]]})",
                data={"count": len(unreachable), "examples": _show(unreachable)},
            )
        )
    if fused:
        findings.append(
            Finding.of(
                "T104",
                f"{len(fused)} tokens fuse whitespace after punctuation "
                f"(e.g. {[e.text for e in fused[:5]]})",
                data={"count": len(fused), "examples": _show(fused)},
            )
        )
    stats = {
        "vocab_size": len(info.entries),
        "special_tokens": sum(e.special for e in info.entries),
        "base_tokens": sum(e.base for e in info.entries),
        "merged_tokens": len(merged),
        "undecodable": len(undecodable),
        "unreachable": len(unreachable),
        "whitespace_punct_fused": len(fused),
        "byte_level": info.byte_level,
        "model_type": info.model_type,
    }
    return findings, stats, {e.id for e in unreachable}


def _unseen(
    info: VocabInfo, counts: np.ndarray, skip: set[int], what: str
) -> tuple[list[Finding], dict[str, Any]]:
    counts = np.asarray(counts)
    unseen = [
        e
        for e in info.entries
        if not e.special
        and not e.base
        and e.id not in skip
        and (e.id >= len(counts) or counts[e.id] == 0)
    ]
    n_base_unseen = sum(1 for e in info.entries if e.base and counts[e.id] == 0)
    stats = {
        "counted_tokens": int(counts.sum()),
        "unseen_merged": len(unseen),
        "unseen_base_bytes": n_base_unseen,
    }
    stats["unseen_ids"] = [e.id for e in unseen]
    if not unseen:
        return [], stats
    merged = sum(1 for e in info.entries if not e.special and not e.base)
    msg = (
        f"{len(unseen)} of {merged} merged tokens never occur in "
        f"{what}: they will stay untrained "
        f"(e.g. {[e.text if e.text is not None else e.token for e in unseen[:5]]})"
    )
    data = {"count": len(unseen), "merged": merged, "examples": _show(unseen)}
    return [Finding.of("T103", msg, data=data)], stats


def _count(ids: list[list[int]], vocab_size: int) -> np.ndarray:
    flat = np.concatenate([np.asarray(row, dtype=np.int64) for row in ids] or [np.zeros(0, int)])
    return np.bincount(flat, minlength=vocab_size)


def audit_tokenizer(
    tokenizer_or_path: Tokenizer | str | Path,
    corpus_texts: Iterable[str] | None = None,
    eot_token: str | None = EOT,
    packed_sample: np.ndarray | None = None,
    expect_bos: bool = False,
    expect_eos: bool = True,
    bos_token: str | None = None,
    max_docs: int = 500,
    token_counts: np.ndarray | None = None,
) -> TokenizerAudit:
    """The full audit with statistics.

    `corpus_texts` (up to `max_docs` documents) feeds the text round trip (T105) and, unless
    `token_counts` is given, the count of tokens never seen (T103). `token_counts[i]` is how
    often token i occurs in the training data: pass `np.bincount` of the prepared shards for an
    exact answer over the whole corpus. `packed_sample` (1-D or (rows, T)) is checked for the
    framing of documents (T107, T108).
    """
    t0 = time.perf_counter()
    tok = (
        tokenizer_or_path
        if isinstance(tokenizer_or_path, Tokenizer)
        else load_tokenizer_file(tokenizer_or_path)
    )
    texts: list[str] = []
    corpus_pass = None
    skipped_invalid = 0
    pool = ThreadPoolExecutor(max_workers=1)
    if corpus_texts is not None:
        texts = list(islice(corpus_texts, max_docs))
        # Text that is not valid Unicode (lone surrogates from undecodable bytes) cannot be
        # tokenized; the data pipeline skips such documents (D101), so the audit does too.
        valid = [t for t in texts if not _SURROGATE.search(t)]
        skipped_invalid = len(texts) - len(valid)
        texts = valid
        # The corpus pass (most of the time with a corpus) overlaps the vocabulary audit.
        corpus_pass = pool.submit(_corpus_pass, tok, texts)
    try:
        info = read_vocab(tok)
        findings, stats, unreachable_ids = _vocab_findings(tok, info)
        special, eot_id = special_token_findings(tok, eot_token)
        done = corpus_pass.result() if corpus_pass is not None else None
    finally:
        pool.shutdown(wait=True)
    findings += special
    what = "the training data"
    if done is not None:
        ids, decoded = done
        stats["corpus_docs_skipped_invalid"] = skipped_invalid
        f_rt, s_rt = _round_trip(texts, decoded)
        findings += f_rt
        stats |= s_rt
        if token_counts is None:
            token_counts = _count(ids, tok.get_vocab_size(with_added_tokens=True))
            what = f"the corpus sample ({len(texts)} documents)"
    if token_counts is not None:
        f_unseen, s_unseen = _unseen(info, token_counts, unreachable_ids, what)
        findings += f_unseen
        stats |= s_unseen
    if packed_sample is not None:
        bos_id = tok.token_to_id(bos_token) if bos_token else None
        findings += packing_findings(packed_sample, eot_id, bos_id, expect_bos, expect_eos)
    stats["eot_id"] = eot_id
    stats["seconds"] = round(time.perf_counter() - t0, 3)
    findings.sort(key=lambda f: f.code)
    unseen_ids = stats.pop("unseen_ids", [])
    return TokenizerAudit(findings, stats, sorted(unreachable_ids), unseen_ids)


def check_tokenizer(
    tokenizer_or_path: Tokenizer | str | Path,
    corpus_texts: Iterable[str] | None = None,
    eot_token: str | None = EOT,
    packed_sample: np.ndarray | None = None,
    expect_bos: bool = False,
    expect_eos: bool = True,
    bos_token: str | None = None,
    max_docs: int = 500,
    token_counts: np.ndarray | None = None,
) -> list[Finding]:
    """Findings T101-T109 for a tokenizer (see `audit_tokenizer` for the statistics)."""
    return audit_tokenizer(
        tokenizer_or_path,
        corpus_texts,
        eot_token=eot_token,
        packed_sample=packed_sample,
        expect_bos=expect_bos,
        expect_eos=expect_eos,
        bos_token=bos_token,
        max_docs=max_docs,
        token_counts=token_counts,
    ).findings
