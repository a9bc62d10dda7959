"""Data layer failure codes for the corpus, shards and data order (D101-D199).

D2xx (dedup, filters) and D3xx (shuffle quality) live in their own modules. Never reuse or
renumber a code.
"""

from trainguard.codes import Code, register

register(
    Code(
        code="D101",
        title="Corpus documents skipped: not valid UTF-8",
        severity="warning",
        catches="Files (or JSONL lines, Parquet binary values) of the corpus that do not decode as "
        "UTF-8; they are skipped and counted instead of stopping the run.",
        why="Skipped data is data the model never sees. A few odd files are harmless; many mean "
        "the corpus is in another encoding (Latin-1, UTF-16) or holds binaries, and the run "
        "trains on a fraction of what you think.",
        fix="Convert the files to UTF-8 (iconv -f latin1 -t utf-8) or remove binaries from the "
        "source folder; the count is in the manifest's `stats.skipped_non_utf8`.",
        false_positives="Folders that deliberately hold binary files next to the text.",
    ),
    Code(
        code="D102",
        title="Prepared data file corrupt: shard, index or tokenizer",
        severity="error",
        catches="A prepared shard, document index or tokenizer.json that is missing, truncated or "
        "whose xxh3 checksum differs from the manifest.",
        why="Memory-mapped shards are read without parsing: a flipped byte or a truncated file "
        "becomes wrong tokens or a shorter stream, and the run trains on garbage without any "
        "error.",
        fix="Move the prepared folder named in the message aside (mv DIR DIR.bad, kept as "
        "evidence) and run again; the data is re-prepared from the source. Check the disk if "
        "it happens twice.",
        references=("OLMo-core data loader: checksummed numpy token files",),
    ),
    Code(
        code="D103",
        title="Prepared data manifest corrupt or from another format",
        severity="error",
        catches="A manifest.json that is missing, not valid JSON (truncated), edited (its "
        "self-checksum does not match) or written by another format version.",
        why="The manifest is what every checksum is compared to; an edited manifest could bless "
        "damaged shards, a truncated one says nothing about them.",
        fix="Move the prepared folder named in the message aside (mv DIR DIR.bad) and run "
        "again; the data is re-prepared from the source. A folder `trainguard data prepare` did "
        "not write is not prepared data: give the folder it printed as `dir`.",
    ),
    Code(
        code="D104",
        title="Data changed between run start and resume",
        severity="error",
        catches="A resumed run whose prepared data (tokenizer hash, shard checksums or token "
        "counts) differs from the data the run was started with.",
        why="Sample ids index the packed stream: with a different stream (source edited, another "
        "tokenizer) the same ids are different text, so the resumed run silently replays, "
        "skips or mixes data, and its loss curve is not comparable.",
        fix="Resume with the original data (same source files, same tokenizer settings), or start "
        "a new run directory for the new data. `trainguard run` stops such a resume (exit 1); "
        "`--accept-data-change` continues on the new data on purpose.",
        false_positives="None: even an innocent edit changes which text each sample id means.",
    ),
    Code(
        code="D110",
        title="Data order diverged on resume: batch hash mismatch",
        severity="error",
        catches="A step whose batch (the hash of its global sample ids) differs from the batch "
        "recorded for the same step before the restart.",
        why="Resumption that replays, skips or reorders data (above all when the number of "
        "processes changes) biases training and makes runs irreproducible, and nothing else "
        "notices: the loss still goes down.",
        fix="Resume from the checkpoint's loader state with the same seed and data; the elastic "
        "order maps (seed, epoch, position) to samples independently of the world size. Look for "
        "code that re-seeds or re-shuffles per process.",
        references=("Feistel-network permutations (Luby & Rackoff 1988)",),
    ),
)
