"""Packed rows: several examples in one sequence must not attend to each other (a document
mask) nor continue each other's positions (a position reset).

A row is packed when it says so (`packed: true`, `seq_lengths` of more than one document,
`cu_seqlens`, segment ids in `attention_mask`), when a collator was seen packing known
examples, or when BOS starts a document again inside it (for tokenizers whose rendering begins
with BOS). Document starts come from the same evidence. A document mask is `seq_lengths` (a
padding-free collator turns them into position ids and sequence boundaries), `cu_seqlens`,
segment ids that change at every start, or a 2-D mask blocking each start from the token before;
a position reset is `position_ids` at 0 at every start.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

from trainguard.checks.chat_data.collect import Hits
from trainguard.checks.chat_data.rows import ChatRow


def _inside(values: list[int], length: int) -> set[int]:
    return {v for v in values if 0 < v < length}


def _mask_starts(row: ChatRow, length: int) -> set[int]:
    """The document starts the row's mask (or declared lengths) separates."""
    out: set[int] = set()
    if row.seq_lengths and len(row.seq_lengths) > 1:
        out |= _inside(list(accumulate(row.seq_lengths)), length)
    if row.cu_seqlens:
        out |= _inside(row.cu_seqlens, length)
    mask: list[Any] | None = row.attention_mask
    if mask and isinstance(mask[0], list):  # (T, T): 0 where a token may not attend
        out |= {s for s in range(1, min(length, len(mask))) if not mask[s][s - 1]}
    elif mask and max(mask) > 1:  # segment ids 1, 2, 3 ... (0 = padding)
        out |= {
            t for t in range(1, len(mask)) if mask[t] != mask[t - 1] and mask[t] and mask[t - 1]
        }
    return out


def packing_hits(example: int, row: ChatRow, bos_id: int | None, hits: Hits) -> bool:
    """D412/D413 for a packed row; True when the row is packed."""
    ids = row.input_ids or []
    n = len(ids)
    starts = _inside(row.known_starts, n) | _mask_starts(row, n)
    if bos_id is not None and ids and ids[0] == bos_id:
        starts |= {t for t in range(1, n) if ids[t] == bos_id and ids[t - 1] != bos_id}
    if not (row.packed or starts):
        return False
    masked = _mask_starts(row, n)
    pos = row.position_ids
    resets = {t for t in range(1, n) if pos[t] == 0} if pos else set()
    if row.seq_lengths and len(row.seq_lengths) > 1:
        resets |= _inside(list(accumulate(row.seq_lengths)), n)
    if starts:
        ok_mask, ok_pos = starts <= masked, starts <= resets
        first = min(starts - resets) if not ok_pos else None
    else:  # declared packed, with no document start known: anything that separates
        ok_mask, ok_pos, first = bool(masked), bool(resets), None
    where = f"documents start at tokens {sorted(starts)[:5]}" if starts else "a packed row"
    runs = (
        "no position_ids"
        if not pos
        else f"position {pos[first]} at token {first}"
        if first is not None
        else "position_ids never reset"
    )
    if not ok_mask and not ok_pos:
        hits.add(
            "D412",
            example,
            f"{where}; no document mask and positions run on ({runs})",
            starts=sorted(starts)[:20],
        )
    elif not ok_pos:
        hits.add("D413", example, f"{where}; positions run on ({runs})", starts=sorted(starts)[:20])
    return True
