"""The chat-data pre-flight of `GuardedTrainer(..., check_chat=True)`: `data check-chat`'s
checks (D401-D414) on the Trainer's own dataset, tokenizer and collator, before the first step.

    trainer = GuardedTrainer(model=model, args=args, train_dataset=ds, processing_class=tok,
                             data_collator=collator, check_chat=True)   # or {"max_length": 2048}
    trainer.train()   # PreflightFailed (nothing trained) when an error finding is made

The findings go to the guard (`guard.jsonl`) and the log; `trainer.chat_findings` keeps them.
"""

from __future__ import annotations

import logging
from typing import Any

from trainguard.checks.chat_data import check_chat_dataset
from trainguard.errors import ConfigError, PreflightFailed
from trainguard.findings import Finding, has_errors

log = logging.getLogger(__name__)


def chat_preflight(trainer: Any, options: dict[str, Any]) -> list[Finding]:
    """The findings on `trainer`'s train_dataset; PreflightFailed when one is an error.
    `options`: `max_length` (default: the args' max_length or max_seq_length, as TRL's
    SFTConfig names it), `max_examples` (256), `template` (the training side's Jinja)."""
    tok = getattr(trainer, "processing_class", None) or getattr(trainer, "tokenizer", None)
    if tok is None or not hasattr(tok, "apply_chat_template"):
        raise ConfigError(
            "check_chat needs the Trainer's tokenizer to apply its chat template",
            "pass processing_class=tokenizer to the Trainer",
        )
    args = trainer.args
    max_length = options.get("max_length") or getattr(args, "max_length", None)
    max_length = max_length or getattr(args, "max_seq_length", None)
    findings = check_chat_dataset(
        trainer.train_dataset,
        tok,
        collator=trainer.data_collator,
        max_length=max_length,
        max_examples=options.get("max_examples", 256),
        template=options.get("template"),
    )
    trainer.chat_findings = findings
    trainer.guard.report(findings)
    for f in findings:
        log.warning("trainguard: %s", f)
    if has_errors(findings):
        codes = ", ".join(sorted({f.code for f in findings if f.severity == "error"}))
        raise PreflightFailed(
            f"the chat-data pre-flight found errors ({codes}) in the training data: nothing "
            "was trained",
            "fix the data or collator as each finding says (trainer.chat_findings, "
            "guard.jsonl), or pass check_chat=False",
        )
    return findings
