"""The bad-input matrix (issue 10): every command x every bad input, in one table.

Each row runs one command line in process (typer's CliRunner on `trainguard.cli.app`) against
a fresh workspace of real files and asserts:
- the exit status (2 bad input; 1 where the command ran into a finding or a write failure);
- no traceback, and a message that names the problem (`says`, case-insensitive);
- no wrong words (`never_says`: "does not exist" of a path that exists, "delete");
- every file that existed before is byte-identical afterwards (inputs are never touched), and
  no new file appeared (nothing written, no partial output) except what the row allows.

To add a row: append `Row(...)` under its command. Placeholders in `args` are workspace paths
(see `Workspace`); `fault` arranges a write failure (`readonly`, `disk_full`), missing cloud
credentials (`no_credentials`) or a held run-dir lock (`locked`); `tiny_run` alters a copy of a
finished run (`{tiny_run}`, resumed with `{tiny_run_recipe}`). A row for a fix still under way
gets `marks=(pytest.mark.xfail(strict=True, reason=...),)`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import functools
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainguard.cli import app


@dataclass(frozen=True)
class Row:
    id: str
    args: tuple[str, ...]
    exit: int = 2
    says: tuple[str, ...] = ()
    never_says: tuple[str, ...] = ()
    fault: str | None = None
    disk_limit: int = 1024  # `disk_full`: the bytes a file may hold (below the output's size)
    may_create: tuple[str, ...] = ()  # globs, relative to the workspace, of allowed new files
    tiny_run: str | None = None  # `{tiny_run}`: a finished 12-step run's copy, as TINY_RUNS says
    marks: tuple = field(default_factory=tuple)

    def param(self):
        return pytest.param(self, id=self.id, marks=self.marks)


def row(id: str, *args: str, **kw) -> Row:
    return Row(id, args, **kw)


def cannot(path: str) -> tuple[str, ...]:
    """What a write failure says: what it cannot do, and the path (exit 1)."""
    return ("cannot", path)


RO = "readonly"  # every write failure names the path it could not write
NOT_EXIST = ("does not exist",)
FIT = ("--boot", "5")  # a few bootstrap refits: the rows test the inputs, not the fit
SMALL = ("--vocab-size", "260", "--seq-len", "8", "--val-fraction", "0.2")
# Drill rows name a recipe whose runs fail at once: if a check were missing, no drill trains.
DRILL = ("--recipe", "{tiny}", "--only", "clean", "--set", "data.source={inputs}/missing")
DRILL_DIR = ("--workdir", "{out}/drill")
CHAOS = ("drill", "--recipe", "{tiny}", *DRILL_DIR, "--chaos")  # issue 24: chaos soak
# issue 24: goodput planner (`trainguard plan`): the numbers it needs, few simulated failures
# (a row's own value comes after PLAN_ALL: the last of a repeated option counts)
PLAN_ALL = ("--step-time", "1", "--checkpoint-stall", "1", "--restart", "60", "--gpus", "8")
PLAN_CYCLES = ("--cycles", "1000")
# Resuming a copy of the finished 12-step tiny run (`Row.tiny_run` alters it first).
TINY_RESUME = ("run", "{tiny_run_recipe}", "--run-dir", "{tiny_run}")

ROWS = [
    # --- run ------------------------------------------------------------------------------
    row("run-recipe-not-utf8", "run", "{bad_recipe}", "--run-dir", "{out}/r", says=("UTF-8",)),
    row("run-threads-negative", "run", "{tiny}", "--set", "train.threads=-1", says=("threads",)),
    row("run-threads-zero", "run", "{tiny}", "--set", "train.threads=0", says=("threads",)),
    row("run-seed-negative", "run", "{tiny}", "--set", "train.seed=-1", says=("train.seed",)),
    row("run-seed-2-63", "run", "{tiny}", "--set", f"train.seed={2**63}", says=("train.seed",)),
    row(
        "run-moe-top-k-above-experts",
        *("run", "{tiny}", "--set", "model.moe.n_experts=2", "--set", "model.moe.top_k=3"),
        says=("top_k",),
    ),
    row("run-lr-nan", "run", "{tiny}", "--set", "train.lr=.nan", says=("train.lr",)),
    row("run-lr-inf", "run", "{tiny}", "--set", "train.lr=.inf", says=("train.lr",)),
    row("run-lr-above-10", "run", "{tiny}", "--set", "train.lr=30", says=("train.lr",)),
    row(
        "run-dir-inside-source",
        *("run", "{tiny}", "--run-dir", "{corpus}/run"),
        says=("inside the input folder",),
    ),
    row(
        "run-dir-recipe-not-utf8",
        *("run", "{tiny}", "--run-dir", "{run_bad_recipe}"),
        says=("recipe", "UTF-8"),
        may_create=("run-bad-recipe/.lock",),  # the run dir's lock file stays, by design
    ),
    row(
        "run-s3-without-credentials",
        *("run", "{tiny}", "-q", "--run-dir", "{out}/s3run"),
        *("--set", "checkpoint.dir=s3://trainguard-matrix-no-such-bucket/ckpt"),
        says=("credentials",),
        fault="no_credentials",
        may_create=("out/s3run", "out/s3run/*"),
    ),
    row(
        "run-dir-locked",
        *("run", "{tiny}", "--run-dir", "{run_ok}", "--set", "data.source={inputs}/missing"),
        says=("lock",),
        fault="locked",
        may_create=("run-ok/.lock",),  # the lock file the test holds
    ),
    row(
        "run-max-restarts-negative",
        *("run", "{tiny}", "--max-restarts", "-1", "--set", "data.source={inputs}/missing"),
        says=("--max-restarts",),
    ),
    row(
        "run-reference-truncated",
        *("run", "{tiny}", "--run-dir", "{out}/r", "--set", "reference.path={ref_truncated}"),
        says=("reference file", "is truncated"),
    ),
    row(
        "run-reference-of-another-recipe",
        *("run", "{tiny}", "--run-dir", "{out}/r", "--set", "reference.path={ref_other}"),
        says=("another recipe", "train.lr", "--force"),
    ),
    row(  # checked before any process starts
        "run-nproc-reference-of-another-recipe",
        *("run", "{tiny}", "--nproc", "2", "--run-dir", "{out}/r"),
        *("--set", "reference.path={ref_other}"),
        says=("another recipe", "train.lr", "--force"),
    ),
    row(
        "run-prepared-missing",
        *("run", "{tiny}", "--run-dir", "{out}/r", "--set", "data.prepared={out}/none"),
        says=NOT_EXIST,
        may_create=("out/r", "out/r/*"),
    ),
    row(
        "run-reference-missing",
        *("run", "{tiny}", "--run-dir", "{out}/r", "--set", "reference.path={out}/none.json"),
        says=NOT_EXIST,
    ),
    # issue 26: values
    row(
        "run-max-steps-true", "run", "{tiny}", "--set", "train.max_steps=true", says=("max_steps",)
    ),
    row("run-lr-true", "run", "{tiny}", "--set", "train.lr=true", says=("train.lr", "number")),
    row("run-max-steps-float", "run", "{tiny}", "--set", "train.max_steps=8.0", says=("integer",)),
    row("run-async-save-one", "run", "{tiny}", "--set", "checkpoint.async_save=1", says=("bool",)),
    row("run-recipe-empty", "run", "{empty_recipe}", "--run-dir", "{out}/r", says=("empty",)),
    # issue 26: local process counts (more processes than cores: refused before any start)
    row(
        "run-nproc-above-the-cores",
        *("run", "{tiny}", "--nproc", "100000", "--run-dir", "{out}/r"),
        *("--set", "train.batch_size=100000"),  # divisible: the count itself is refused
        says=("--nproc 100000", "CPU core", "--oversubscribe", "nothing was started"),
    ),
    # issue 23: derived timeouts (the new distributed keys, strictly typed)
    row(
        "run-timeout-factor-below-one",
        *("run", "{tiny}", "--set", "distributed.timeout_factor=0.5"),
        says=("timeout_factor", "greater than or equal to 1"),
    ),
    row(
        "run-timeout-percentile-above-100",
        *("run", "{tiny}", "--set", "distributed.timeout_percentile=120"),
        says=("timeout_percentile", "100"),
    ),
    row(
        "run-derive-timeouts-not-a-bool",
        *("run", "{tiny}", "--set", "distributed.derive_timeouts=1"),
        says=("derive_timeouts", "bool"),
    ),
    # issue 23: stragglers (the new distributed keys, strictly typed)
    row(
        "run-straggler-steps-zero",
        *("run", "{tiny}", "--set", "distributed.straggler_steps=0"),
        says=("straggler_steps", "greater than or equal to 1"),
    ),
    row(
        "run-straggler-min-lag-negative",
        *("run", "{tiny}", "--set", "distributed.straggler_min_lag_s=-0.1"),
        says=("straggler_min_lag_s", "greater than or equal to 0"),
    ),
    # issue 26: ckptio (a link where the run writes its own file: refused, its target unchanged)
    row(
        "run-metrics-jsonl-is-a-symlink",
        *("run", "{tiny}", "--no-evals", "--run-dir", "{run_metrics_link}"),
        says=("metrics.jsonl", "symbolic link", "{outside}"),
    ),
    row(
        "run-tokenizer-json-is-a-symlink",
        *("run", "{tiny}", "--no-evals", "--run-dir", "{run_tokenizer_link}"),
        says=("tokenizer.json", "symbolic link"),
    ),
    row(
        "run-quarantine-is-a-symlink",
        *("run", "{tiny}", "--no-evals", "--run-dir", "{run_quarantine_link}"),
        says=("quarantine", "symbolic link"),
    ),
    # issue 26: rundir (a refused resume leaves the run dir byte-identical; no silent restart)
    *[
        row(f"run-resume-{name}", *TINY_RESUME, *args, tiny_run=alter, **kw)
        for name, alter, args, kw in [
            ("checkpoints-deleted", "no_steps", (), {"exit": 1, "says": ("C107", "--fresh")}),
            ("checkpoints-folder-deleted", "no_root", (), {"exit": 1, "says": ("C107", "--fresh")}),
            ("checkpoints-damaged", "all_damaged", (), {"exit": 1, "says": ("C107", "--fresh")}),
            (
                "data-changed",
                "data_changed",
                ("--set", "train.max_steps=16"),
                {"exit": 1, "says": ("D104", "--accept-data-change")},
            ),
            ("other-recipe", None, ("--set", "train.lr=0.1"), {"says": ("train.lr", "--run-dir")}),
            ("max-steps-below", None, ("--set", "train.max_steps=8"), {"says": ("max_steps",)}),
            (
                "reference-of-another-recipe",
                None,
                ("--set", "reference.path={ref_other}"),
                {"says": ("another recipe",)},
            ),
            ("locked", None, (), {"says": ("lock",), "fault": "locked"}),
            (
                "step-symlink",
                "step_12_symlink",
                ("--set", "train.max_steps=16"),
                {"says": ("{tiny_run}/checkpoints/step-12", "symbolic link", "move")},
            ),
            (
                "step-file",
                "step_16_file",
                ("--set", "train.max_steps=16"),
                {"says": ("{tiny_run}/checkpoints/step-16", "a file", "move")},
            ),
            (
                "quarantine-file",
                "quarantine_file",
                (),
                {"says": ("{tiny_run}/checkpoints/quarantine", "a file", "move")},
            ),
            (
                "quarantine-symlink",
                "quarantine_symlink",
                (),
                {"says": ("{tiny_run}/checkpoints/quarantine", "symbolic link")},
            ),
            (
                "fresh-attic-symlink",
                "attic_symlink",
                ("--fresh",),
                {"says": ("attic", "symbolic link")},
            ),
        ]
    ],
    # issue 23: batch-size ramps (train.batch_ramp; the tiny recipe's full batch is 2)
    *[
        row(
            f"run-batch-ramp-{name}",
            "run",
            "{tiny}",
            "--set",
            f"train.batch_ramp={ramp}",
            says=says,
        )  # fmt: skip
        for name, ramp, says in (
            ("short", "[[0, 2], [5, 4]]", ("ends at 4 sequences", "end the ramp at 2")),
            ("odd-size", "[[0, 3], [5, 2]]", ("3 sequences", "multiple of train.batch_size=2")),
            ("late-start", "[[3, 8]]", ("batch_ramp[0] is at step 3", "start at 0")),
            ("falling-steps", "[[0, 8], [5, 16], [5, 8]]", ("batch_ramp[2] is at step 5",)),
            ("triple", "[[0, 8, 2]]", ("not a (step, size) pair",)),
            ("float", "[[0, 8.0]]", ("batch_ramp", "integer")),
            ("empty", "[]", ("batch_ramp is empty",)),
        )
    ],
    # issue 26: stall (the checkpoint queue's settings)
    row(
        "run-checkpoint-queue-zero", "run", "{tiny}", "--set", "checkpoint.queue=0", says=("queue",)
    ),
    row(
        "run-checkpoint-when-full-drop",
        *("run", "{tiny}", "--set", "checkpoint.when_full=drop"),
        says=("when_full", "wait", "skip"),
    ),
    # issue 21: fmt (a run dir of the previous release's format: the command that converts it)
    row(
        "run-resume-old-format",
        *TINY_RESUME,
        tiny_run="old_format",
        says=("earlier trainguard release", "trainguard checkpoint convert", "nothing was changed"),
    ),
    # --- checkpoint convert -----------------------------------------------------------------
    # issue 21: fmt
    row("checkpoint-convert-missing", "checkpoint", "convert", "{out}/nothing", says=NOT_EXIST),
    row(
        "checkpoint-convert-no-checkpoints",
        *("checkpoint", "convert", "{run_ok}"),
        says=("has no checkpoints",),
    ),
    # --- batch ------------------------------------------------------------------------------
    row("batch-run-dir-missing", "batch", "{out}/nothing", "--step", "1", says=NOT_EXIST),
    row("batch-not-a-run-dir", "batch", "{inputs}", "--step", "1", says=("not a run dir",)),
    row("batch-recipe-not-utf8", "batch", "{run_bad_recipe}", "--step", "1", says=("UTF-8",)),
    *[  # steps count from 0: the previous release's rows 1..5 read as steps 0..4
        row(f"batch-step-{n}", "batch", "{run_ok}", "--step", n, says=("out of range", "0 and 4"))
        for n in ("-1", "5")
    ],
    row(
        "batch-no-data",
        *("batch", "{run_no_data}", "--step", "2"),
        says=("no prepared data", "trainguard data prepare"),
    ),
    row(
        "batch-html-inside-run-dir",
        *("batch", "{run_ok}", "--step", "2", "--html", "{run_ok}/b.html"),
        says=("inside the input folder",),
    ),
    # issue 26: readers (a metric row nested 100,000 deep is skipped, not a RecursionError)
    row(
        "batch-metrics-row-nested-too-deep",
        *("batch", "{run_deep}", "--step", "2"),
        says=("metrics.jsonl:6: values nest deeper than 64 levels", "no prepared data"),
    ),
    # issue 22: run record (--describe: the user's sample id -> text function)
    row(
        "batch-describe-file-missing",
        *("batch", "{run_ok}", "--step", "2", "--describe", "{inputs}/nothing.py:describe"),
        says=("--describe file", "does not exist", "file.py:function"),
    ),
    row(
        "batch-describe-no-function",
        *("batch", "{run_ok}", "--step", "2", "--describe", "{inputs}/models/nanleak.py"),
        says=("--describe target", "names no function", "file.py:function"),
    ),
    row(
        "batch-describe-function-missing",
        *("batch", "{run_ok}", "--step", "2", "--describe", "{inputs}/models/nanleak.py:nope"),
        says=("has no callable 'nope'",),
    ),
    row(
        "batch-describe-module-not-importable",
        *("batch", "{run_ok}", "--step", "2", "--describe", "no_such_module_tg:describe"),
        says=("cannot import module", "no_such_module_tg", "PYTHONPATH"),
    ),
    row(
        "batch-own-record-step-out-of-range",
        *("batch", "{own_record}", "--step", "5"),
        says=("out of range", "0 and 4"),
    ),
    # --- reference record -----------------------------------------------------------------
    *[
        row(f"reference-record-{name}", "reference", "record", run, "--out", out, **kw)
        for name, run, out, kw in [
            ("run-dir-missing", "{out}/nothing", "{out}/r.json", {"says": NOT_EXIST}),
            ("not-a-run-dir", "{inputs}", "{out}/r.json", {"says": ("not a run dir",)}),
            ("unfinished", "{run_ok}", "{out}/r.json", {"says": ("unfinished",)}),
            ("recipe-not-utf8", "{run_bad_recipe}", "{out}/r.json", {"says": ("recipe", "UTF-8")}),
            (
                "metrics-not-utf8",
                "{run_bad_metrics}",
                "{out}/r.json",
                {"says": ("metric", "UTF-8")},
            ),
            (
                "out-is-metrics",
                "{finished_run}",
                "{finished_run}/metrics.jsonl",
                {"says": ("inside the input folder",)},
            ),
            ("out-is-run-dir", "{finished_run}", "{finished_run}", {"says": ("is the input",)}),
            ("out-is-a-folder", "{finished_run}", "{out}", {"exit": 1, "says": cannot("{out}")}),
            (
                "readonly",
                "{finished_run}",
                "{ro}/r.json",
                {"exit": 1, "says": cannot("{ro}/r.json"), "fault": "readonly"},
            ),
            (
                "disk-full",
                "{finished_run}",
                "{out}/r.json",
                {"exit": 1, "says": cannot("{out}/r.json"), "fault": "disk_full"},
            ),
            (
                "works",
                "{finished_run}",
                "{out}/r.json",
                {"exit": 0, "says": ("wrote",), "may_create": ("out/r.json",)},
            ),
        ]
    ],
    # --- plan -----------------------------------------------------------------------------
    # issue 24: goodput planner (`trainguard plan`)
    *[
        row(f"plan-{name}", "plan", *PLAN_CYCLES, *args, **kw)
        for name, args, kw in [
            ("missing-numbers", ("--step-time", "1"), {"says": ("missing", "--restart")}),
            ("step-time-negative", (*PLAN_ALL, "--step-time", "-1"), {"says": ("--step-time",)}),
            (
                "stall-zero",
                (*PLAN_ALL, "--checkpoint-stall", "0"),
                {"says": ("--checkpoint-stall", "positive")},
            ),
            ("restart-nan", (*PLAN_ALL, "--restart", "nan"), {"says": ("--restart", "positive")}),
            ("gpus-zero", (*PLAN_ALL, "--gpus", "0"), {"says": ("--gpus", "1 or more")}),
            (
                "mtbf-negative",
                (*PLAN_ALL, "--gpu-mtbf-hours", "-5"),
                {"says": ("--gpu-mtbf-hours", "hours")},
            ),
            (
                "write-below-stall",
                (*PLAN_ALL, "--checkpoint-write", "0.5"),
                {"says": ("shorter than the checkpoint stall",)},
            ),
            ("cycles-too-few", (*PLAN_ALL, "--cycles", "10"), {"says": ("--cycles",)}),
            ("run-missing", ("--run", "{out}/nothing", *PLAN_ALL), {"says": NOT_EXIST}),
            ("run-not-a-run-dir", ("--run", "{inputs}", *PLAN_ALL), {"says": ("not a run dir",)}),
            (
                "run-records-no-restart",
                ("--run", "{finished_run}", "--gpus", "8"),
                {"says": ("missing", "--restart", "no restart time")},
            ),
            (
                "run-recipe-not-utf8",
                ("--run", "{run_bad_recipe}", *PLAN_ALL),
                {"says": ("recipe", "UTF-8")},
            ),
            (
                "run-metrics-not-utf8",
                ("--run", "{run_bad_metrics}", *PLAN_ALL),
                {"says": ("metric", "UTF-8")},
            ),
            (
                "out-inside-run-dir",
                ("--run", "{finished_run}", "--out", "{finished_run}/plots", *PLAN_ALL),
                {"says": ("inside the input folder",)},
            ),
            (
                "out-is-a-file",
                ("--out", "{afile}", *PLAN_ALL),
                {"exit": 1, "says": cannot("{afile}")},
            ),
            (
                "out-readonly",
                ("--out", "{ro}/plots", *PLAN_ALL),
                {"exit": 1, "says": cannot("{ro}/plots"), "fault": "readonly"},
            ),
            (
                "works",
                ("--out", "{out}/plots", *PLAN_ALL),
                {"exit": 0, "says": ("Goodput plan",), "may_create": ("out/plots", "out/plots/*")},
            ),
        ]
    ],
    # issue 26: readers (damaged metric rows: skipped, or a 400-digit loss is non-finite)
    row(
        "reference-record-metrics-row-nested-too-deep",
        *("reference", "record", "{finished_deep}", "--out", "{out}/r.json"),
        exit=0,
        says=("metrics.jsonl:6: values nest deeper than 64 levels", "wrote"),
        may_create=("out/r.json",),
    ),
    row(
        "reference-record-metrics-loss-of-400-digits",
        *("reference", "record", "{finished_big}", "--out", "{out}/r.json"),
        # the run record counts steps from 0: the row of step 3 (issue 22)
        says=("non-finite loss at step 3",),
    ),
    # --- recipes --------------------------------------------------------------------------
    row("recipes-unknown-option", "recipes", "--bogus", says=("--bogus",)),
    # --- report ---------------------------------------------------------------------------
    row("report-recipe-not-utf8", "report", "{run_bad_recipe}", says=("recipe", "UTF-8")),
    row("report-metrics-not-utf8", "report", "{run_bad_metrics}", says=("metric", "UTF-8")),
    row("report-not-a-run-dir", "report", "{inputs}", says=("not a run dir", "no run record")),
    row("report-html-is-a-folder", "report", "{run_html_dir}", exit=1, says=cannot("report.html")),
    row("report-readonly", "report", "{ro_run}", exit=1, says=cannot("{ro_run}"), fault="readonly"),
    row(
        "report-disk-full", "report", "{run_ok}", exit=1, says=cannot("{run_ok}"), fault="disk_full"
    ),
    # issue 26: ckptio
    row(
        "report-html-is-a-symlink",
        *("report", "{run_report_link}"),
        exit=1,
        says=("report.html", "symbolic link"),
    ),
    # issue 26: readers (markup in the run dir's name; damaged metric rows)
    row(
        "report-run-dir-with-markup",
        *("report", "{run_markup}"),
        exit=0,
        says=("wrote", "m[/b]/report.html"),
        may_create=("m?/b?/report.*",),
    ),
    row(
        "report-metrics-row-nested-too-deep",
        *("report", "{run_deep}"),
        exit=0,
        says=("metrics.jsonl:6: values nest deeper than 64 levels", "wrote"),
        may_create=("run-deep/report.*",),
    ),
    row(
        "report-metrics-number-of-400-digits",
        *("report", "{run_big}"),
        exit=0,
        says=("wrote",),
        may_create=("run-big/report.*",),
    ),
    # --- check-model ----------------------------------------------------------------------
    row(
        "check-model-nan-logits-leaky",
        *("check-model", "{models}/nanleak.py:make", "--seq-len", "8", "--batch-size", "2"),
        exit=1,
        says=("M108", "M101"),
    ),
    row(
        "check-model-seed-negative",
        *("check-model", "{models}/nanleak.py:make", "--seed", "-1"),
        says=("--seed",),
    ),
    row(
        "check-model-shadow-steps-without-dtype",
        *("check-model", "{models}/nanleak.py:make", "--shadow-steps", "4"),
        says=("--shadow-steps 4 needs a low-precision --dtype",),
    ),
    row(
        "check-model-target-is-a-folder",
        *("check-model", "{models}:make"),
        says=("is a folder",),
        never_says=NOT_EXIST,
    ),
    # issue 26: readers (a factory that exits: bad input, not its own status)
    row(
        "check-model-factory-calls-exit",
        *("check-model", "{models}/exits.py:make"),
        says=("exits.py:make", "called exit(7)"),
    ),
    # --- check-precision ------------------------------------------------------------------
    row(
        "check-precision-world-size-cap",
        *("check-precision", "--world-size", "100000000"),
        says=("--world-size",),
    ),
    row(
        "check-precision-entries-cap",
        *("check-precision", "--world-size", "1000000", "--shadow-steps", "0"),
        says=("--elements",),
    ),
    row(
        "check-precision-nproc-one",
        *("check-precision", "--nproc", "1", "--shadow-steps", "0"),
        says=("--nproc 1", "at least 2 processes"),
    ),
    row(  # --oversubscribe: past the cores check, to the open-file limit
        "check-precision-nproc-above-open-file-limit",
        *("check-precision", "--nproc", "100000000", "--shadow-steps", "0", "--oversubscribe"),
        says=("--nproc 100000000", "open-file limit"),
    ),
    # issue 26: local process counts (more processes than cores: refused before any start)
    row(
        "check-precision-nproc-above-the-cores",
        *("check-precision", "--nproc", "100000", "--shadow-steps", "0"),
        says=("--nproc 100000", "CPU core", "--oversubscribe"),
    ),
    row("check-precision-seed-2-64", "check-precision", "--seed", str(2**64), says=("--seed",)),
    # --- check-tokenizer ------------------------------------------------------------------
    row(
        "check-tokenizer-prepared-wrong-dir",
        *("check-tokenizer", "{tokenizer}", "--prepared", "{not_prepared}"),
        says=("not a prepared data folder",),
        never_says=("delete", "remove"),
    ),
    row(
        "check-tokenizer-prepared-missing",
        *("check-tokenizer", "{tokenizer}", "--prepared", "{out}/nothing"),
        says=NOT_EXIST,
        never_says=("delete",),
    ),
    row(
        "check-tokenizer-corpus-fake-parquet",
        *("check-tokenizer", "{tokenizer}", "--corpus", "{fake_parquet}"),
        says=("Parquet",),
    ),
    # issue 26: ckptio (a file the manifest does not list is never opened)
    row(
        "check-tokenizer-checkpoint-file-not-in-manifest",
        *("check-tokenizer", "{tokenizer}", "--checkpoint", "{step_unlisted}"),
        exit=1,
        says=("C111", "state.json", "listed"),
    ),
    # issue 26: readers (a shard that is a FIFO is named as one, and never read)
    row(
        "check-tokenizer-prepared-shard-is-a-fifo",
        *("check-tokenizer", "{tokenizer}", "--prepared", "{prepared_fifo}"),
        says=("train-00000.bin", "not a regular file"),
        never_says=(*NOT_EXIST, "missing"),
    ),
    # --- data prepare ---------------------------------------------------------------------
    *[
        row(f"data-prepare-{name}", "data", "prepare", src, "--out", out, *SMALL, *rest, **kw)
        for name, src, out, rest, kw in [
            ("fake-parquet", "{fake_parquet}", "{out}/p", (), {"says": ("Parquet",)}),
            ("out-is-source", "{corpus}", "{corpus}", (), {"says": ("is the input",)}),
            (
                "out-inside-source",
                "{corpus}",
                "{corpus}/cache",
                (),
                {"says": ("inside the input folder",)},
            ),
            ("source-is-url", "s3://bucket/data.jsonl", "{out}/p", (), {"says": ("URL",)}),
            (
                "out-under-a-file",
                "{corpus}",
                "{afile}/cache",
                (),
                {"exit": 1, "says": cannot("{afile}")},
            ),
            (
                "out-readonly",
                "{corpus}",
                "{ro}",
                (),
                {"exit": 1, "says": cannot("{ro}"), "fault": "readonly"},
            ),
            (
                "disk-full",
                "{corpus}",
                "{out}/p",
                ("--no-progress",),
                {
                    "exit": 1,
                    "says": ("cannot write", "{out}/p", "file too large"),
                    "fault": "disk_full",
                },
            ),
        ]
    ],
    # issue 26: readers (a file link out of the source folder is not read: D105)
    row(
        "data-prepare-file-link-out-of-the-source",
        *("data", "prepare", "{corpus_linked}", "--out", "{out}/p", *SMALL, "--no-progress"),
        exit=0,
        says=("D105", "1 file(s)"),
        may_create=("out/p", "out/p/*"),
    ),
    # --- data dedup -----------------------------------------------------------------------
    # (Text that is not valid Unicode, a lone surrogate included, is not bad input: every
    # command reads it, tests/test_sources.py.)
    row(
        "data-dedup-fake-parquet",
        *("data", "dedup", "{fake_parquet}", "--out", "{out}/d.parquet"),
        says=("Parquet",),
    ),
    row(
        "data-dedup-out-is-input",
        *("data", "dedup", "{good}", "--out", "{good}"),
        says=("is the input",),
    ),
    row(
        "data-dedup-clusters-is-input",
        *("data", "dedup", "{good}", "--out", "{out}/d.jsonl", "--clusters", "{good}"),
        says=("--clusters", "is the input"),
    ),
    row(
        "data-dedup-clusters-is-input-via-symlink",
        *("data", "dedup", "{good}", "--out", "{out}/d.jsonl", "--clusters", "{good_link}"),
        says=("--clusters", "is the input"),
    ),
    row(
        "data-dedup-clusters-is-out",
        *("data", "dedup", "{good}", "--out", "{out}/d.jsonl", "--clusters", "{out}/d.jsonl"),
        says=("same file",),
    ),
    row(
        "data-dedup-default-clusters-is-input",
        *("data", "dedup", "{inputs}/x.clusters.jsonl", "--out", "{inputs}/x.jsonl"),
        says=("clusters", "is the input"),
    ),
    row(
        "data-dedup-bands-cap",
        *("data", "dedup", "{good}", "--out", "{out}/d.jsonl", "--bands", "100000"),
        says=("hash functions",),
    ),
    row(
        "data-dedup-seed-negative",
        *("data", "dedup", "{good}", "--out", "{out}/d.jsonl", "--seed", "-1"),
        says=("--seed",),
    ),
    row(
        "data-dedup-input-url-local-engine",
        *("data", "dedup", "s3://bucket/in.jsonl", "--out", "{out}/d.jsonl"),
        says=("URL",),
    ),
    row(
        "data-dedup-clusters-s3-without-credentials",
        *("data", "dedup", "{good}", "--out", "{out}/d.jsonl"),
        *("--clusters", "s3://trainguard-matrix-no-such-bucket/c.jsonl"),
        says=("credentials",),
        fault="no_credentials",
    ),
    row(
        "data-dedup-out-is-a-folder",
        *("data", "dedup", "{good}", "--out", "{out}"),
        exit=1,
        says=cannot("{out}"),
    ),
    row(
        "data-dedup-readonly",
        *("data", "dedup", "{good}", "--out", "{ro}/d.jsonl"),
        exit=1,
        says=cannot("{ro}/d.jsonl"),
        fault="readonly",
    ),
    row(
        "data-dedup-disk-full",
        *("data", "dedup", "{good}", "--out", "{out}/d.jsonl"),
        exit=1,
        says=cannot("{out}/d.jsonl"),
        fault="disk_full",
    ),
    row(
        "data-dedup-clusters-readonly",
        *("data", "dedup", "{good}", "--out", "{out}/d.jsonl", "--clusters", "{ro}/c.jsonl"),
        exit=1,
        says=cannot("{ro}/c.jsonl"),
        fault="readonly",
    ),
    # --- data filter ----------------------------------------------------------------------
    row(
        "data-filter-out-is-source",
        *("data", "filter", "{good}", "--out", "{good}"),
        says=("is the input",),
    ),
    row(
        "data-filter-out-inside-source",
        *("data", "filter", "{corpus}", "--out", "{corpus}/filtered"),
        says=("inside the input folder",),
    ),
    row(
        "data-filter-rejected-file-is-source",
        *("data", "filter", "{inputs}/y.rejected.jsonl", "--out", "{inputs}/y.jsonl"),
        says=("rejected file", "is the input"),
    ),
    row(
        "data-filter-min-words-negative",
        *("data", "filter", "{good}", "--out", "{out}/f.jsonl", "--min-words", "-5"),
        says=("--min-words",),
    ),
    row(
        "data-filter-fake-parquet",
        *("data", "filter", "{fake_parquet}", "--out", "{out}/f.jsonl"),
        says=("Parquet",),
    ),
    row(
        "data-filter-source-is-url",
        *("data", "filter", "s3://bucket/in.jsonl", "--out", "{out}/f.jsonl"),
        says=("URL",),
        never_says=NOT_EXIST,
    ),
    row(
        "data-filter-out-is-a-folder",
        *("data", "filter", "{good}", "--out", "{out}/kept.jsonl"),
        exit=1,
        says=cannot("{out}/kept.jsonl"),
    ),
    row(
        "data-filter-readonly",
        *("data", "filter", "{good}", "--out", "{ro}/f.jsonl"),
        exit=1,
        says=cannot("{ro}/f.jsonl"),
        fault="readonly",
    ),
    row(
        "data-filter-disk-full",
        *("data", "filter", "{good}", "--out", "{out}/f.jsonl", "--min-words", "1"),
        exit=1,
        says=cannot("{out}/f.jsonl"),
        fault="disk_full",
    ),
    row(
        "data-filter-spark-out-is-source",
        *("data", "filter", "{good}", "--out", "{good}", "--engine", "spark"),
        says=("is the input",),
    ),
    row(
        "data-filter-spark-out-under-a-file",
        *("data", "filter", "{good}", "--out", "{afile}/f.jsonl", "--engine", "spark"),
        exit=1,
        says=cannot("{afile}"),
    ),
    row(
        "data-prepare-spark-source-is-url",
        *("data", "prepare", "s3://bucket/data.jsonl", "--out", "{out}/p", *SMALL),
        *("--engine", "spark"),
        says=("URL",),
    ),
    # --- data contamination ---------------------------------------------------------------
    *[
        row(
            f"data-contamination-{name}",
            "data",
            "contamination",
            train,
            "--evals",
            spec,
            *rest,
            **kw,
        )
        for name, train, spec, rest, kw in [
            ("train-missing", "{inputs}/missing.jsonl", "{spec_regex}", (), {"says": NOT_EXIST}),
            ("train-fake-parquet", "{fake_parquet}", "{spec_regex}", (), {"says": ("Parquet",)}),
            ("train-is-url", "s3://bucket/in.jsonl", "{spec_regex}", (), {"says": ("URL",)}),
            ("spec-missing", "{good}", "{inputs}/nope.yaml", (), {"says": NOT_EXIST}),
            ("spec-not-utf8", "{good}", "{spec_bad}", (), {"says": ("UTF-8",)}),
            ("task-data-not-utf8", "{good}", "{spec_bad_data}", (), {"says": ("UTF-8",)}),
            (
                "containment-above-1",
                "{good}",
                "{spec_regex}",
                ("--containment", "1.5"),
                {"says": ("--containment",)},
            ),
            (
                "val-fraction-above-half",
                "{good}",
                "{spec_regex}",
                ("--val-fraction", "0.7"),
                {"says": ("--val-fraction",)},
            ),
            ("builtin-needs-held-out", "{corpus}", "python_next_line", (), {"says": ("held-out",)}),
        ]
    ],  # fmt: skip
    # issue 26: contamination at scale (engine choice, the edited-copy threshold)
    row(
        "data-contamination-engine-unknown",
        *("data", "contamination", "{good}", "--evals", "{spec_regex}", "--engine", "hadoop"),
        says=("--engine",),
    ),
    row(
        "data-contamination-edit-containment-zero",
        *("data", "contamination", "{good}", "--evals", "{spec_regex}"),
        *("--edit-containment", "0"),
        says=("--edit-containment", "0.35"),
    ),
    row(
        "data-contamination-edit-containment-above-1",
        *("data", "contamination", "{good}", "--evals", "{spec_regex}"),
        *("--edit-containment", "1.5"),
        says=("--edit-containment",),
    ),
    row(
        "data-contamination-spark-train-missing",
        *("data", "contamination", "{inputs}/missing.jsonl", "--evals", "{spec_regex}"),
        *("--engine", "spark"),
        says=NOT_EXIST,
    ),
    row(
        "data-contamination-spark-train-is-url",
        *("data", "contamination", "s3://bucket/in.jsonl", "--evals", "{spec_regex}"),
        *("--engine", "spark"),
        says=("URL",),
    ),
    # issue 26: readers (an eval spec's data stays in the spec's folder)
    row(
        "data-contamination-spec-data-outside-its-folder",
        *("data", "contamination", "{good}", "--evals", "{spec_outside}"),
        says=("'../x.jsonl' is outside the spec's folder",),
    ),
    # --- data order-check -----------------------------------------------------------------
    row("data-order-check-missing", "data", "order-check", "{inputs}/ids.txt", says=NOT_EXIST),
    row(
        "data-order-check-a-folder",
        *("data", "order-check", "{inputs}"),
        says=("is a folder",),
        never_says=NOT_EXIST,
    ),
    row(
        "data-order-check-not-utf8",
        *("data", "order-check", "{metrics_bad_csv}"),
        says=("not UTF-8",),
    ),
    row("data-order-check-no-sources", "data", "order-check", "{good}", says=("no source",)),
    row(
        "data-order-check-ids-not-integers",
        *("data", "order-check", "{good}", "--sources", "{runs_csv}"),
        says=("not an integer",),
    ),
    row(
        "data-order-check-sources-not-utf8",
        *("data", "order-check", "{runs_csv}", "--sources", "{metrics_bad_csv}"),
        says=("UTF-8",),
    ),
    row(
        "data-order-check-not-prepared",
        *("data", "order-check", "{good}", "--prepared", "{not_prepared}", "--seq-len", "8"),
        says=("not a prepared data folder",),
    ),
    row(
        "data-order-check-sampler-not-importable",
        *("data", "order-check", "no_such_module_xyz:factory"),
        says=("cannot import",),
    ),
    row(
        "data-order-check-count-below-2",
        *("data", "order-check", "{good}", "--count", "1"),
        says=("--count",),
    ),
    # --- data inspect ---------------------------------------------------------------------
    row(
        "data-inspect-html-is-source",
        *("data", "inspect", "{good}", "--html", "{good}"),
        says=("is the input",),
    ),
    row(
        "data-inspect-html-inside-source",
        *("data", "inspect", "{corpus}", "--html", "{corpus}/view.html"),
        says=("inside the input folder",),
    ),
    row("data-inspect-fake-parquet", "data", "inspect", "{fake_parquet}", says=("Parquet",)),
    row(
        "data-inspect-seed-negative", "data", "inspect", "{good}", "--seed", "-1", says=("--seed",)
    ),
    row(
        "data-inspect-html-is-a-folder",
        *("data", "inspect", "{good}", "--html", "{out}"),
        exit=1,
        says=cannot("{out}"),
    ),
    row(
        "data-inspect-readonly",
        *("data", "inspect", "{good}", "--html", "{ro}/v.html"),
        exit=1,
        says=cannot("{ro}/v.html"),
        fault="readonly",
    ),
    row(
        "data-inspect-disk-full",
        *("data", "inspect", "{good}", "--html", "{out}/v.html"),
        exit=1,
        says=cannot("{out}/v.html"),
        fault="disk_full",
    ),
    # --- data ablate ----------------------------------------------------------------------
    # issue 25: data ablate (everything is checked before OUT is made or a run starts)
    *[
        row(
            f"data-ablate-{name}",
            *("data", "ablate", base, "--recipe", "{tiny}", "--evals", evals),
            *("--out", out, *extra),
            **kw,
        )
        for name, base, evals, out, extra, kw in [
            (
                "variant-without-data",
                "{good}",
                "python_next_line",
                "{out}/abl",
                ("--variant", "nodata"),
                {"says": ("NAME=DATA",)},
            ),
            (
                "variant-named-base",
                "{good}",
                "python_next_line",
                "{out}/abl",
                ("--variant", "base={good}"),
                {"says": ("'base'",)},
            ),
            (
                "variant-twice",
                "{good}",
                "python_next_line",
                "{out}/abl",
                ("--variant", "v={good}", "--variant", "v={good}"),
                {"says": ("twice",)},
            ),
            (
                "base-missing",
                "{inputs}/missing.jsonl",
                "python_next_line",
                "{out}/abl",
                ("--variant", "v={good}"),
                {"says": NOT_EXIST},
            ),
            (
                "variant-missing",
                "{good}",
                "python_next_line",
                "{out}/abl",
                ("--variant", "v={inputs}/missing.jsonl"),
                {"says": NOT_EXIST},
            ),
            (
                "evals-bad-regex",
                "{good}",
                "{spec_regex}",
                "{out}/abl",
                ("--variant", "v={good}"),
                {"says": ("E118",)},
            ),
            (
                "evals-missing",
                "{good}",
                "{inputs}/missing.yaml",
                "{out}/abl",
                ("--variant", "v={good}"),
                {"says": NOT_EXIST},
            ),
            (
                "bad-set",
                "{good}",
                "python_next_line",
                "{out}/abl",
                ("--variant", "v={good}", "--set", "train.max_steps=-1"),
                {"says": ("max_steps",)},
            ),
            (
                "too-many-jobs",
                "{good}",
                "python_next_line",
                "{out}/abl",
                ("--variant", "v={good}", "--jobs", "100000"),
                {"says": ("--jobs 100000",)},
            ),
            (
                "out-is-base",
                "{good}",
                "python_next_line",
                "{good}",
                ("--variant", "v={good}"),
                {"says": ("{good}",)},
            ),
            (
                "out-under-a-file",
                "{good}",
                "python_next_line",
                "{afile}/abl",
                ("--variant", "v={good}"),
                {"exit": 1, "says": cannot("{afile}")},
            ),
            (  # OUT gets data/ and run dirs: an input inside it could be replaced
                "out-holds-the-base",
                "{good}",
                "python_next_line",
                "{inputs}",
                ("--variant", "v={good}"),
                {"says": ("holds the input BASE",)},
            ),
            (
                "plot-is-the-recipe",
                "{good}",
                "python_next_line",
                "{out}/abl",
                ("--variant", "v={good}", "--plot", "{tiny}"),
                {"says": ("--plot", "is the input --recipe")},
            ),
            (
                "plot-under-a-file",
                "{good}",
                "python_next_line",
                "{out}/abl",
                ("--variant", "v={good}", "--plot", "{afile}/p.png"),
                {"exit": 1, "says": cannot("{afile}")},
            ),
            (
                "seeds-zero",
                "{good}",
                "python_next_line",
                "{out}/abl",
                ("--variant", "v={good}", "--seeds", "0"),
                {"says": ("--seeds",)},
            ),
            (
                "heldout-docs-zero",
                "{good}",
                "python_next_line",
                "{out}/abl",
                ("--variant", "v={good}", "--heldout-docs", "0"),
                {"says": ("--heldout-docs",)},
            ),
        ]
    ],
    row(
        "data-ablate-recipe-missing",
        *("data", "ablate", "{good}", "--variant", "v={good}", "--recipe", "{inputs}/none.yaml"),
        *("--evals", "python_next_line", "--out", "{out}/abl"),
        says=NOT_EXIST,
    ),
    # --- data check-chat -------------------------------------------------------------------
    # issue 25: data check-chat
    row(
        "data-check-chat-data-missing",
        *("data", "check-chat", "{inputs}/missing.jsonl", "--tokenizer", "{chat_tok}"),
        says=("chat data", "does not exist"),
    ),
    row(
        "data-check-chat-max-examples-zero",
        *("data", "check-chat", "{chat_good}", "--tokenizer", "{chat_tok}", "--max-examples", "0"),
        says=("--max-examples",),
    ),
    row(
        "data-check-chat-data-is-a-folder",
        *("data", "check-chat", "{corpus}", "--tokenizer", "{chat_tok}"),
        says=("is a folder",),
    ),
    row(
        "data-check-chat-line-not-json",
        *("data", "check-chat", "{chat_not_json}", "--tokenizer", "{chat_tok}"),
        says=("chat-not-json.jsonl:2 is not JSON",),
    ),
    row(
        "data-check-chat-line-not-utf8",
        *("data", "check-chat", "{chat_not_utf8}", "--tokenizer", "{chat_tok}"),
        says=("chat-not-utf8.jsonl:1", "UTF-8"),
    ),
    row(
        "data-check-chat-row-without-messages",
        *("data", "check-chat", "{chat_no_fields}", "--tokenizer", "{chat_tok}"),
        says=("chat-no-fields.jsonl:1", "none of messages"),
    ),
    row(
        "data-check-chat-empty-file",
        *("data", "check-chat", "{chat_empty}", "--tokenizer", "{chat_tok}"),
        says=("holds no example",),
    ),
    row(
        "data-check-chat-tokenizer-missing",
        *("data", "check-chat", "{chat_good}", "--tokenizer", "{inputs}/no-tok"),
        says=("tokenizer folder", "does not exist"),
    ),
    row(
        "data-check-chat-tokenizer-is-a-file",
        *("data", "check-chat", "{chat_good}", "--tokenizer", "{tokenizer}"),
        says=("is a file, not a folder", "tokenizer_config.json"),
    ),
    row(
        "data-check-chat-no-tokenizer-json",
        *("data", "check-chat", "{chat_good}", "--tokenizer", "{not_prepared}"),
        says=("no tokenizer.json",),
    ),
    row(
        "data-check-chat-tokenizer-config-not-json",
        *("data", "check-chat", "{chat_good}", "--tokenizer", "{chat_tok_bad_config}"),
        says=("tokenizer_config.json is not valid JSON",),
    ),
    row(
        "data-check-chat-tokenizer-json-broken",
        *("data", "check-chat", "{chat_good}", "--tokenizer", "{chat_tok_broken}"),
        says=("cannot load the tokenizer", "JSONDecodeError"),
    ),
    row(
        "data-check-chat-no-chat-template",
        *("data", "check-chat", "{chat_good}", "--tokenizer", "{chat_tok_no_template}"),
        says=("no chat_template", "--template"),
    ),
    row(
        "data-check-chat-template-missing",
        *("data", "check-chat", "{chat_good}", "--tokenizer", "{chat_tok}"),
        *("--template", "{inputs}/missing.jinja"),
        says=("--template", "does not exist"),
    ),
    row(
        "data-check-chat-template-not-jinja",
        *("data", "check-chat", "{chat_good}", "--tokenizer", "{chat_tok}"),
        *("--template", "{chat_template_bad}"),
        says=("not a valid Jinja template", "line 1"),
    ),
    row(
        "data-check-chat-max-length-zero",
        *("data", "check-chat", "{chat_good}", "--tokenizer", "{chat_tok}", "--max-length", "0"),
        says=("--max-length",),
    ),
    # --- watch ----------------------------------------------------------------------------
    row("watch-jsonl-not-utf8", "watch", "{metrics_bad_jsonl}", says=("UTF-8",)),
    row("watch-csv-not-utf8", "watch", "{metrics_bad_csv}", says=("UTF-8",)),
    row(
        "watch-follow-not-utf8",
        *("watch", "{metrics_bad_jsonl}", "--follow", "--idle-timeout", "0.2"),
        says=("UTF-8",),
    ),
    row("watch-a-folder", "watch", "{inputs}", says=("folder",), never_says=NOT_EXIST),
    # issue 26: readers (devices and FIFOs named, never read; markup in a column; bad rows)
    row(
        "watch-dev-zero",
        *("watch", "/dev/zero"),
        says=("/dev/zero is not a regular file",),
        never_says=NOT_EXIST,
    ),
    row(
        "watch-follow-dev-zero",
        *("watch", "/dev/zero", "--follow", "--idle-timeout", "0.2"),
        says=("/dev/zero is not a regular file",),
        never_says=NOT_EXIST,
    ),
    row("watch-fifo", "watch", "{fifo}", says=("not a regular file",), never_says=NOT_EXIST),
    row(
        "watch-column-with-markup",
        *("watch", "{metrics_markup}", "--metric", "[/x]=loss"),
        exit=1,
        says=("R101", "[/x]"),
    ),
    row(
        "watch-metrics-row-nested-too-deep",
        *("watch", "{metrics_deep}"),
        says=("metrics-deep.jsonl:6: values nest deeper than 64 levels",),
    ),
    row("watch-metrics-number-of-400-digits", "watch", "{metrics_big}", exit=1, says=("R101",)),
    # issue 22: run record (--reference: compare any log with a reference curve)
    row(
        "watch-reference-missing",
        *("watch", "{own_record}", "--reference", "{out}/nothing.ref.json"),
        says=("nothing.ref.json",),
    ),
    row(
        "watch-reference-with-follow",
        *("watch", "{own_record}", "--follow", "--reference", "{ref_other}"),
        says=("--reference", "leave out --follow"),
    ),
    # --- drill ----------------------------------------------------------------------------
    row(
        "drill-markdown-is-recipe",
        *("drill", *DRILL, *DRILL_DIR, "--markdown", "{tiny}"),
        says=("is the input",),
    ),
    row(
        "drill-markdown-is-a-folder",
        *("drill", *DRILL, *DRILL_DIR, "--markdown", "{out}"),
        exit=1,
        says=cannot("{out}"),
    ),
    row(
        "drill-markdown-readonly",
        *("drill", *DRILL, *DRILL_DIR, "--markdown", "{ro}/drills.md"),
        exit=1,
        says=cannot("{ro}/drills.md"),
        fault="readonly",
    ),
    row(
        "drill-markdown-disk-full",
        *("drill", *DRILL, *DRILL_DIR, "--markdown", "{out}/drills.md"),
        exit=1,
        says=cannot("{out}/drills.md"),
        fault="disk_full",
        disk_limit=100,  # one drill's table is about 190 bytes
        may_create=("out/drill*",),  # the drill's own run dir (its run failed)
    ),
    row(
        "drill-missing-recipe",
        *("drill", "--recipe", "{inputs}/missing.yaml", "--only", "clean"),
        *("--workdir", "{out}/drill"),
        says=("missing.yaml",),
    ),
    # issue 26: local process counts (more processes than cores: refused before any start)
    row(
        "drill-jobs-above-the-cores",
        *("drill", "--recipe", "{tiny}", "--only", "nan", "--jobs", "100000", *DRILL_DIR),
        says=("--jobs 100000", "CPU core", "--oversubscribe", "nothing was started"),
    ),
    # issue 24: chaos soak (`drill --chaos DURATION`): every input checked before any run
    row("drill-chaos-not-a-duration", *CHAOS, "ten minutes", says=("not a duration", "10m")),
    row("drill-chaos-zero", *CHAOS, "0s", says=("not a duration",)),
    row(
        "drill-chaos-unknown-fault-kind",
        *(*CHAOS, "10s", "--fault-kind", "kill,meteor"),
        says=("meteor", "kill, corrupt, hang, nan"),
    ),
    row(
        "drill-chaos-faults-do-not-fit",
        *(*CHAOS, "10s", "--steps", "30", "--faults", "40"),
        says=("40 faults", "--steps"),
    ),
    row("drill-chaos-with-only", *CHAOS, "10s", "--only", "nan", says=("--only", "--chaos")),
    row("drill-chaos-faults-zero", *CHAOS, "10s", "--faults", "0", says=("--faults",)),
    row(
        "drill-chaos-bad-set",
        *(*CHAOS, "10s", "--set", "train.lr=fast"),
        says=("train.lr",),
    ),
    row(
        "drill-plot-without-chaos", *("drill", *DRILL, *DRILL_DIR, "--seed", "3"), says=("--chaos",)
    ),
    row(
        "drill-chaos-rank-fault-in-one-process",
        *(*CHAOS, "10s", "--fault-kind", "hung_rank"),
        says=("hung_rank", "several processes", "--nproc 2"),
    ),
    row(
        "drill-chaos-nproc-above-the-cores",
        *(*CHAOS, "10s", "--nproc", "100000"),
        says=("--nproc 100000", "CPU core", "nothing was started"),
    ),
    row(
        "drill-chaos-plot-is-recipe",
        *(*CHAOS, "10s", "--plot", "{tiny}"),
        says=("is the input",),
    ),
    # issue 24: chaos soak of a user's command (`drill --chaos D --command "..."`)
    row(
        "drill-chaos-command-without-run-dir",
        *("drill", *DRILL_DIR, "--chaos", "10s", "--command", "python t.py --out runs/a"),
        says=("has no {{run_dir}}", "--out {{run_dir}}"),
    ),
    row(
        "drill-chaos-command-empty",
        *("drill", *DRILL_DIR, "--chaos", "10s", "--command", " "),
        says=("--command is empty",),
    ),
    row(
        "drill-chaos-command-with-set",
        *("drill", *DRILL_DIR, "--chaos", "10s", "--set", "train.lr=1"),
        *("--command", "python t.py --out {{run_dir}}"),
        says=("--set", "not of --command", "drop them"),
    ),
    row(
        "drill-chaos-command-with-nproc",
        *("drill", *DRILL_DIR, "--chaos", "10s", "--nproc", "2"),
        *("--command", "torchrun t.py --out {{run_dir}}"),
        says=("--nproc", "--nproc-per-node"),
    ),
    row(
        "drill-chaos-command-nan",
        *("drill", *DRILL_DIR, "--chaos", "10s", "--fault-kind", "kill,nan"),
        *("--command", "torchrun --nproc-per-node 2 t.py --out {{run_dir}}"),
        says=("nan", "inside the loop", "drop --command"),
    ),
    row(
        "drill-chaos-command-rank-fault-in-one-process",
        *("drill", *DRILL_DIR, "--chaos", "10s", "--fault-kind", "rank_kill"),
        *("--command", "torchrun --nproc-per-node 1 t.py --out {{run_dir}}"),
        says=("rank_kill", "several processes", "--nproc-per-node 2"),
    ),
    row(
        "drill-chaos-command-above-the-cores",
        *("drill", *DRILL_DIR, "--chaos", "10s"),
        *("--command", "torchrun --nproc-per-node 100000 t.py --out {{run_dir}}"),
        says=("--nproc-per-node 100000", "CPU core", "nothing was started"),
    ),
    row(
        "drill-command-without-chaos",
        *("drill", *DRILL_DIR, "--command", "python t.py --out {{run_dir}}"),
        says=("--command", "--chaos"),
    ),
    # --- doctor ---------------------------------------------------------------------------
    row("doctor-recipe-not-utf8", "doctor", "{bad_recipe}", says=("UTF-8",)),
    row("doctor-seed-negative", "doctor", "{tiny}", "--set", "train.seed=-1", says=("train.seed",)),
    row("doctor-unknown-fault", "doctor", "{tiny}", "--inject", "bogus/r1", says=("--inject",)),
    row("doctor-nproc-zero", "doctor", "{tiny}", "--nproc", "0", says=("--nproc",)),
    # issue 26: local process counts (more processes than cores: refused before any start)
    row(
        "doctor-nproc-above-the-cores",
        *("doctor", "{tiny}", "--nproc", "100000"),
        says=("--nproc 100000", "CPU core", "--oversubscribe", "nothing was started"),
    ),
    # issue 23: dead ranks (a planted kill: never rank 0, at most one round that ends the group)
    row(
        "doctor-kill-rank-0",
        *("doctor", "{tiny}", "--inject", "kill/r0"),
        says=("kill/r0", "rank 0", "kill/rR with R >= 1"),
    ),
    row(
        "doctor-kill-and-hang",
        *("doctor", "{tiny}", "--nproc", "2", "--inject", "kill/r1", "--inject", "hang/r1"),
        says=("2 hang or kill rounds", "at most one"),
    ),
    # --- eval -----------------------------------------------------------------------------
    row("eval-device-foo", "eval", "{empty_run}", "--device", "foo", says=("--device",)),
    row("eval-spec-not-utf8", "eval", "{empty_run}", "--spec", "{spec_bad}", says=("UTF-8",)),
    row(
        "eval-regex-answer-invalid",
        *("eval", "{empty_run}", "--spec", "{spec_regex}"),
        says=("regular expression",),
    ),
    row("eval-target-missing", "eval", "{out}/nothing", says=NOT_EXIST),
    # issue 22: run record (another loop's record: the user's model factory and tokenizer)
    row(
        "eval-own-record-without-model",
        *("eval", "{own_record}"),
        says=("own loop record", "--model module:function", "--tokenizer", "--spec"),
    ),
    row(
        "eval-own-record-model-file-missing",
        *("eval", "{own_record}", "--model", "{inputs}/nothing.py:make"),
        *("--tokenizer", "{tokenizer}", "--spec", "python_next_line"),
        says=("model file", "does not exist"),
    ),
    row(
        "eval-own-record-without-checkpoints",
        *("eval", "{own_record}", "--model", "{inputs}/models/nanleak.py:make"),
        *("--tokenizer", "{tokenizer}", "--spec", "python_next_line"),
        says=("records no checkpoint",),
    ),
    # issue 26: values
    *[
        row(f"eval-mc-{name}", "eval", "{empty_run}", "--spec", f"{{spec_mc_{name}}}", says=says)
        for name, says in [
            ("gold_7", ("E117", "gold=7 with 2 choices", "example 0")),
            ("gold_negative", ("E117", "gold=-1 with 2 choices", "example 0")),
            ("gold_bool", ("line 1", "'gold' of type int")),
            ("choices_mixed", ("line 1", "choices", "strings")),
            ("choices_empty", ("line 1", "choices", "empty")),
        ]
    ],
    *[
        row(
            f"eval-max-examples-{n}",
            *("eval", "{empty_run}", "--max-examples", n),
            says=("--max-examples", "greater than or equal to"),
        )
        for n in ("-3", "0")
    ],
    # --- eval lint ------------------------------------------------------------------------
    row("eval-lint-spec-not-utf8", "eval", "lint", "{spec_bad}", says=("UTF-8",)),
    row("eval-lint-regex-answer-invalid", "eval", "lint", "{spec_regex}", exit=1, says=("E118",)),
    row(
        "eval-lint-spec-is-a-folder",
        *("eval", "lint", "{inputs}"),
        says=("is a folder",),
        never_says=NOT_EXIST,
    ),
    row("eval-lint-task-data-not-utf8", "eval", "lint", "{spec_bad_data}", says=("UTF-8",)),
    # issue 26: values
    *[
        row(f"eval-lint-mc-{name}", "eval", "lint", f"{{spec_mc_{name}}}", says=says)
        for name, says in [
            ("gold_bool", ("line 1", "'gold' of type int")),
            ("choices_mixed", ("line 1", "choices", "strings")),
            ("choices_empty", ("line 1", "choices", "empty")),
        ]
    ],
    # issue 26: readers (an eval spec's data stays in the spec's folder)
    row(
        "eval-lint-spec-data-outside-its-folder",
        *("eval", "lint", "{spec_outside}"),
        says=("'../x.jsonl' is outside the spec's folder",),
    ),
    # --- scale run (every problem is found before the first cell runs) ---------------------
    *[
        row(
            f"scale-run-{name}",
            *("scale", "run", "{tiny}", "--grid", "model.d_model=32,64", "--out", out),
            *("--csv", csv, "--set", "data.source={inputs}/missing"),
            **kw,
        )
        for name, out, csv, kw in [
            ("csv-is-recipe", "{out}/scale", "{tiny}", {"says": ("is the input",)}),
            ("csv-not-utf8", "{out}/scale", "{bad_csv}", {"says": ("UTF-8",)}),
            ("csv-wrong-columns", "{out}/scale", "{runs_csv}", {"says": ("columns",)}),
            ("csv-is-a-folder", "{out}/scale", "{out}", {"exit": 1, "says": cannot("{out}")}),
            (
                "out-under-a-file",
                "{afile}/scale",
                "{out}/s.csv",
                {"exit": 1, "says": cannot("{afile}")},
            ),
            (
                "csv-readonly",
                "{out}/scale",
                "{ro}/s.csv",
                {"exit": 1, "says": cannot("{ro}/s.csv"), "fault": "readonly"},
            ),
        ]
    ],
    # --- scale fit ------------------------------------------------------------------------
    row("scale-fit-csv-not-utf8", "scale", "fit", "{bad_csv}", *FIT, says=("UTF-8",)),
    row("scale-fit-csv-is-a-folder", "scale", "fit", "{inputs}", says=("is a folder",)),
    # issue 26: values (ten million refits would take 335 GiB)
    row(
        "scale-fit-boot-too-many",
        "scale",
        "fit",
        "{runs_csv}",
        "--boot",
        "10000000",
        says=("--boot", "10000"),
    ),
    row(
        "scale-fit-band-is-input",
        *("scale", "fit", "{runs_csv}", "--predict", "1e9,1e10", "--band", "{runs_csv}", *FIT),
        says=("is the input",),
    ),
    row(
        "scale-fit-plot-is-input",
        *("scale", "fit", "{runs_csv}", "--plot", "{runs_csv}", *FIT),
        says=("is the input",),
    ),
    row(
        "scale-fit-band-is-plot",
        *("scale", "fit", "{runs_csv}", "--predict", "1e9,1e10", *FIT),
        *("--band", "{out}/b.json", "--plot", "{out}/b.json"),
        says=("same file",),
    ),
    row(
        "scale-fit-seed-negative",
        *("scale", "fit", "{runs_csv}", "--seed", "-1", *FIT),
        says=("--seed",),
    ),
    row(
        "scale-fit-plot-without-predict-works",
        *("scale", "fit", "{runs_csv}", "--plot", "{out}/fit.png", *FIT),
        exit=0,
        says=("L(N, D)",),
        may_create=("out/fit.png",),
    ),
    row(
        "scale-fit-band-is-a-folder",
        *("scale", "fit", "{runs_csv}", "--predict", "1e9,1e10", "--band", "{out}", *FIT),
        exit=1,
        says=cannot("{out}"),
    ),
    row(
        "scale-fit-plot-readonly",
        *("scale", "fit", "{runs_csv}", "--plot", "{ro}/p.png", *FIT),
        exit=1,
        says=cannot("{ro}/p.png"),
        fault="readonly",
    ),
    row(
        "scale-fit-band-disk-full",
        *("scale", "fit", "{runs_csv}", "--predict", "1e9,1e10", "--band", "{out}/b.json", *FIT),
        exit=1,
        says=cannot("{out}/b.json"),
        fault="disk_full",
    ),
]


# --- the workspace ---------------------------------------------------------------------------

NAN_LEAK_MODEL = '''
import torch
from torch import nn


class NanLeak(nn.Module):
    """Position t sees position t+1 (a future-token leak), and one logit column is NaN."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)

    def forward(self, x):
        h = self.emb(x)
        h = h + torch.roll(h, -1, dims=1)
        logits = self.head(h)
        return torch.cat([torch.full_like(logits[..., :1], float("nan")), logits[..., 1:]], -1)


