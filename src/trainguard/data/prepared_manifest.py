"""A prepared data folder's manifest, written last by every engine (`prepare.py` for the local
one, `prepare_spark.py` for Spark), so that their folders are alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from trainguard.config.schema import DataConfig, TokenizerConfig
from trainguard.data import corpus, shards
from trainguard.data.corpus import CorpusStats
from trainguard.data.shards import FORMAT_VERSION
from trainguard.data.tokenizer import eot_id
from trainguard.errors import DataError
from trainguard.util.hashing import file_checksum

TOKENIZER_FILE = "tokenizer.json"


def write_prepared_manifest(
    folder: Path,
    data_cfg: DataConfig,
    tok_cfg: TokenizerConfig,
    tok: Tokenizer,
    stats: CorpusStats,
    splits: dict[str, dict[str, Any]],
) -> None:
    """Refuse an empty split, then write the manifest (last: a folder without it is never
    used). Every engine ends here, so their manifests are alike."""
    for s, meta in splits.items():
        if meta["docs"] == 0:
            raise DataError(
                f"the {s} split of {data_cfg.source!r} is empty ({stats.docs} documents, "
                f"val_fraction={data_cfg.val_fraction})",
                "add documents or change data.val_fraction",
            )
    tok_path = folder / TOKENIZER_FILE
    stats.skipped_links = len(corpus.links_out(data_cfg.source))  # the listing both engines read
    tok_checksum = file_checksum(tok_path)  # read once: the file is the same for both fields
    manifest = {
        "format_version": FORMAT_VERSION,
        "source": data_cfg.source,
        "source_fingerprint": corpus.source_fingerprint(data_cfg.source, data_cfg.text_field),
        "text_field": data_cfg.text_field,
        "val_fraction": data_cfg.val_fraction,
        "shard_tokens": data_cfg.shard_tokens,
        "tokenizer": {
            "file": TOKENIZER_FILE,
            "size": tok_path.stat().st_size,
            "checksum": tok_checksum,
            "type": "byte-level BPE",
            "vocab_size": tok_cfg.vocab_size,
            "min_frequency": tok_cfg.min_frequency,
            "actual_vocab_size": tok.get_vocab_size(),
            "eot": "<|endoftext|>",
            "eot_id": eot_id(tok),
        },
        "tokenizer_hash": tok_checksum,
        "stats": stats.to_dict(),
        "splits": splits,
    }
    shards.write_manifest(folder, manifest)
