"""`trainguard batch RUN_DIR --step N`: the global batch behind a step, decoded, for any run record.

Steps count from 0 in every run record (`metrics.record_read` converts the previous release's).
The batch of step N is found by the global position its step row logs (`position`), or, for a
step the guard rolled back, by the position the rollback event lists for it (`bad_positions`),
so it is found after rollbacks too; a record without positions falls back to the sampler (its
step N) with the skips the rollback events recorded. The sample ids come from the record's
`ElasticSampler` (run.json's `sampler`; a `trainguard run` without run.json: its recipe and
prepared data). What each sample holds is shown when it can be: for `trainguard run`, from its
prepared data (the documents and token offsets, the decoded text, the data filters' flags
(D140), the loss from the newest checkpoint at or before the step: `report/batch_prepared.py`);
for any loop, from a `describe` function the user registers (`module:function`, sample id ->
text, or a dict with "text" and "loss"). What it could not show is said in `not_shown`, with why.
Nothing is written to the run dir.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.config.schema import Recipe
from trainguard.data.order import batch_hash
from trainguard.data.sampler import ElasticSampler
from trainguard.errors import BadInputError, ConfigError
from trainguard.findings import Finding
from trainguard.metrics.record_read import RunRecord, read_record

# The guard's objections a batch may explain: the report links these findings to the batch.
BATCH_CODES = ("R101", "R102", "R103", "R206")
# ... and the guard's skips (R201) and rollbacks (R202) of them: the report links all of these.
LINKED_CODES = (*BATCH_CODES, "R201", "R202")
Describe = Callable[[int], Any]


def batch_command(run_dir: str | Path, step: int) -> str:
    """The command line that decodes the batch of `step` (what the report shows)."""
    return f"trainguard batch {run_dir} --step {step}"


@dataclass
class BatchView:
    """The decoded batch of one step; `to_dict()` is `batch --json` (with ok and findings)."""

    step: int
    position: int | None
    attempts: list[dict[str, Any]]
    loss_from_step: int | None
    samples: list[dict[str, Any]]
    findings: list[Finding] = field(default_factory=list)
    not_shown: list[str] = field(default_factory=list)  # what could not be shown, and why
    loop: str = "trainguard run"

    @property
    def sample_ids(self) -> list[int]:
        return [s["sample_id"] for s in self.samples]

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "loop": self.loop,
            "position": self.position,
            "attempts": self.attempts,
            "loss_from_step": self.loss_from_step,
            "sample_ids": self.sample_ids,
            "samples": self.samples,
            "not_shown": self.not_shown,
        }


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def find_attempts(rows: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """Every batch the run read as step `step`, in log order: step rows (`outcome` the row's
    action) and the bad steps of rollback events (`outcome` "rollback")."""
    found = []
    for r in rows:
        if r.get("kind") == "step" and r.get("step") == step:
            found.append(
                {
                    "position": _int(r.get("position")),
                    "outcome": r.get("action") or "apply",
                    "batch_hash": r.get("batch_hash"),
                    "loss": r.get("loss"),
                }
            )
        elif r.get("kind") == "event" and r.get("event") == "rollback":
            pos = _int((r.get("bad_positions") or {}).get(str(step)))
            if pos is not None:
                found.append({"position": pos, "outcome": "rollback", "batch_hash": None})
    return found


def _recipe(run_dir: Path) -> Recipe | None:
    """A `trainguard run`'s recipe (validated), None for another loop's record."""
    from trainguard.config.load import RECIPE_FILE, read_run_recipe, validate_recipe

    raw = read_run_recipe(run_dir)
    return validate_recipe(raw, str(run_dir / RECIPE_FILE)) if raw else None


def _skips(record: RunRecord) -> list[list[int]]:
    return [rng for r in record.events("rollback") for rng in r.get("skipped_positions") or []]


def _sampler_of(identity: Mapping[str, Any], skips: list[list[int]]) -> ElasticSampler:
    """The record's data order as one process reads it, with the rollbacks' skips."""
    try:
        batches = identity.get("batch_schedule") or identity["global_batch_size"]
        if isinstance(batches, list):
            batches = [tuple(x) for x in batches]
        sampler = ElasticSampler(
            identity["num_samples"],
            global_batch_size=batches,
            seed=identity["seed"],
            rank=0,
            world_size=1,
        )
        sampler.load_state_dict(sampler.state_dict() | {"skipped_positions": skips})
    except (KeyError, TypeError, ValueError, ConfigError) as e:
        raise BadInputError(
            f"run.json's sampler {dict(identity)!r:.200} is not an ElasticSampler's identity ({e})",
            "restore run.json as the run wrote it",
        ) from None
    return sampler


def _describe_samples(
    ids: list[int], describe: Describe, name: str, not_shown: list[str]
) -> list[dict[str, Any]]:
    """Each sample as the user's `describe(sample_id)` shows it: text, or {"text", "loss"}."""
    samples, failed = [], []
    for i, sample_id in enumerate(ids):
        text, loss = None, None
        try:
            got = describe(sample_id)
        except Exception as e:  # noqa: BLE001 - the user's function: said, never a traceback
            failed.append(f"{sample_id} ({type(e).__name__}: {e})")
            got = None
        if isinstance(got, Mapping):
            text, loss = got.get("text"), got.get("loss")
        elif got is not None:
            text = got
        samples.append(
            {
                "index": i,
                "sample_id": sample_id,
                "documents": [],
                "text": None if text is None else str(text),
                "flags": [],
                "loss": float(loss) if isinstance(loss, int | float) else None,
            }
        )
    if failed:
        not_shown.append(f"text of {len(failed)} sample(s): {name} raised for {failed[0]}")
    if not any(s["loss"] is not None for s in samples):
        not_shown.append(
            f"per-sample loss: {name} returns no loss (return {{'text': ..., 'loss': ...}} to "
            "show one)"
        )
    return samples


