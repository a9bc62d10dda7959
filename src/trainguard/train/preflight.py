"""Pre-flight: the checks that run on the recipe's own model, tokenizer and data order before
the first step. Findings go to the metric log and the report; an error stops the run when
`preflight.fail_on_error` is set (the default), before any compute is spent.
"""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, Any

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


def check_inputs(session: RunSession) -> dict[str, dict[str, Any] | None]:
    """What each check reads, for the cache (`checks/preflight_cache.py`): the recipe (less the
    keys a resume may change, which no check reads), and per check the data's fingerprint
    (prepared tokens and tokenizer, the source's own fingerprint), the eval spec files, the
    model's vocabulary and device. None: not cached (the eval specs cannot be read; the check
    itself then reports why)."""
    from trainguard.config.identity import flatten
    from trainguard.config.load import RESUMABLE_KEYS
    from trainguard.data.shards import data_identity

    flat = flatten(session.recipe_dict)
    recipe = {k: v for k, v in flat.items() if k not in RESUMABLE_KEYS}
    manifest = session.data.manifest
    data = {"identity": data_identity(manifest), "source": manifest.get("source_fingerprint")}
    base = {"recipe": recipe, "data": data}
    evals: dict[str, Any] | None = {**base, "specs": None}
    if session.evals.enabled:
        from trainguard.errors import BadInputError
        from trainguard.evals.spec import spec_fingerprint

        try:
            evals = {**base, "specs": spec_fingerprint(session.recipe.evals.specs)}
        except BadInputError:
            evals = None
    return {
        "model": {
            "recipe": recipe,
            "vocab_size": session.data.vocab_size,
            "device": session.device.type,
        },
        "tokenizer": base,
        "shuffle": base,
        "evals": evals,
        "contamination": evals,
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
    """Every pre-flight check on the session's model and data; returns findings and details
    (timings, whether each result came from the run dir's cache). A resume re-runs only the
    checks whose inputs changed; rank 0 keeps the cache."""
    from trainguard.checks.preflight_cache import PreflightCache

    cache = PreflightCache.load(session.run_dir)
    inputs = check_inputs(session)
    checks = {name: (functools.partial(fn, session), inputs[name]) for name, fn in CHECKS.items()}
    # The checks draw random inputs; the run's own random stream must not notice them.
    with torch.random.fork_rng(devices=[]):
        findings, details = cache.run(checks)
    if session.is_main:
        cache.save()
    return findings, details
