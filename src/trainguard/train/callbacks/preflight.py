"""Pre-flight: the checks that run on the recipe's own model, tokenizer, data order and eval
specs (their lint, and their contamination of the training split) before the first step
(`PreflightCallback`), and `trainguard doctor --quick` on every rank before anything else
(`doctor_preflight`). Findings go to the metric log and the report; an error stops the run when
`preflight.fail_on_error` is set (the default), before any compute.

The data checks are `checks/data_preflight.py`, the same as `check-tokenizer --prepared`: token
counts are summed over the train split in bounded chunks, never read into memory whole.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainguard.checkpoint.rng import capture_rng, restore_rng
from trainguard.config.schema import Recipe
from trainguard.errors import PreflightFailed
from trainguard.findings import Finding
from trainguard.train.callback import Callback, RunContext

# Enough documents for a text round trip and special-token checks, cheap on a laptop.
TOKENIZER_SAMPLE_DOCS = 200

Check = Callable[[RunContext], tuple[list[Finding], dict[str, Any]]]
DataResult = tuple[list[Finding], dict[str, Any]]


def stop_on_errors(found: list[Finding], recipe: Recipe) -> None:
    """PreflightFailed (exit 1) for error findings when `preflight.fail_on_error` is set."""
    errors = [f for f in found if f.severity == "error"]
    if errors and recipe.preflight.fail_on_error:
        listing = "; ".join(str(f) for f in errors)
        raise PreflightFailed(
            f"pre-flight found {len(errors)} error(s), training did not start: {listing}",
            "fix the findings, or set preflight.fail_on_error=false to train anyway",
        )


def doctor_preflight(recipe: Recipe, run_dir: Path, dist: Any) -> tuple[list[Finding], dict]:
    """`trainguard doctor --quick` on every rank of the run, testing the run's own checkpoint
    folder; every rank gets the same findings (so all stop together on an error)."""
    from trainguard.doctor import Team, plan_for, run_doctor
    from trainguard.train.start import checkpoint_root

    root = checkpoint_root(recipe, run_dir)
    plan = plan_for(recipe, quick=True, checkpoint_dir=root)
    report = run_doctor(Team.from_dist(dist), plan)
    first = report.rounds[0]
    return report.findings, {"seconds": first.seconds, "ranks": first.ranks}


class PreflightCallback(Callback):
    """Runs every check once in `pre_train`, before any other callback and the first step."""

    name = "preflight"
    priority = 100

    def __init__(self, data: Any, evals_enabled: bool) -> None:
        self.data = data  # data.prepare.PreparedData
        self.evals_enabled = evals_enabled
        self._data_result: DataResult | None = None

    def pre_train(self, ctx: RunContext) -> None:
        """Every check, each read back from `RUN_DIR/preflight_cache.json` when its inputs
        (`check_inputs`) and the code are those it ran with (a resume re-runs only the checks
        whose inputs changed; rank 0 keeps the cache)."""
        from trainguard.checks.preflight_cache import PreflightCache

        self._data_result = None
        fns: dict[str, Check] = {
            "model": self.model_findings,
            "tokenizer": self.tokenizer_findings,
            "shuffle": self.shuffle_findings,
            "evals": self.eval_lint_findings,
            "contamination": self.contamination_findings,
        }
        inputs = self.check_inputs(ctx)
        checks = {name: (functools.partial(fn, ctx), inputs[name]) for name, fn in fns.items()}
        cache = PreflightCache.load(ctx.run_dir)
        # The checks draw random inputs; the run's own generators (restored from a checkpoint
        # on resume) must not notice: every generator is put back afterwards.
        saved = capture_rng()
        try:
            found, details = cache.run(checks)
        finally:
            restore_rng(saved)
        if ctx.is_main:
            cache.save()
        ctx.record(found)
        ctx.log_event("preflight", checks=details)
        stop_on_errors(found, ctx.recipe)

    def check_inputs(self, ctx: RunContext) -> dict[str, dict[str, Any] | None]:
        """What each check reads, for the cache (`checks/preflight_cache.py`): the recipe (less
        the keys a resume may change, which no check reads), and per check the data's
        fingerprint (prepared tokens and tokenizer, the source's own fingerprint), the eval spec
        files, the model's vocabulary and device. None: not cached (the eval specs cannot be
        read; the check itself then reports why)."""
        from trainguard.config.identity import flatten
        from trainguard.config.load import RESUMABLE_KEYS, recipe_to_dict
        from trainguard.data.shards import data_identity

        flat = flatten(recipe_to_dict(ctx.recipe))
        recipe = {k: v for k, v in flat.items() if k not in RESUMABLE_KEYS}
        manifest = self.data.manifest
        data = {"identity": data_identity(manifest), "source": manifest.get("source_fingerprint")}
        base = {"recipe": recipe, "data": data}
        evals: dict[str, Any] | None = {**base, "specs": None}
        if self.evals_enabled:
            from trainguard.errors import BadInputError
            from trainguard.evals.spec import spec_fingerprint

            try:
                evals = {**base, "specs": spec_fingerprint(ctx.recipe.evals.specs)}
            except BadInputError:
                evals = None
        model = {"recipe": recipe, "vocab_size": self.data.vocab_size, "device": ctx.device.type}
        return {
            "model": model,
            "tokenizer": base,
            "shuffle": base,
            "evals": evals,
            "contamination": evals,
        }

    def model_findings(self, ctx: RunContext) -> tuple[list[Finding], dict]:
        from trainguard.checks.model_checks import run_recipe_checks

        report = run_recipe_checks(ctx.model, ctx.recipe, self.data.vocab_size)
        return report.findings, {"seconds": report.seconds}

    def _data_checks(self, ctx: RunContext) -> tuple[list[Finding], dict]:
        """Tokenizer audit (T101-T109, counts over the whole train split, chunked) and the
        shuffle quality of the run's data order (D301, D302), computed once for both checks."""
        if self._data_result is None:
            from trainguard.checks.data_preflight import data_preflight
            from trainguard.data.corpus import iter_documents, split_of

            d, seed = ctx.recipe.data, ctx.recipe.train.seed
            docs = iter_documents(d.source, d.text_field)
            train = (doc.text for doc in docs if split_of(doc.id, d.val_fraction) == "train")
            texts = list(itertools.islice(train, TOKENIZER_SAMPLE_DOCS))
            self._data_result = data_preflight(
                self.data, d.seq_len, seed, corpus_texts=texts, max_docs=TOKENIZER_SAMPLE_DOCS
            )
        return self._data_result

    def tokenizer_findings(self, ctx: RunContext) -> tuple[list[Finding], dict]:
        found, stats = self._data_checks(ctx)
        return [f for f in found if f.code.startswith("T")], stats["tokenizer"]

    def shuffle_findings(self, ctx: RunContext) -> tuple[list[Finding], dict]:
        found, stats = self._data_checks(ctx)
        return [f for f in found if not f.code.startswith("T")], stats["shuffle"]

    def eval_lint_findings(self, ctx: RunContext) -> tuple[list[Finding], dict]:
        cfg = ctx.recipe.evals
        if not (self.evals_enabled and cfg.lint):
            return [], {}
        from trainguard.evals.lint import lint_specs

        found = lint_specs(
            cfg.specs, self.data.tokenizer, data=ctx.recipe.data, max_examples=cfg.max_examples
        )
        # The trailing-space trap costs eval accuracy, not training compute: it is reported, but
        # never stops a run on its own (fix the spec and re-run the evals).
        return [
            replace(f, severity="warning") if f.code == "E111" and f.severity == "error" else f
            for f in found
        ], {}

    def contamination_findings(self, ctx: RunContext) -> tuple[list[Finding], dict]:
        """D250 for eval tasks whose examples are in the training split (streamed once)."""
        if not self.evals_enabled:
            return [], {}
        from trainguard.evals.contamination import check_contamination

        r = ctx.recipe
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
