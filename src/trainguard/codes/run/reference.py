"""Run codes R501-R509: reference curves (`trainguard reference`, `reference.path`)."""

from trainguard.codes import Code, register

_REF_RERECORD = (
    "If the change is intended, record a new reference from a finished run: `trainguard "
    "reference record RUN_DIR --out REF.json`."
)
_REF_REFS = (
    "Page 1954, Continuous Inspection Schemes (the CUSUM)",
    "OLMo, Pythia: published loss curves as the check for a reproduced run",
)


register(
    Code(
        code="R501",
        title="Run left its reference curve",
        severity="error",
        catches="A training loss that departs from the reference run's loss at the same steps "
        "by more than the reference's own noise, for long enough: a two-sided CUSUM of the "
        "difference in units of that noise (its robust scale around its smoothed curve) passed "
        "`reference.threshold`. The finding names the first step of departure and lists the "
        "environment differences (H101) next to it.",
        why="After a torch, driver, kernel or data-pipeline change, or a small code change (an "
        "attention scale, an initialisation), a run still trains and its curve still looks "
        "plausible, but it is not the recipe's known run: the budget is spent on something "
        "nobody tested.",
        fix="Look at what changed since the reference (the H101 finding beside it, `git log`, "
        "the data identity) and at the step it names. " + _REF_RERECORD,
        false_positives="The comparison assumes paired runs (same recipe, same batches, "
        "verified per step). Long GPU runs with non-deterministic kernels drift apart "
        "slowly; raise `reference.threshold` or `reference.allowance` if that drift alone "
        "fires. A reference recorded with other software (`single_environment: false`) is "
        "compared with the band only.",
        references=_REF_REFS,
    ),
    Code(
        code="R502",
        title="Bitwise departure from the reference on the same environment",
        severity="warning",
        catches="A CPU run with the same software, CPU, thread count and process count as its "
        "reference whose loss at some step is not exactly the reference's. Names the first "
        "such step.",
        why="On CPU trainguard's runs are deterministic: the same recipe on the same software "
        "gives bitwise the same curve. Any departure means what is computed changed (the "
        "code, a kernel, the data), however small the effect on the loss.",
        fix="Find the change (the H101 finding lists a changed trainguard revision; `git diff` "
        "it). " + _REF_RERECORD,
        false_positives="A deliberate change that is meant to alter numerics (a new kernel, a "
        "fused operation) fires it once: record the new reference.",
        references=_REF_REFS,
    ),
    Code(
        code="R503",
        title="Data differs from the reference's",
        severity="warning",
        catches="A run whose prepared data (tokenizer, train or validation tokens) is not the "
        "data its reference was trained on. The curves are then not compared.",
        why="A changed tokenizer merge, corpus or cleaning step changes what every step "
        "trains on; a loss comparison across different data measures the data, not the run.",
        fix="Point the run at the reference's data (its `data_identity` names the tokenizer and "
        "shard checksums), or record a reference on this data.",
        false_positives="A shipped recipe's reference was recorded on the Python standard "
        "library of one Python version: another version's library is other data.",
        references=_REF_REFS,
    ),
    Code(
        code="R504",
        title="Batches differ from the reference's",
        severity="warning",
        catches="A step whose batch hash is not the reference's at that step: a changed data "
        "order, or batches skipped after a rollback. The comparison stops there.",
        why="The comparison is paired: both runs must read the same batches for their "
        "difference to cancel the batch-to-batch scatter.",
        fix="If the guards rolled back and skipped batches, the departure is expected. Otherwise "
        "the data order changed: check `train.seed`, `data/order.py` and the data identity.",
        references=_REF_REFS,
    ),
    Code(
        code="R505",
        title="Reference of another recipe used on purpose",
        severity="warning",
        catches="A run compared with a reference recorded for a recipe that differs in "
        "non-operational keys, allowed by `reference.force` (`trainguard run --force`). Lists "
        "the differing keys.",
        why="Such a comparison is a loose guide at best: the band assumes the same recipe.",
        fix="Record a reference for this recipe; without `--force` a mismatched reference is "
        "refused (exit 2).",
        references=_REF_REFS,
    ),
    Code(
        code="R506",
        title="Reference comparison summary",
        severity="info",
        catches="The result of comparing the run with its reference at the reference's last "
        "step: bitwise equal, within the band, or outside it; the largest difference and the "
        "noise.",
        why="A quiet comparison should say that it happened and how close the run came.",
        fix="Nothing to do.",
        references=_REF_REFS,
    ),
    Code(
        code="R507",
        title="Reference recorded from a run that was not clean",
        severity="warning",
        catches="`trainguard reference record` on a finished run whose guards skipped updates "
        "or rolled back, or that resumed under other software (H101).",
        why="A reference should be a known-good run: a rerun of the recipe does not repeat "
        "skipped batches or a mid-run software change.",
        fix="Record the reference from a clean run of the recipe. A reference recorded across "
        "software versions is compared with the band only, never bitwise.",
        references=_REF_REFS,
    ),
)
