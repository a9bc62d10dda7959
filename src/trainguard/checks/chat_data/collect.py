"""Faults found per example, gathered into one finding per code with the example ids."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from trainguard.findings import Finding

MAX_IDS = 50  # example ids listed in a finding's data (the count says how many in all)
MAX_SHOWN = 5  # examples described in its data, the first in its message

WHAT = {
    "D401": "render differently in training than with the tokenizer's chat template",
    "D403": "carry labels on prompt tokens (system, user or tool turns)",
    "D404": "never teach the model to stop: the end-of-turn token has no label, or no "
    "end-of-turn token follows the response",
    "D405": "have their response cut at --max-length",
    "D406": "have no response token left to learn",
    "D407": "have their roles out of order",
    "D408": "have an empty turn",
    "D409": "carry the system prompt twice",
    "D410": "hold a doubled BOS or EOS token",
    "D411": "use a role the chat template does not know",
    "D412": "pack several examples into one sequence that nothing separates",
    "D413": "pack examples with a document mask but positions that run on across documents",
    "D414": "are refused by a chat template",
}


class Hits:
    """Per code, the examples that show the fault and what each shows."""

    def __init__(self) -> None:
        self.by_code: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def add(self, code: str, example: int, say: str, **detail: Any) -> None:
        self.by_code[code].append({"example": example, "say": say, **detail})

    def count(self, code: str) -> int:
        return len({h["example"] for h in self.by_code.get(code, [])})

    def findings(self, total: int, **extra: dict[str, Any]) -> list[Finding]:
        """One finding per code, in code order: how many of `total` examples, the first one in
        words, and `data.example_ids` (0-based line numbers, the first MAX_IDS)."""
        out = []
        for code in sorted(self.by_code):
            hits = self.by_code[code]
            ids = sorted({h["example"] for h in hits})
            first = hits[0]
            share = len(ids) / total if total else 0.0
            msg = (
                f"{len(ids)} of {total} examples ({share:.1%}) {WHAT[code]}; "
                f"example {first['example']}: {first['say']}"
            )
            data = {
                "example_ids": ids[:MAX_IDS],
                "count": len(ids),
                "share": round(share, 6),
                "examples": hits[:MAX_SHOWN],
                **extra.get(code, {}),
            }
            if len(ids) > MAX_IDS:
                data["example_ids_truncated"] = True
            out.append(Finding.of(code, msg, where=f"example {first['example']}", data=data))
        return out
