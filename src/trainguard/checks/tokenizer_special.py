"""End-of-text and BOS handling: the separator token itself (T106, T109) and how packed
documents are framed in a sample of the training stream (T107, T108)."""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

from trainguard.findings import Finding


def special_token_findings(
    tok: Tokenizer, eot_token: str | None
) -> tuple[list[Finding], int | None]:
    """T106/T109 for the end-of-text token, and its id (None when absent or not asked for)."""
    if eot_token is None:
        return [], None
    eot_id = tok.token_to_id(eot_token)
    if eot_id is None:
        return [
            Finding.of("T106", f"end-of-text token {eot_token!r} is not in the vocabulary")
        ], None
    if eot_id not in tok.get_added_tokens_decoder():
        msg = f"{eot_token!r} is an ordinary vocabulary entry, not a special token"
        return [Finding.of("T106", msg, severity="warning")], eot_id
    probe = f"quoted {eot_token} marker"
    if eot_id in tok.encode(probe, add_special_tokens=False).ids:
        msg = f"encoding text containing the literal {eot_token!r} yields separator id {eot_id}"
        return [Finding.of("T109", msg, data={"eot_id": eot_id})], eot_id
    return [], eot_id


def packing_findings(
    sample: np.ndarray,
    eot_id: int | None,
    bos_id: int | None,
    expect_bos: bool,
    expect_eos: bool,
) -> list[Finding]:
    """T107/T108 on a packed sample (1-D or (rows, T)): separators doubled or absent, BOS
    missing after a separator, doubled, or present when none is expected."""
    rows = np.atleast_2d(np.asarray(sample))
    findings: list[Finding] = []
    if eot_id is not None:
        is_eot = rows == eot_id
        doubled = int(np.sum(is_eot[:, 1:] & is_eot[:, :-1]))
        if doubled:
            findings.append(
                Finding.of(
                    "T107",
                    f"{doubled} doubled end-of-text tokens in the packed sample",
                    data={"doubled": doubled},
                )
            )
        if expect_eos and not is_eot.any():
            findings.append(
                Finding.of(
                    "T107",
                    f"no end-of-text token in {rows.size} packed tokens",
                    data={"tokens": int(rows.size)},
                    # A sample from inside one long document has none either: less certain.
                    severity="warning",
                )
            )
    if bos_id is None:
        if expect_bos:
            findings.append(Finding.of("T108", "the recipe expects a BOS token but none was found"))
        return findings
    is_bos = rows == bos_id
    if not expect_bos and is_bos.any():
        n = int(is_bos.sum())
        findings.append(Finding.of("T108", f"{n} BOS tokens in the packed sample; none expected"))
    elif expect_bos and eot_id is not None:
        after_eot = (rows[:, :-1] == eot_id) & ~is_bos[:, 1:]
        doubled = int(np.sum(is_bos[:, 1:] & is_bos[:, :-1]))
        if after_eot.any() or doubled:
            msg = (
                f"{int(after_eot.sum())} documents start without BOS and {doubled} BOS are "
                "doubled in the packed sample"
            )
            findings.append(Finding.of("T108", msg))
    return findings
