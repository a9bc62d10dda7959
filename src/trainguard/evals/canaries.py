"""Canaries: prompt -> expected-substring checks ("does it know who trained it")."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tokenizers import Tokenizer

from trainguard.config.evals import CanaryConfig
from trainguard.evals.scoring import bos_ids, greedy_generate
from trainguard.findings import Finding


def run_canaries(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    canaries: Sequence[CanaryConfig],
    *,
    bos: str | None = "<|endoftext|>",
    device: str | torch.device = "cpu",
    step: int | None = None,
) -> tuple[dict[str, float], list[Finding]]:
    """`canaries/pass_rate` and one E131 finding per canary whose completion lacks `expect`."""
    if not canaries:
        return {}, []
    prefix = bos_ids(tokenizer, bos)
    findings = []
    passed = 0
    for i, c in enumerate(canaries):
        prompt = prefix + tokenizer.encode(c.prompt).ids
        # No stop string: the expected text may span lines.
        (out,) = greedy_generate(
            model,
            tokenizer,
            [prompt],
            max_new_tokens=c.max_new_tokens,
            stop_ids=prefix,
            device=device,
        )
        if c.expect in out:
            passed += 1
        else:
            findings.append(
                Finding.of(
                    "E131",
                    f"canary {i} {c.prompt!r}: completion {out!r} lacks {c.expect!r}",
                    step=step,
                    metric=f"canaries/{i}",
                    data={"prompt": c.prompt, "expect": c.expect, "output": out},
                )
            )
    return {
        "canaries/pass_rate": passed / len(canaries),
        "canaries/n": float(len(canaries)),
    }, findings
