"""Length bounds: word count and mean word length (Gopher quality filter, Rae et al. 2021)."""

from __future__ import annotations

from trainguard.filters.base import Doc, FilterConfig, Flag


def word_count(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D210 below `min_words` words, D211 above `max_words` (span: the words past the bound)."""
    n = len(doc.words)
    if n < cfg.min_words:
        return [Flag("D210", 0, len(doc.text), f"{n} words, fewer than {cfg.min_words}")]
    if n > cfg.max_words:
        start = doc.word_spans[cfg.max_words][0]
        return [Flag("D211", start, len(doc.text), f"{n} words, more than {cfg.max_words}")]
    return []


def mean_word_length(doc: Doc, cfg: FilterConfig) -> list[Flag]:
    """D212: mean word length outside [min, max]; the longest/shortest words are highlighted."""
    if not doc.words:
        return []  # an empty text is D210's to report
    mean = sum(len(w) for w in doc.words) / len(doc.words)
    if cfg.min_mean_word_length <= mean <= cfg.max_mean_word_length:
        return []
    too_long = mean > cfg.max_mean_word_length
    # Highlight the words that pull the mean out of range, so the reader sees why.
    spans = [
        s
        for s, w in zip(doc.word_spans, doc.words, strict=True)
        if (len(w) > cfg.max_mean_word_length if too_long else len(w) < cfg.min_mean_word_length)
    ][: cfg.max_spans] or [(0, len(doc.text))]
    bound = (
        f"above {cfg.max_mean_word_length:g}" if too_long else f"below {cfg.min_mean_word_length:g}"
    )
    msg = f"mean word length {mean:.2f}, {bound}"
    return [Flag("D212", a, b, msg) for a, b in spans]
