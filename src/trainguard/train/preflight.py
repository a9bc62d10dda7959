"""Pre-flight: the checks that run on the recipe's own model, tokenizer and data order before
the first step. Findings go to the metric log and the report; an error stops the run when
`preflight.fail_on_error` is set (the default), before any compute is spent.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from trainguard.data.corpus import iter_documents, split_of
from trainguard.findings import Finding

if TYPE_CHECKING:
    from trainguard.train.run import RunSession

# Enough documents for a text round trip and special-token checks, cheap on a laptop.
TOKENIZER_SAMPLE_DOCS = 200


def _train_texts(session: RunSession, limit: int) -> list[str]:
    d = session.recipe.data
    docs = iter_documents(d.source, d.text_field)
    train = (doc.text for doc in docs if split_of(doc.id, d.val_fraction) == "train")
    return list(itertools.islice(train, limit))


def model_findings(session: RunSession) -> tuple[list[Finding], dict]:
    from trainguard.checks.model_checks import run_recipe_checks

    report = run_recipe_checks(session.model, session.recipe, session.data.vocab_size)
    return report.findings, {"seconds": report.seconds}


def tokenizer_findings(session: RunSession) -> tuple[list[Finding], dict]:
    from trainguard.checks.tokenizer_audit import check_tokenizer

    train = session.data.train
    tokens = np.asarray(train.tokens(0, train.n_tokens))
    counts = np.bincount(tokens, minlength=session.data.vocab_size)
    findings = check_tokenizer(
        session.data.tokenizer,
        corpus_texts=_train_texts(session, TOKENIZER_SAMPLE_DOCS),
        packed_sample=tokens[: 1 << 16],
        token_counts=counts,
    )
    return findings, {}


def shuffle_findings(session: RunSession) -> tuple[list[Finding], dict]:
    from trainguard.checks.shuffle_quality import order_shuffle_quality
    from trainguard.data.order import ElasticOrder

    seq_len = session.recipe.data.seq_len
    order = ElasticOrder(session.data.train.num_samples(seq_len), session.recipe.train.seed)
    findings, stats = order_shuffle_quality(session.data.train, order, seq_len)
    return findings, stats


def eval_lint_findings(session: RunSession) -> tuple[list[Finding], dict]:
    return session.evals.lint(), {}


def contamination_findings(session: RunSession) -> tuple[list[Finding], dict]:
    """D250 for eval tasks whose examples are in the training split (streamed once)."""
    if not session.evals.enabled:
        return [], {}
    from trainguard.evals.contamination import check_contamination

    r = session.recipe
    report = check_contamination(
        r.evals.specs,
        r.data.source,
        r.data.text_field,
        r.data.val_fraction,
        r.evals.max_examples,
    )
    stats = {
        "documents": report.documents,
        "tasks": {f"{t.spec}/{t.task}": round(t.fraction, 4) for t in report.tasks},
    }
    return report.findings(max_fraction=r.preflight.contamination_max), stats


CHECKS = {
    "model": model_findings,
    "tokenizer": tokenizer_findings,
    "shuffle": shuffle_findings,
    "evals": eval_lint_findings,
    "contamination": contamination_findings,
}


def doctor_findings(session: RunSession) -> tuple[list[Finding], dict]:
    """`trainguard doctor --quick` on every rank of the run, testing the run's own checkpoint
    folder; every rank gets the same findings (so all stop together on an error)."""
    from trainguard.doctor import Team, plan_for, run_doctor
    from trainguard.train.shared_store import checkpoint_root

    root = checkpoint_root(session.recipe, session.run_dir)
    plan = plan_for(session.recipe, quick=True, checkpoint_dir=root)
    report = run_doctor(Team.from_dist(session.dist), plan)
    first = report.rounds[0]
    return report.findings, {"seconds": first.seconds, "ranks": first.ranks}


def run_preflight(session: RunSession) -> tuple[list[Finding], dict[str, dict]]:
    """Every pre-flight check on the session's model and data; returns findings and timings."""
    findings: list[Finding] = []
    details: dict[str, dict] = {}
    # The checks draw random inputs; the run's own random stream must not notice them.
    with torch.random.fork_rng(devices=[]):
        for name, check in CHECKS.items():
            t0 = time.perf_counter()
            found, info = check(session)
            details[name] = {"seconds": time.perf_counter() - t0, "findings": len(found), **info}
            findings += found
    return findings, details
