"""Data codes D101-D199: the corpus, its shards and its order; D140-D149 the batch behind a
step.
"""

from trainguard.codes import Code, register

register(
    Code(
        code="D101",
        title="Corpus documents skipped: not valid UTF-8",
        severity="warning",
        catches="Files (or JSONL lines, Parquet binary values) of the corpus that do not decode as "
        "UTF-8, or hold a lone surrogate (a JSON escape such as \\ud800); they are skipped and "
        "counted instead of stopping the run.",
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
        code="D105",
        title="Corpus files skipped: links that lead out of the source folder",
        severity="warning",
        catches="Files of a source folder that are symbolic links to files outside the folder; "
        "they are not read (links to folders, FIFOs and devices are never read either).",
        why="A source folder is the data: a link that leads elsewhere (another user's files, "
        "/etc, a mount that changes) would pull unlisted, unreviewed files into the corpus, "
        "and the prepared data would change when the link's target does.",
        fix="Copy the linked files into the source folder (cp -L), or point data.source at the "
        "folder that holds them; the count is in the manifest's `stats.skipped_links`.",
        false_positives="Folders assembled from links on purpose (a Hugging Face cache "
        "snapshot links to its blobs): copy them with `cp -rL` first.",
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
    Code(
        code="D140",
        title="A sample of the batch comes from a document the data filters reject",
        severity="warning",
        catches="A sample of the decoded global batch of a step whose text lies (partly) in a "
        "document that the quality rules of `trainguard data filter` (D210-D240, Gopher's "
        "thresholds) would reject: repeated lines, broken encoding, symbol soup, dangling "
        "references.",
        why="A loss or gradient spike often has a cause in the data: a block of repeated lines, "
        "a binary file decoded as text, a table of numbers. Seeing that the batch behind a "
        "spike holds a rejected document turns a guess into a cause, and says which document "
        "to remove.",
        fix="Read the sample's text and the flags; if the document is junk, filter the source "
        "(`trainguard data filter SOURCE --out KEPT`) and train on the kept file.",
        false_positives="Code and tables fail prose rules (alphabetic words, symbol ratio) by "
        "design; in a code corpus those flags are expected, and document-level rules judge the "
        "whole document, not the sample's slice of it.",
        references=("Rae et al. 2021, Gopher, appendix A.1.1",),
    ),
    Code(
        code="D141",
        title="The decoded batch is not the batch the run trained on",
        severity="error",
        catches="The hash of the global batch `trainguard batch` decoded (sample ids from the "
        "logged position in the elastic order) differs from the `batch_hash` the run logged "
        "for that step.",
        why="The prepared data found for the run is not the data it was trained on (another "
        "source, another tokenizer), or the log was edited: the text shown would not be what "
        "the model saw, so nothing said about the batch can be trusted.",
        fix="Point the run's recipe (data.source, data.cache_dir) at the data the run was "
        "trained on, or prepare that data again with the same settings.",
        false_positives="None known: the order is a pure function of the seed and position.",
    ),
)
