"""The Spark session every Spark engine uses, and executor errors turned back into ours.

Master: the caller's `master`, else `$SPARK_MASTER`, else `local[*]`; every other setting comes
from the usual Spark configuration (spark-defaults.conf, `PYSPARK_SUBMIT_ARGS`). A running
session (a notebook's, the test suite's) is reused.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from trainguard.errors import BadInputError, DataError


def get_spark(master: str | None = None) -> Any:
    """A SparkSession for `master` (or $SPARK_MASTER, or local[*])."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise BadInputError(
            "--engine spark needs PySpark, which is not installed",
            "pip install 'trainguard[spark]' (and Java 17), or use --engine local",
        ) from None
    # Executors must run this interpreter, which has numpy, xxhash and trainguard.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = master or os.environ.get("SPARK_MASTER") or "local[*]"
    return (
        SparkSession.builder.appName("trainguard")
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )


def bad_input_from(exc: BaseException) -> DataError | None:
    """A DataError raised on an executor arrives wrapped in Java's exception text."""
    m = re.search(r"DataError: (.+)", str(exc))
    if m is None:
        return None
    fix = re.search(r"fix: (.+)", str(exc))
    return DataError(m.group(1).strip(), fix.group(1).strip() if fix else "fix that record")


@contextlib.contextmanager
def executor_errors() -> Iterator[None]:
    """Re-raise an executor's DataError (bad input: exit 2) as itself, not as a Java error."""
    try:
        yield
    except DataError:
        raise
    except Exception as e:
        err = bad_input_from(e)
        if err is None:
            raise
        raise err from None
