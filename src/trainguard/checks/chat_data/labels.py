"""The loss mask (labels on the assistant's tokens only, its end-of-turn token included) and
truncation at the training length (responses cut, or left with nothing to learn)."""

from __future__ import annotations

from collections.abc import Callable

from trainguard.checks.chat_data.collect import Hits
from trainguard.checks.chat_data.render import ROLE_PROMPT, Span

IGNORE = -100  # the label PyTorch's cross-entropy (and every HF trainer) leaves out


def labeled(labels: list[int]) -> list[int]:
    return [t for t, y in enumerate(labels) if y != IGNORE]


def loss_mask_hits(
    example: int,
    labels: list[int],
    spans: list[Span],
    show: Callable[[int], str],
    hits: Hits,
    truncated: bool,
) -> None:
    """D403 (labels on a prompt turn; or on every token when no turn can be located), D404
    (an assistant turn that is learned but whose end-of-turn token is not), D406 (no label)."""
    on = set(labeled(labels))
    if not on:
        hits.add("D406", example, "no token carries a label")
        return
    if not spans:
        if len(on) == len(labels) > 1:
            hits.add("D403", example, "every token carries a label: the prompt is learned too")
        return
    for s in spans:  # the first prompt turn with labels (one D403 per example)
        bad = sorted(on & set(range(s.start, s.end))) if s.role in ROLE_PROMPT else []
        if bad:
            hits.add(
                "D403",
                example,
                f"{len(bad)} tokens of message {s.index} ({s.role}) carry labels, the first "
                f"at token {bad[0]}: {show(bad[0])}",
                message=s.index,
                tokens=len(bad),
            )
            break
    for s in spans:
        learned = on & set(range(s.start, s.end))
        if s.role == "assistant" and learned and s.eot is not None and s.eot not in on:
            hits.add(
                "D404",
                example,
                f"the end-of-turn token {show(s.eot)} at token {s.eot} after message "
                f"{s.index} has no label",
                position=s.eot,
            )
            return
    _unended(example, spans, hits, truncated)


def _unended(example: int, spans: list[Span], hits: Hits, truncated: bool) -> None:
    last = next((s for s in reversed(spans) if s.role == "assistant"), None)
    if last is not None and last.eot is None and not truncated:
        hits.add(
            "D404",
            example,
            f"no end-of-turn token follows the response (message {last.index}, which ends at "
            f"token {last.end})",
            position=last.end,
        )


def response_end_hits(example: int, spans: list[Span], hits: Hits, truncated: bool) -> None:
    """D404 for a rendering (no labels known) whose last response has no end-of-turn token."""
    _unended(example, spans, hits, truncated)


def response_positions(labels: list[int] | None, spans: list[Span]) -> list[int]:
    """The tokens the example teaches: its labels, else the assistant turns and their
    end-of-turn tokens."""
    if labels is not None:
        return labeled(labels)
    out: list[int] = []
    for s in spans:
        if s.role == "assistant":
            out += range(s.start, s.end)
            out += [s.eot] if s.eot is not None else []
    return out


def truncation_hits(
    example: int, response: list[int], length: int, cutoff: int, why: str, hits: Hits
) -> bool:
    """D405 (the response runs past `cutoff`) or D406 (nothing of it before `cutoff`), for an
    example `length` tokens long; True when the example is cut."""
    if not response or length <= cutoff or max(response) < cutoff:
        return False
    kept = sum(t < cutoff for t in response)
    if kept == 0:
        hits.add(
            "D406",
            example,
            f"{why} {cutoff}: the response starts at token {min(response)} of {length}",
            length=length,
            cutoff=cutoff,
        )
    else:
        hits.add(
            "D405",
            example,
            f"{why} {cutoff}: {len(response) - kept} of {len(response)} response tokens "
            f"lost ({length} tokens in all)",
            length=length,
            cutoff=cutoff,
        )
    return True
