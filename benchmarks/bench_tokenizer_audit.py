"""Benchmark: `check-tokenizer` on a 50k-token byte-level BPE.

Trains (or loads) a 50,000-token byte-level BPE on standard-library source, then times side by
side in one run, alternating:
  candidate  trainguard's audit (`audit_tokenizer`): the vocabulary classification (one short
             encode per token) while, in a second thread, the corpus sample is encoded with
             `encode_batch_fast` (batched, no character offsets) and decoded with `decode_batch`
             for the unseen-token counts and the text round trip;
  baseline   the plain per-token loop: for each token, `decode([id])` then `encode(text)`, and
             for each corpus document `encode` then `decode`, one call at a time.
Both must agree on the unreachable tokens, the unseen count and the round-trip failures.
Prints medians over --repeats of the wall time and of the process CPU time (all threads; on a
shared machine the steadier of the two) and their ratios, with the machine (machine.py).

    python benchmarks/bench_tokenizer_audit.py [--vocab 50000] [--train-mb 30] [--docs 200]
        [--repeats 3] [--tokenizer PATH] [--markdown docs/benchmarks/tokenizer_audit.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from machine import describe

from trainguard.checks.tokenizer_audit import audit_tokenizer, load_tokenizer_file
from trainguard.checks.tokenizer_vocab import read_vocab
from trainguard.data.corpus import iter_documents
from trainguard.data.tokenizer import save_tokenizer, train_tokenizer

READING = (
    "Reading: the corpus part is the tokenizer's own encoding and decoding of the sample, the "
    "same work in both columns; trainguard asks for no character offsets (`encode_batch_fast`), "
    "batches the calls (parallel where cores are free) and runs them in a second thread beside the "
    "vocabulary audit, whose per-token encode is as fast as the plain loop's (a batched encode of "
    "50k short strings was no faster here). The vocabulary audit itself costs about the loop."
)


def corpus_texts(max_bytes: int) -> list[str]:
    texts, total = [], 0
    for doc in iter_documents("stdlib"):
        texts.append(doc.text)
        total += len(doc.text.encode())
        if total >= max_bytes:
            break
    return texts


def naive_unreachable(tok) -> set[int]:
    """The baseline: one decode and one encode call per vocabulary entry."""
    info = read_vocab(tok)
    out = set()
    for e in info.entries:
        if e.special or e.base:
            continue
        text = tok.decode([e.id])
        if "\ufffd" in text:
            continue  # undecodable on its own
        if (
            e.id not in tok.encode(text, add_special_tokens=False).ids
            and e.id not in tok.encode("\n" + text, add_special_tokens=False).ids
        ):
            out.add(e.id)
    return out


def naive_corpus(tok, texts: list[str]) -> tuple[int, int]:
    seen = set()
    failures = 0
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        seen.update(ids)
        failures += tok.decode(ids, skip_special_tokens=False) != t
    return len(seen), failures


def timed(fn) -> tuple[float, float, object]:
    """(wall seconds, process CPU seconds over all threads, result)."""
    c0, t0 = time.process_time(), time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, time.process_time() - c0, result


def side_by_side(candidate, baseline, repeats: int) -> tuple[dict[str, float], object, object]:
    """Medians of wall and CPU seconds of each, runs interleaved so that load drift on a
    shared machine hits both alike; and the last results."""
    runs: dict[str, list[float]] = {"c_wall": [], "c_cpu": [], "b_wall": [], "b_cpu": []}
    r_c = r_b = None
    for _ in range(repeats):
        wall, cpu, r_c = timed(candidate)
        runs["c_wall"].append(wall)
        runs["c_cpu"].append(cpu)
        wall, cpu, r_b = timed(baseline)
        runs["b_wall"].append(wall)
        runs["b_cpu"].append(cpu)
    return {k: statistics.median(v) for k, v in runs.items()}, r_c, r_b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=50_000)
    ap.add_argument("--train-mb", type=float, default=30.0)
    ap.add_argument("--min-frequency", type=int, default=1)
    ap.add_argument("--docs", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokenizer", type=Path, default=None, help="reuse/save the trained BPE")
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()

    texts = corpus_texts(int(args.train_mb * 1e6))
    if args.tokenizer and args.tokenizer.is_file():
        tok = load_tokenizer_file(args.tokenizer)
        train_s = None
    else:
        t0 = time.perf_counter()
        tok = train_tokenizer(texts, vocab_size=args.vocab, min_frequency=args.min_frequency)
        train_s = time.perf_counter() - t0
        if args.tokenizer:
            save_tokenizer(tok, args.tokenizer)
    vocab = tok.get_vocab_size()
    sample = texts[: args.docs]

    vocab_t, audit, naive = side_by_side(
        lambda: audit_tokenizer(tok), lambda: naive_unreachable(tok), args.repeats
    )
    assert set(audit.unreachable_ids) == naive, "candidate and baseline disagree"
    full_t, full, (_, (seen, failures)) = side_by_side(
        lambda: audit_tokenizer(tok, sample, max_docs=args.docs),
        lambda: (naive_unreachable(tok), naive_corpus(tok, sample)),
        args.repeats,
    )
    merged = full.stats["merged_tokens"] + full.stats["base_tokens"]
    assert full.stats["round_trip_failures"] == failures, "round trips disagree"
    assert full.stats["counted_tokens"] > 0 and seen <= merged + full.stats["special_tokens"]

    rows = [
        ("vocabulary audit (T101/T102/T104)", vocab_t),
        (f"full audit with {len(sample)} corpus docs", full_t),
    ]
    lines = [
        "## check-tokenizer on a 50k vocabulary",
        "",
        f"Command: `python benchmarks/bench_tokenizer_audit.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        f"Machine: {describe()}.",
        "",
        f"Tokenizer: byte-level BPE, {vocab} tokens, trained on {args.train_mb:g} MB of "
        "standard-library source"
        + (f" in {train_s:.0f} s" if train_s else "")
        + f"; corpus sample {sum(map(len, sample)):,} characters. Medians of {args.repeats} "
        "alternating runs; CPU = process CPU time over all threads. "
        f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', 'unset')}.",
        "",
        "| measurement | trainguard wall (s) | plain loop wall (s) | wall ratio | "
        "trainguard CPU (s) | plain loop CPU (s) | CPU ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {t['c_wall']:.2f} | {t['b_wall']:.2f} | {t['c_wall'] / t['b_wall']:.2f} | "
        f"{t['c_cpu']:.2f} | {t['b_cpu']:.2f} | {t['c_cpu'] / t['b_cpu']:.2f} |"
        for name, t in rows
    ]
    stats = full.stats
    lines += [
        "",
        f"Findings: {', '.join(sorted({f.code for f in full.findings})) or 'none'}; "
        f"undecodable {stats['undecodable']}, unreachable {stats['unreachable']}, "
        f"whitespace+punctuation {stats['whitespace_punct_fused']}, unseen in the sample "
        f"{stats.get('unseen_merged', '-')}, "
        f"round-trip failures {stats.get('round_trip_failures')}.",
        "",
        READING,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
