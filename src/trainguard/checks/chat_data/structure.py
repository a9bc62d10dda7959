"""The shape of a conversation: role order, empty turns, a doubled system prompt, unknown
roles (on the messages), and doubled BOS/EOS tokens (on the training token ids)."""

from __future__ import annotations

from collections.abc import Callable

from trainguard.checks.chat_data.collect import Hits

KNOWN_ROLES = ("system", "user", "assistant", "tool")
# Which role may follow which (system turns aside): a tool answers an assistant's call.
_NEXT = {"user": {"assistant"}, "assistant": {"user", "tool"}, "tool": {"tool", "assistant"}}
_MIN_SYSTEM = 16  # characters: a shorter system prompt ("Be brief.") may recur by chance


def role_order_problem(roles: list[str]) -> str | None:
    """What is wrong with the order of `roles` (known roles only), or None."""
    known = [(i, r) for i, r in enumerate(roles) if r in KNOWN_ROLES]
    systems = [i for i, r in known if r == "system"]
    if len(systems) == 1 and systems[0] != 0:
        return f"a system message at position {systems[0]}, not first"
    rest = [(i, r) for i, r in known if r != "system"]
    if not rest:
        return "no user or assistant turn"
    if rest[0][1] != "user":
        return f"the conversation starts with a {rest[0][1]} turn, not user"
    for (_, prev), (i, r) in zip(rest, rest[1:], strict=False):
        if r not in _NEXT[prev]:
            return f"a {r} turn follows a {prev} turn at message {i}"
    if rest[-1][1] != "assistant":
        return f"it ends with a {rest[-1][1]} turn: no response to learn"
    return None


def structure_hits(example: int, messages: list[dict[str, str]], hits: Hits) -> None:
    roles = [m["role"] for m in messages]
    unknown = sorted({r for r in roles if r not in KNOWN_ROLES})
    if unknown:
        hits.add("D411", example, f"role {', '.join(map(repr, unknown))}", roles=unknown)
    empty = [i for i, m in enumerate(messages) if not m["content"].strip()]
    if empty:
        i = empty[0]
        hits.add("D408", example, f"message {i} ({roles[i]}) is empty", messages=empty)
    systems = [i for i, r in enumerate(roles) if r == "system"]
    if len(systems) > 1:
        hits.add(
            "D409",
            example,
            f"{len(systems)} system messages (at {systems})",
            messages=systems,
        )
    elif systems:
        prompt = messages[systems[0]]["content"].strip()
        inside = [
            i
            for i, m in enumerate(messages)
            if i != systems[0] and len(prompt) >= _MIN_SYSTEM and prompt in m["content"]
        ]
        if inside:
            hits.add(
                "D409",
                example,
                f"the system prompt is repeated inside message {inside[0]} ({roles[inside[0]]})",
                messages=[systems[0], *inside],
            )
    # With an unknown role the order is unknowable: D411 says what to map first.
    problem = None if unknown else role_order_problem(roles)
    if problem:
        hits.add("D407", example, problem, roles=roles)


def doubled_special_hits(
    example: int,
    ids: list[int],
    bos_id: int | None,
    eos_id: int | None,
    decode: Callable[[list[int]], str],
    hits: Hits,
) -> None:
    """D410 for BOS or EOS twice in a row in the training ids, or with only whitespace
    between (a template's `<|im_end|>\\n` and an EOS a collator appends)."""
    for name, tid in (("BOS", bos_id), ("EOS", eos_id)):
        if tid is None:
            continue
        at = [t for t, x in enumerate(ids) if x == tid]
        for p, q in zip(at, at[1:], strict=False):
            if q - p <= 3 and not decode(ids[p + 1 : q]).strip():
                hits.add("D410", example, f"{name} twice at tokens {p} and {q}", token=name)
                return
