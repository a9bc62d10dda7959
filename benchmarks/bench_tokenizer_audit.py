"""Benchmark: `check-tokenizer` on a 50k-token byte-level BPE.

Trains (or loads) a 50,000-token byte-level BPE on standard-library source, then times side by
side in one run:
  candidate  trainguard's audit (`audit_tokenizer`): vocabulary classification with batched
             encodes, plus a corpus sample for unseen tokens and the text round trip;
  baseline   the straightforward audit: for each token, `decode([id])` then `encode(text)`
             one call at a time (what a first implementation does), same corpus part.
Both must agree on the unreachable tokens. Prints medians over --repeats and the ratio.

    python benchmarks/bench_tokenizer_audit.py [--vocab 50000] [--train-mb 30] [--docs 200]
        [--repeats 3] [--tokenizer PATH] [--markdown docs/benchmarks/tokenizer_audit.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from trainguard.checks.tokenizer_audit import audit_tokenizer, load_tokenizer_file
from trainguard.checks.tokenizer_vocab import read_vocab
from trainguard.data.corpus import iter_documents
from trainguard.data.tokenizer import save_tokenizer, train_tokenizer


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


def side_by_side(candidate, baseline, repeats: int) -> tuple[float, float, object, object]:
    """Median seconds of each, runs interleaved so that load drift on a shared machine hits
    both alike; and the last results."""
    t_c, t_b, r_c, r_b = [], [], None, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        r_c = candidate()
        t_c.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r_b = baseline()
        t_b.append(time.perf_counter() - t0)
    return statistics.median(t_c), statistics.median(t_b), r_c, r_b


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

    cand_vocab_s, base_vocab_s, audit, naive = side_by_side(
        lambda: audit_tokenizer(tok), lambda: naive_unreachable(tok), args.repeats
    )
    assert set(audit.unreachable_ids) == naive, "candidate and baseline disagree"
    cand_full_s, base_full_s, full, _ = side_by_side(
        lambda: audit_tokenizer(tok, sample, max_docs=args.docs),
        lambda: (naive_unreachable(tok), naive_corpus(tok, sample)),
        args.repeats,
    )

    rows = [
        ("vocabulary audit (T101/T102/T104)", cand_vocab_s, base_vocab_s),
        (f"full audit with {len(sample)} corpus docs", cand_full_s, base_full_s),
    ]
    cpu = platform.processor() or platform.machine()
    lines = [
        "## check-tokenizer on a 50k vocabulary",
        "",
        f"Command: `python benchmarks/bench_tokenizer_audit.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        f"Machine: {cpu}, {os.cpu_count()} cores (shared, noisy), Python "
        f"{platform.python_version()}. Tokenizer: byte-level BPE, {vocab} tokens, trained on "
        f"{args.train_mb:g} MB of standard-library source"
        + (f" in {train_s:.0f} s" if train_s else "")
        + f". Medians of {args.repeats} runs.",
        "",
        "| measurement | trainguard (s) | naive per-token loop (s) | speed-up |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {c:.2f} | {b:.2f} | {b / c:.1f}x |" for name, c, b in rows]
    stats = full.stats
    lines += [
        "",
        f"Findings: {', '.join(sorted({f.code for f in full.findings})) or 'none'}; "
        f"undecodable {stats['undecodable']}, unreachable {stats['unreachable']}, "
        f"whitespace+punctuation {stats['whitespace_punct_fused']}, unseen in the sample "
        f"{stats.get('unseen_merged', '-')}, "
        f"round-trip failures {stats.get('round_trip_failures')}.",
    ]
    lines += [
        "",
        "Reading: the vocabulary audit is one short encode per token, so it costs about what "
        "the plain loop costs (a batched, parallel encode was slower for such short strings on "
        "this machine and was dropped); with a corpus sample the time is dominated by the "
        "tokenizer's own encoding of the sample, identical work in both columns. The figure "
        "that matters for pre-flight is the absolute one: seconds for a 50k vocabulary.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