def _ids_only(ids: list[int]) -> list[dict[str, Any]]:
    return [
        {"index": i, "sample_id": s, "documents": [], "text": None, "flags": [], "loss": None}
        for i, s in enumerate(ids)
    ]


def decode_batch(
    run_dir: str | Path,
    step: int,
    skipped: list[str] | None = None,
    describe: Describe | None = None,
    describe_name: str = "the describe function",
    with_losses: bool = True,
) -> BatchView:
    """The decoded global batch of step `step` (0-based); BadInputError (exit 2) for what
    cannot be. `skipped`, when given, receives the metrics.jsonl lines left out ("path:line:
    why"). `describe`: the user's sample id -> text (or {"text", "loss"}) function.
    `with_losses=False`: no checkpoint is loaded for per-sample losses (the report's pages)."""
    run_dir = Path(run_dir)
    record = read_record(run_dir, skipped)
    recipe = _recipe(run_dir)
    logged = sorted({s for r in record.steps() if (s := _int(r.get("step"))) is not None})
    attempts = find_attempts(record.rows, step)
    if not attempts:
        have = f"steps {logged[0]}..{logged[-1]}" if logged else "no steps"
        raise BadInputError(
            f"step {step} is out of range: {run_dir} logged {have}",
            f"pass --step between {logged[0]} and {logged[-1]} (steps count from 0)"
            if logged
            else "train the run first: a run record has one step row per step",
        )
    # The batch the guard objected to, if any (what a finding at this step is about); else the
    # batch the step finally trained on.
    chosen = next((a for a in attempts if a["outcome"] != "apply"), attempts[-1])
    not_shown: list[str] = []
    data = None
    if record.sampler is not None:
        sampler = _sampler_of(record.sampler, _skips(record))
    elif recipe is not None:  # a `trainguard run` without run.json: the recipe's order
        from trainguard.report.batch_prepared import prepared

        data = prepared(run_dir, recipe)
        t = recipe.train
        sampler = ElasticSampler(
            data.train.num_samples(recipe.data.seq_len),
            global_batch_size=t.batch_ramp or t.batch_size * t.grad_accum,
            seed=t.seed,
            rank=0,
            world_size=1,
        )
        sampler.load_state_dict(sampler.state_dict() | {"skipped_positions": _skips(record)})
    else:
        not_shown.append(
            "sample ids: the record names no ElasticSampler (run.json has no sampler); pass "
            "it to the guard: guard.record.attach(sampler=sampler)"
        )
        return BatchView(step, chosen["position"], attempts, None, [], [], not_shown, record.loop)
    position = chosen["position"]
    if position is None:
        position = chosen["position"] = sampler.position(step)
    # The step's size: a ramp reads fewer sequences in its early steps.
    ids = sampler.order.sample_ids(position, sampler.global_batch_size_at(step))
    findings: list[Finding] = []
    if chosen.get("batch_hash") and chosen["batch_hash"] != batch_hash(ids):
        findings.append(
            Finding.of(
                "D141",
                f"the batch decoded for step {step} (hash {batch_hash(ids)}) is not the one "
                f"the run logged (hash {chosen['batch_hash']})",
                step=step,
            )
        )
    loss_step = None
    if describe is not None:
        samples = _describe_samples(ids.tolist(), describe, describe_name, not_shown)
    elif recipe is not None:
        from trainguard.report.batch_prepared import prepared, prepared_samples

        data = data or prepared(run_dir, recipe)
        samples, loss_step, found = prepared_samples(run_dir, recipe, data, ids, step, with_losses)
        findings += found
        if not with_losses:
            not_shown.append(
                f"per-sample loss: not computed for the report; `{batch_command(run_dir, step)}` "
                "computes it from the newest checkpoint before the step"
            )
        elif loss_step is None:
            not_shown.append(
                f"per-sample loss: no checkpoint of at most {step} completed steps verifies"
            )
    else:
        samples = _ids_only(ids.tolist())
        not_shown.append(
            f"text and per-sample loss: the record ({record.loop}) holds sample ids only; pass "
            "--describe module:function (a function of a sample id returning its text, or "
            '{"text": ..., "loss": ...})'
        )
    return BatchView(step, position, attempts, loss_step, samples, findings, not_shown, record.loop)