def make():
    torch.manual_seed(0)
    return NanLeak()
'''

# issue 26: values. Multiple-choice rows (with a context) the scorer cannot use.
MC_ROWS = {
    "gold_7": {"choices": ["4", "5"], "gold": 7},
    "gold_negative": {"choices": ["4", "5"], "gold": -1},
    "gold_bool": {"choices": ["4", "5"], "gold": True},
    "choices_mixed": {"choices": ["b", 5], "gold": 0},
    "choices_empty": {"choices": [], "gold": 0},
}

WORDS = ("the", "model", "reads", "every", "document", "of", "a", "corpus", "once", "and", "learns")


def _doc(i: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] + str(k % 7) for k in range(60))


class Workspace:
    """Fresh input files for one row: good and bad ones, a tiny recipe, small run dirs."""

    def __init__(self, root: Path, cache: Path) -> None:
        self.root = root
        root.mkdir()
        p: dict[str, Path] = {}
        inputs = p["inputs"] = root / "inputs"
        inputs.mkdir()
        p["out"] = root / "out"
        p["out"].mkdir()
        (p["out"] / "kept.jsonl").mkdir()  # a folder where `data filter` writes its kept file
        docs = [json.dumps({"id": f"d{i}", "text": _doc(i)}) for i in range(12)]
        p["good"] = _write(inputs / "good.jsonl", "\n".join(docs) + "\n")
        p["good_link"] = inputs / "good-link.jsonl"
        p["good_link"].symlink_to(p["good"])
        _write(inputs / "x.clusters.jsonl", "\n".join(docs) + "\n")
        _write(inputs / "y.rejected.jsonl", "\n".join(docs) + "\n")
        p["fake_parquet"] = _write(inputs / "fake.parquet", "not a parquet file\n")
        corpus = p["corpus"] = inputs / "corpus"
        corpus.mkdir()
        for i in range(20):
            _write(corpus / f"doc{i:02d}.txt", _doc(i) + "\n")
        p["afile"] = _write(inputs / "afile", "a file where a folder is expected\n")
        p["bad_recipe"] = _write(inputs / "bad.yaml", b"name: bad\ndescription: caf\xe9\n")
        recipe = {
            "name": "matrix",
            "data": {"source": str(corpus), "seq_len": 8, "val_fraction": 0.2},
            "tokenizer": {"vocab_size": 260},
            "model": {"n_layers": 1, "d_model": 16, "n_heads": 2},
            "train": {"max_steps": 2, "batch_size": 2, "warmup_steps": 0, "threads": 1},
            "preflight": {"enabled": False},
        }
        recipe["data"]["cache_dir"] = str(cache)
        p["tiny"] = _write(inputs / "tiny.yaml", yaml.safe_dump(recipe))
        runs = "params,tokens,loss\n" + "".join(
            f"{n:g},{d:g},{1.7 + 400 / n**0.34 + 410 / d**0.28:.5f}\n"
            for n in (1e6, 4e6, 1.6e7)
            for d in (1e8, 4e8, 1.6e9)
        )
        p["runs_csv"] = _write(inputs / "runs.csv", runs)
        p["bad_csv"] = _write(inputs / "bad.csv", b"params,tokens,loss\n1e6,1e8,3.\xff\n")
        p["metrics_bad_jsonl"] = _write(
            inputs / "metrics-bad.jsonl",
            b'{"step": 1, "loss": 2.0, "note": "\xff"}\n{"step": 2, "loss": 1.9}\n',
        )
        p["metrics_bad_csv"] = _write(inputs / "metrics-bad.csv", b"step,loss\n1,2.\xff\n")
        p["spec_bad"] = _write(inputs / "spec-bad.yaml", b"name: s\ndescription: \xe9\ntasks: []\n")
        _write(inputs / "regex.jsonl", json.dumps({"prompt": "2+2=", "answer": "(4"}) + "\n")
        spec = {"name": "r", "tasks": [{"name": "t", "type": "generation", "data": "regex.jsonl"}]}
        spec["tasks"][0]["match"] = "regex"
        p["spec_regex"] = _write(inputs / "spec-regex.yaml", yaml.safe_dump(spec))
        _write(inputs / "bad-data.jsonl", b'{"prompt": "caf\xe9", "answer": "x"}\n')
        spec["tasks"][0].update(data="bad-data.jsonl", match="exact")
        p["spec_bad_data"] = _write(inputs / "spec-bad-data.yaml", yaml.safe_dump(spec))
        # issue 26: values (an empty recipe; multiple-choice rows the scorer cannot use)
        p["empty_recipe"] = _write(inputs / "empty.yaml", "")
        for name, mc_row in MC_ROWS.items():
            _write(inputs / f"mc-{name}.jsonl", json.dumps({"context": "2+2=", **mc_row}) + "\n")
            task = {"name": "t", "type": "multiple_choice", "data": f"mc-{name}.jsonl"}
            mc_spec = {"name": "mc", "tasks": [task]}
            p[f"spec_mc_{name}"] = _write(inputs / f"spec-mc-{name}.yaml", yaml.safe_dump(mc_spec))
        models = p["models"] = inputs / "models"
        models.mkdir()
        _write(models / "nanleak.py", NAN_LEAK_MODEL)
        p["tokenizer"] = _tokenizer(inputs / "tokenizer.json")
        p["not_prepared"] = inputs / "not-prepared"
        p["not_prepared"].mkdir()
        _write(p["not_prepared"] / "notes.txt", "my own folder, not prepared data\n")
        p["empty_run"] = inputs / "empty-run"
        p["empty_run"].mkdir()
        metrics = "".join(
            json.dumps({"kind": "step", "step": s, "loss": 3.0 - s / 10, "grad_norm": 1.0}) + "\n"
            for s in range(1, 6)
        )
        for name in ("run_ok", "ro_run", "run_html_dir", "run_bad_recipe", "run_bad_metrics"):
            run = p[name] = root / name.replace("_", "-")
            run.mkdir()
            _write(run / "metrics.jsonl", metrics)
            _write(run / "recipe.yaml", yaml.safe_dump(recipe))
        # issue 22: another loop's run record (run.json of schema 2, no recipe, no checkpoint)
        own = p["own_record"] = root / "own-record"
        own.mkdir()
        info = {"schema_version": 2, "loop": "own loop", "environment": {"python": "3"}}
        _write(own / "run.json", json.dumps(info | {"sampler": None, "checkpoints": None}))
        _write(
            own / "metrics.jsonl",
            "".join(json.dumps({"kind": "step", "step": s, "loss": 1.0}) + "\n" for s in range(5)),
        )
        # A run whose prepared data is gone: its cache folder was never filled.
        no_data = {**recipe, "data": {**recipe["data"], "cache_dir": str(root / "no-cache")}}
        p["run_no_data"] = root / "run-no-data"
        p["run_no_data"].mkdir()
        _write(p["run_no_data"] / "metrics.jsonl", metrics)
        _write(p["run_no_data"] / "recipe.yaml", yaml.safe_dump(no_data))
        (p["run_html_dir"] / "report.html").mkdir()
        # A finished run (8 steps, no checkpoint) to record, and references to run against.
        run = p["finished_run"] = root / "finished-run"
        run.mkdir()
        _write(
            run / "recipe.yaml",
            yaml.safe_dump({**recipe, "train": {**recipe["train"], "max_steps": 8}}),
        )
        rows = [{"kind": "event", "step": 0, "event": "start", "env": {"python": "3.11.7"}}]
        rows += [
            {"kind": "step", "step": s, "loss": 5.0 - s / 10 + (s % 3) / 50, "batch_hash": f"b{s}"}
            for s in range(8)  # steps count from 0
        ]
        rows.append({"kind": "event", "step": 8, "event": "end"})
        _write(run / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        _write(run / "run.json", json.dumps({"schema_version": 2}))  # a record counted from 0
        from trainguard.config.identity import curve_recipe
        from trainguard.config.load import recipe_to_dict, validate_recipe
        from trainguard.reference.curve import ReferenceCurve

        keys = curve_recipe(recipe_to_dict(validate_recipe(recipe)))
        other = ReferenceCurve(  # the tiny recipe at another learning rate
            recipe_name="matrix",
            recipe_hash="0" * 16,
            recipe={**keys, "train.lr": 0.5},
            env={},
            steps=list(range(8)),
            loss=[5.0 - s / 10 for s in range(1, 9)],
            batch_hash=[None] * 8,
        )
        p["ref_other"] = other.save(inputs / "other.ref.json")
        text = p["ref_other"].read_text()
        p["ref_truncated"] = _write(inputs / "truncated.ref.json", text[: len(text) // 2])
        _write(p["run_bad_recipe"] / "recipe.yaml", b"name: matrix\ndescription: caf\xe9\n")
        _write(
            p["run_bad_metrics"] / "metrics.jsonl", b'{"kind": "step", "step": 1, "x": "\xff"}\n'
        )
        # issue 25: data check-chat (a tokenizer folder as save_pretrained writes it)
        chat = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
        p["chat_good"] = _write(inputs / "chat.jsonl", json.dumps({"messages": chat}) + "\n")
        p["chat_not_json"] = _write(
            inputs / "chat-not-json.jsonl", json.dumps({"messages": chat}) + "\n{messages\n"
        )
        p["chat_not_utf8"] = _write(inputs / "chat-not-utf8.jsonl", b'{"prompt": "caf\xe9"}\n')
        p["chat_empty"] = _write(inputs / "chat-empty.jsonl", "\n")
        p["chat_no_fields"] = _write(inputs / "chat-no-fields.jsonl", '{"id": 1}\n')
        p["chat_template_bad"] = _write(inputs / "bad.jinja", "{% for m in messages %}{{ m }}")
        for name, config in (
            ("chat_tok", json.dumps({"chat_template": "{{ messages }}"})),
            ("chat_tok_no_template", json.dumps({"eos_token": "<|endoftext|>"})),
            ("chat_tok_bad_config", "{not json"),
        ):
            folder = p[name] = inputs / name.replace("_", "-")
            folder.mkdir()
            _tokenizer(folder / "tokenizer.json")
            _write(folder / "tokenizer_config.json", config)
        p["chat_tok_broken"] = inputs / "chat-tok-broken"
        p["chat_tok_broken"].mkdir()
        _write(p["chat_tok_broken"] / "tokenizer.json", "{not json")
        p["ro"] = root / "ro"
        p["ro"].mkdir()
        # issue 26: ckptio. Run dirs with a link where the run writes its own file.
        p["outside"] = _write(inputs / "outside.txt", "not trainguard's to write\n")
        for name, file in (
            ("run_metrics_link", "metrics.jsonl"),
            ("run_tokenizer_link", "tokenizer.json"),
            ("run_quarantine_link", "checkpoints/quarantine"),
            ("run_report_link", "report.html"),
        ):
            run = p[name] = root / name.replace("_", "-")
            (run / file).parent.mkdir(parents=True)
            (run / file).symlink_to(p["outside"] if "." in file else inputs)
        _write(p["run_report_link"] / "metrics.jsonl", metrics)
        _write(p["run_report_link"] / "recipe.yaml", yaml.safe_dump(recipe))
        # A step folder whose re-signed manifest lists nothing; state.json links out.
        from runhelpers import forge_manifest

        p["step_unlisted"] = inputs / "step-3"
        p["step_unlisted"].mkdir()
        _write(p["step_unlisted"] / "manifest.json", forge_manifest(3, {}))
        (p["step_unlisted"] / "state.json").symlink_to(p["outside"])
        # issue 26: readers (damaged metric rows, markup in names, FIFOs, links and paths out)
        deep = '{"kind": "step", "step": 3, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
        big = '{"kind": "step", "step": 3, "loss": ' + "9" * 400 + ', "batch_hash": "b3"}\n'
        for name, bad in (("deep", deep), ("big", big)):
            _write(inputs / f"metrics-{name}.jsonl", metrics + bad)
            p[f"metrics_{name}"] = inputs / f"metrics-{name}.jsonl"
            run = p[f"run_{name}"] = root / f"run-{name}"
            run.mkdir()
            _write(run / "metrics.jsonl", metrics + bad)
            _write(run / "recipe.yaml", yaml.safe_dump(recipe))
            run = p[f"finished_{name}"] = root / f"finished-{name}"
            shutil.copytree(p["finished_run"], run)
            lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
            # after step 3's row (the start event, then steps 0-3): the last row of step 3
            _write(run / "metrics.jsonl", "".join(lines[:5]) + bad + "".join(lines[5:]))
        run = p["run_markup"] = root / "m[" / "b]"  # the run dir `m[/b]`: markup, if read so
        shutil.copytree(p["run_ok"], run)
        rows = [{"step": s, "[/x]": 3.0 - s / 100} for s in range(1, 40)]
        rows[20]["[/x]"] = "nan"
        p["metrics_markup"] = _write(
            inputs / "metrics-markup.jsonl", "".join(json.dumps(r) + "\n" for r in rows)
        )
        p["fifo"] = inputs / "metrics.fifo.jsonl"
        os.mkfifo(p["fifo"])
        p["prepared_fifo"] = inputs / "prepared-fifo"
        shutil.copytree(_prepared_folder(cache), p["prepared_fifo"])
        (p["prepared_fifo"] / "train-00000.bin").unlink()
        os.mkfifo(p["prepared_fifo"] / "train-00000.bin")
        _write(models / "exits.py", "import sys\n\n\ndef make():\n    sys.exit(7)\n")
        _write(inputs / "secret.txt", "a file outside the source folder " + _doc(3) + "\n")
        linked = p["corpus_linked"] = inputs / "linked"
        shutil.copytree(corpus, linked)
        (linked / "zz-secret.txt").symlink_to(inputs / "secret.txt")
        (inputs / "specs").mkdir()
        spec = {"name": "o", "tasks": [{"name": "t", "type": "generation", "data": "../x.jsonl"}]}
        _write(inputs / "x.jsonl", json.dumps({"prompt": "2+2=", "answer": "4"}) + "\n")
        p["spec_outside"] = _write(inputs / "specs" / "out.yaml", yaml.safe_dump(spec))
        self.paths = p

    def add_tiny_run(self, finished: Path, alter: str | None) -> None:
        """`{tiny_run}`: a copy of the finished 12-step run (checkpoints 4, 8, 12), altered by
        `TINY_RUNS[alter]`; `{tiny_run_recipe}`: its recipe, to resume it with."""
        run = self.paths["tiny_run"] = self.root / "tiny-run"
        shutil.copytree(finished, run, symlinks=True)
        recipe = self.paths["inputs"] / "tiny-run.yaml"
        self.paths["tiny_run_recipe"] = _write(recipe, (run / "recipe.yaml").read_bytes())
        if alter is not None:
            TINY_RUNS[alter](run, self.root)

    def format(self, arg: str) -> str:
        return arg.format(**{k: str(v) for k, v in self.paths.items()})

    def snapshot(self) -> dict[str, str]:
        """{relative path: sha256} of every file and symlink (bytecode caches aside)."""
        out = {}
        for path in sorted(self.root.rglob("*")):
            rel = path.relative_to(self.root).as_posix()
            if "__pycache__" in rel or (path.is_dir() and not path.is_symlink()):
                continue
            if path.is_symlink():
                data = os.readlink(path).encode()
            elif not path.is_file():  # a FIFO: never read (it would block)
                data = str(path.stat().st_mode).encode()
            else:
                data = path.read_bytes()
            out[rel] = hashlib.sha256(data).hexdigest()
        return out

    def folders(self) -> set[str]:
        return {
            p.relative_to(self.root).as_posix()
            for p in self.root.rglob("*")
            if p.is_dir() and not p.is_symlink() and "__pycache__" not in p.parts
        }


def _damage(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[-100] ^= 0xFF
    file.write_bytes(bytes(data))


def _data_changed(run: Path, root: Path) -> None:
    """The last checkpoint says it was trained on other data (its manifest re-signed, as
    anyone who can write the folder can): the resume stops with D104."""
    from trainguard.checkpoint.manifest import MANIFEST, build_manifest, manifest_bytes

    folder = run / "checkpoints" / "step-12"
    old = json.loads((folder / MANIFEST).read_text())
    old["meta"]["data_identity"]["tokenizer_hash"] = "0" * 32
    (folder / MANIFEST).unlink()
    (folder / MANIFEST).write_bytes(manifest_bytes(build_manifest(folder, 12, old["meta"])))


def _moved_out(run: Path, root: Path, name: str) -> None:
    """`name` in the run dir becomes a symlink to a folder outside it (its content moved
    there, if it existed)."""
    target = root / "elsewhere" / name.replace("/", "-")
    target.parent.mkdir(exist_ok=True)
    if (run / name).exists():
        (run / name).rename(target)
    else:
        target.mkdir()
    (run / name).symlink_to(target)


def _no_steps(run: Path, root: Path) -> None:
    for folder in (run / "checkpoints").glob("step-*"):
        shutil.rmtree(folder)


def _all_damaged(run: Path, root: Path) -> None:
    for folder in (run / "checkpoints").glob("step-*"):
        _damage(folder / "state.safetensors")


def _quarantine_file(run: Path, root: Path) -> None:
    _write(run / "checkpoints" / "quarantine", "mine\n")
    _damage(run / "checkpoints" / "step-12" / "state.safetensors")  # to be set aside


def _quarantine_symlink(run: Path, root: Path) -> None:
    _moved_out(run, root, "checkpoints/quarantine")
    _damage(run / "checkpoints" / "step-12" / "state.safetensors")  # to be set aside


# How `{tiny_run}` is altered for a row (`Row.tiny_run`): each is a run dir `run` must refuse.
TINY_RUNS = {
    "no_steps": _no_steps,
    "no_root": lambda run, root: shutil.rmtree(run / "checkpoints"),
    "all_damaged": _all_damaged,
    "data_changed": _data_changed,
    "step_12_symlink": lambda run, root: _moved_out(run, root, "checkpoints/step-12"),
    "step_16_file": lambda run, root: _write(run / "checkpoints" / "step-16", "mine\n"),
    "quarantine_file": _quarantine_file,
    "quarantine_symlink": _quarantine_symlink,
    "attic_symlink": lambda run, root: _moved_out(run, root, "attic"),
    "old_format": lambda run, root: _old_format(run),
}


def _old_format(run: Path) -> None:
    """Only a step of the previous release's run format (tests/fixtures/old_run, 912c6b4)."""
    for folder in (run / "checkpoints").glob("step-*"):
        shutil.rmtree(folder)
    old = Path(__file__).parent / "fixtures" / "old_run" / "checkpoints" / "step-4"
    shutil.copytree(old, run / "checkpoints" / "step-4")


def _write(path: Path, data: str | bytes) -> Path:
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


@functools.cache
def _tokenizer_json() -> str:
    from trainguard.data.tokenizer import train_tokenizer

    return train_tokenizer((_doc(i) for i in range(20)), 300, 2).to_str()


def _tokenizer(path: Path) -> Path:
    return _write(path, _tokenizer_json())


@functools.cache
def _prepared_folder(cache: Path) -> Path:
    """A real prepared data folder, built once per module (under the module's data cache)."""
    from trainguard.config.schema import DataConfig, TokenizerConfig
    from trainguard.data.prepare import prepare_data

    source = cache / "prepared-source"
    source.mkdir()
    for i in range(20):
        _write(source / f"doc{i:02d}.txt", _doc(i) + "\n")
    data = DataConfig(source=str(source), seq_len=8, val_fraction=0.2, cache_dir=str(cache))
    return prepare_data(data, TokenizerConfig(vocab_size=260), progress=False).dir


# --- faults ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _readonly(folder: Path) -> Iterator[None]:
    """`folder` refuses new files: chmod for users, the immutable flag for root (who ignores
    permissions). Skips the row where neither works (e.g. no chattr on this system)."""
    if os.geteuid() == 0:
        done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        undo = ["chattr", "-i", str(folder)]
    else:
        folder.chmod(0o555)
        done, undo = True, None
    try:
        probe = folder / ".probe"
        try:
            probe.write_bytes(b"")
        except OSError:
            pass
        else:
            probe.unlink()
            done = False
        if not done:
            pytest.skip(f"cannot make {folder} read-only here")
        yield
    finally:
        if undo:
            subprocess.run(undo, capture_output=True)
        folder.chmod(0o755)


@contextlib.contextmanager
def _disk_full(limit: int = 1024) -> Iterator[None]:
    """A real kernel limit: writes past `limit` bytes fail with EFBIG, as a full disk fails
    with ENOSPC. Only the soft limit moves, so it is restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the file size limit needs the main thread (SIGXFSZ)")
    import matplotlib.pyplot  # noqa: F401  (its font cache is written on first import)

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)


@contextlib.contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    with open(run_dir / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fault(row: Row, ws: Workspace, monkeypatch: pytest.MonkeyPatch):
    if row.fault == "readonly":
        target = ws.paths["ro_run"] if "{ro_run}" in row.args else ws.paths["ro"]
        return _readonly(target)
    if row.fault == "disk_full":
        return _disk_full(row.disk_limit)
    if row.fault == "locked":
        return _locked(ws.paths.get("tiny_run", ws.paths["run_ok"]))
    if row.fault == "no_credentials":
        for var in list(os.environ):
            if var.startswith("AWS_"):
                monkeypatch.delenv(var)
        missing = str(ws.root / "no-aws-config")
        monkeypatch.setenv("AWS_CONFIG_FILE", missing)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", missing)
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no metadata-server lookups
        return contextlib.nullcontext()
    assert row.fault is None, row.fault
    return contextlib.nullcontext()


# --- the test --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("matrix-cache")


@pytest.mark.parametrize("case", [r.param() for r in ROWS])
def test_bad_input(
    case: Row,
    tmp_path: Path,
    data_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    assert case.says, "every row names the words its message must contain"
    ws = Workspace(tmp_path / "ws", data_cache)
    if any("{tiny_run" in a for a in case.args):  # only these rows need the finished run
        ws.add_tiny_run(request.getfixturevalue("finished_tiny_run"), case.tiny_run)
    before, folders = ws.snapshot(), ws.folders()
    args = [ws.format(a) for a in case.args]
    monkeypatch.chdir(ws.root)  # a default output path (runs/NAME) lands where it is seen
    with _fault(case, ws, monkeypatch):
        res = CliRunner().invoke(app, args)
    output = " ".join(res.output.split())
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        f"traceback: {res.exception!r}\n{output}"
    )
    assert "Traceback" not in res.output, output
    assert res.exit_code == case.exit, output
    for words in map(ws.format, case.says):
        assert words.lower() in output.lower(), f"{words!r} not in: {output}"
    for words in case.never_says:
        assert words.lower() not in output.lower(), f"{words!r} in: {output}"
    after = ws.snapshot()
    changed = [k for k, v in before.items() if after.get(k) != v]
    assert not changed, f"inputs changed or removed: {changed}"
    created = [
        k
        for k in sorted(set(after) | (ws.folders() - folders))
        if k not in before
        and k not in folders
        and not any(fnmatch.fnmatch(k, g) for g in case.may_create)
    ]
    assert not created, f"written despite the error: {created}"


def test_every_command_has_a_row() -> None:
    """Every command `trainguard --help` lists (and every subcommand) is in the table."""
    import typer.main

    group = typer.main.get_command(app)

    def names(cmd, prefix=()) -> set[tuple[str, ...]]:
        subs = getattr(cmd, "commands", None)
        if not subs:
            return {prefix}
        out = set()
        for name, sub in subs.items():
            out |= names(sub, (*prefix, name))
        return out

    commands = names(group)
    covered = set()
    for r in ROWS:
        for n in range(1, 4):
            covered.add(tuple(r.args[:n]))
        if r.args[0] == "eval" and r.args[1] != "lint":
            covered.add(("eval", "run"))  # `eval PATH` is `eval run PATH`
    missing = sorted(" ".join(c) for c in commands if c not in covered)
    assert not missing, f"commands without a bad-input row: {missing}"


def test_readonly_fault_really_refuses_writes(tmp_path: Path) -> None:
    """The harness itself: the read-only folder refuses a file, and is writable afterwards."""
    folder = tmp_path / "ro"
    folder.mkdir()
    with _readonly(folder), pytest.raises(OSError) as e:
        (folder / "x").write_bytes(b"x")
    assert e.value.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
    (folder / "x").write_bytes(b"x")


def test_scale_run_csv_on_a_full_disk_keeps_the_csv_whole(
    tiny_recipe: Path, finished_tiny_run: Path, tmp_path: Path
) -> None:
    """`scale run --csv` whose append cannot be written (the disk is full once the CSV would
    grow): exit 1 naming the CSV, its earlier rows byte-identical, no partial or temporary
    file. A real gating run fills the cell first (the prepared data is cached by the finished
    run); the CSV, padded with earlier rows, is larger than any file the cell writes, so only
    the append hits `_disk_full`'s limit."""
    csv_path = tmp_path / "runs.csv"
    rows = "".join(f"old{i},1000,2000,3.0,{tmp_path}/old{i}\n" for i in range(40_000))
    csv_path.write_text("name,params,tokens,loss,run_dir\n" + rows, encoding="utf-8")
    before = csv_path.read_bytes()
    out = tmp_path / "scale"
    args = ["scale", "run", str(tiny_recipe), "--grid", "model.d_model=16", "--out", str(out)]
    args += ["--csv", str(csv_path), "--set", "train.max_steps=2", "--set", "evals.max_examples=8"]
    with _disk_full(limit=len(before)):
        res = CliRunner().invoke(app, args)
    output = " ".join(res.output.split())
    assert res.exception is None or isinstance(res.exception, SystemExit), output
    assert "Traceback" not in res.output, output
    assert res.exit_code == 1, output
    assert "cannot" in output.lower() and str(csv_path) in output, output
    assert csv_path.read_bytes() == before  # the earlier rows, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.csv", "scale", "tiny.yaml"]
    sizes = [p.stat().st_size for p in (out / "d_model=16").rglob("*") if p.is_file()]
    assert (out / "d_model=16" / "metrics.jsonl").is_file() and max(sizes) < len(before)


# --- the matrix in docs/trust.md ------------------------------------------------------------------
TRUST_DOC = Path(__file__).resolve().parents[1] / "docs" / "trust.md"
_BEGIN, _END = "<!-- matrix-summary:begin -->", "<!-- matrix-summary:end -->"


def matrix_summary() -> str:
    """The table docs/trust.md shows: rows per command, and how many exit 1 or arrange a fault."""
    by_command: dict[str, list[Row]] = {}
    for r in ROWS:
        words = [a for a in r.args[:2] if not a.startswith("{") and not a.startswith("-")]
        if words[0] not in ("data", "eval", "scale", "reference") or len(words) < 2:
            words = words[:1]
        if words == ["eval"] or (words[0] == "eval" and words[1] != "lint"):
            words = ["eval", "run"]
        by_command.setdefault(" ".join(words), []).append(r)
    lines = [
        f"{len(ROWS)} rows over {len(by_command)} commands "
        f"(regenerate: `python tests/test_bad_input_matrix.py`).",
        "",
        "| command | rows | exit 1 (a finding or a write that failed) | with a fault arranged |",
        "|---|---|---|---|",
    ]
    for name in sorted(by_command):
        rows = by_command[name]
        ones = sum(r.exit == 1 for r in rows)
        faults = sum(r.fault is not None for r in rows)
        lines.append(f"| `{name}` | {len(rows)} | {ones} | {faults} |")
    return "\n".join(lines)


def test_trust_doc_states_the_matrix_as_it_is() -> None:
    text = TRUST_DOC.read_text(encoding="utf-8")
    inside = text.split(_BEGIN, 1)[1].split(_END, 1)[0].strip()
    assert inside == matrix_summary(), "run `python tests/test_bad_input_matrix.py`"


if __name__ == "__main__":
    text = TRUST_DOC.read_text(encoding="utf-8")
    head, rest = text.split(_BEGIN, 1)
    TRUST_DOC.write_text(
        f"{head}{_BEGIN}\n{matrix_summary()}\n{_END}{rest.split(_END, 1)[1]}", encoding="utf-8"
    )
