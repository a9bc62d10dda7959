"""Data layer codes (D): the corpus, its order, its duplicates and its quality.

One file per range of numbers: D101-D199 corpus, shards and data order, D140-D149 the batch
behind a step (corpus.py); D201-D209 deduplication (dedup.py); D210-D249 quality filters
(filters.py); D250-D259 train/eval contamination (contamination.py); D301-D399 shuffle quality
(shuffle.py); D401-D429 chat (instruction-tuning) data (chat.py); D430-D439 data ablations
(ablation.py).

A code is never reused or renumbered; a renamed one gets a redirect in `codes/__init__.py`
(REDIRECTS). `docs/codes.md` is generated from these entries.
"""

# Each file registers its range's codes on import.
from . import (  # noqa: F401
    ablation,
    chat,
    contamination,
    corpus,
    dedup,
    filters,
    shuffle,
)
