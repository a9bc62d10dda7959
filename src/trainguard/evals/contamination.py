"""Eval specs against training data: the glue between eval specs and the contamination check
(`dedup/contamination.py`), shared by `trainguard data contamination` and `run`'s pre-flight.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from trainguard.data.corpus import Document, iter_documents, split_of
from trainguard.dedup.contamination import (
    CONTAINMENT,
    EDIT_CONTAINMENT,
    NGRAM,
    ContaminationReport,
    EvalTask,
    find_contamination,
)
from trainguard.errors import BadInputError
from trainguard.evals.spec import example_text, load_spec, task_rows


def eval_tasks(
    specs: Sequence[str], data: Any | None = None, max_examples: int | None = None
) -> list[EvalTask]:
    """Every task of `specs` with its examples' texts; `spec` is named as given. Builtin tasks
    are generated from `data` (a DataConfig), which they need."""
    out = []
    for name in specs:
        spec = load_spec(name)
        for task in spec.tasks:
            if task.builtin is not None and data is None:
                raise BadInputError(
                    f"task {task.name!r} of {name} is generated from the held-out documents of "
                    "the training data, and none are held out",
                    "pass --val-fraction with the recipe's data.val_fraction (0.05 by default)",
                )
            rows = task_rows(spec, task, data, max_examples)
            out.append(EvalTask(str(name), task.name, [example_text(task, r) for r in rows]))
    return out


def training_documents(source: str, text_field: str, val_fraction: float) -> Iterator[Document]:
    """The documents `trainguard run` trains on: the source minus its held-out split."""
    for doc in iter_documents(source, text_field):
        if val_fraction <= 0 or split_of(doc.id, val_fraction) == "train":
            yield doc


def check_contamination(
    specs: Sequence[str],
    source: str,
    text_field: str = "text",
    val_fraction: float = 0.0,
    max_examples: int | None = None,
    ngram: int = NGRAM,
    containment: float = CONTAINMENT,
    edit_containment: float = EDIT_CONTAINMENT,
    engine: str = "local",
    master: str | None = None,
) -> ContaminationReport:
    """Contamination of the eval `specs` by the training documents of `source`.

    Builtin tasks are generated from the held-out split of `source` (as `run` generates them).
    `engine="spark"` scans the source with Spark (`dedup/contamination_spark.py`): same report.
    """
    from trainguard.config.schema import DataConfig

    data = None
    if val_fraction > 0:
        data = DataConfig(source=source, text_field=text_field, val_fraction=val_fraction)
    tasks = eval_tasks(specs, data, max_examples)
    if engine == "spark":
        from trainguard.dedup.contamination_spark import find_contamination_spark

        return find_contamination_spark(
            tasks,
            source,
            text_field,
            val_fraction,
            ngram=ngram,
            containment=containment,
            edit_containment=edit_containment,
            master=master,
        )
    docs = training_documents(source, text_field, val_fraction)
    return find_contamination(
        tasks, docs, ngram=ngram, containment=containment, edit_containment=edit_containment
    )
