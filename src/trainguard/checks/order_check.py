"""A user's own loader order, checked for how well it mixes sources (D301/D302) before any
compute is spent: `trainguard data order-check`.

The order is a file of sample ids (one per line; `ID<TAB>SOURCE` lines carry their source) or a
Python sampler, `module:factory`: the factory is called without arguments and returns an
iterable of sample ids (a `torch.utils.data.Sampler`, a list, a generator) or of `(id, source)`
pairs. The first `count` samples are read, so an infinite sampler is fine. Bare integer ids get
their sources from a labels file (line i: the source of sample i) or from a trainguard prepared
folder (the document a sample starts in, as `trainguard run` labels its own order). The
statistics are those of `shuffle_quality`.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.checks.shuffle_quality import shuffle_quality
from trainguard.errors import BadInputError
from trainguard.findings import Finding
from trainguard.util.inputs import read_text, require_file

_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _file_samples(path: Path) -> Iterator[tuple[str, str | None]]:
    require_file(
        path,
        "order file",
        "give a file of sample ids (one per line) or a Python sampler as module:factory",
    )
    with open(path, encoding="utf-8", errors="strict") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            ident, tab, source = line.partition("\t")
            if tab and not source.strip():
                raise BadInputError(
                    f"{path}:{lineno} has a tab but no source after it",
                    "write `ID` or `ID<TAB>SOURCE` on every line",
                )
            yield ident.strip(), (source.strip() if tab else None)


def _factory_samples(spec: str) -> Iterator[tuple[Any, str | None]]:
    module_name, _, attr = spec.partition(":")
    # Like `python -m`: a module in the current folder is importable.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except SystemExit as e:  # no Exception: its status would leave the exit table
        raise BadInputError(
            f"importing {module_name!r} for the sampler {spec!r} called exit({e.code!r})",
            "the module must not exit when imported (guard it with `if __name__ == '__main__':`)",
        ) from None
    except Exception as e:  # noqa: BLE001 - the user's module: report, never a traceback
        raise BadInputError(
            f"cannot import {module_name!r} for the sampler {spec!r}: {type(e).__name__}: {e}",
            "give `module:factory` of an importable module (set PYTHONPATH or run from its folder)",
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise BadInputError(
            f"{module_name!r} has no callable {attr!r}",
            "name a function that returns the sampler (an iterable of sample ids)",
        )
    try:
        sampler = factory()
        items: Iterable[Any] = iter(sampler)
    except SystemExit as e:
        raise BadInputError(
            f"the sampler factory {spec!r} called exit({e.code!r}) instead of returning",
            "make the factory return the sampler (an iterable of ids), without exiting",
        ) from None
    except Exception as e:  # noqa: BLE001
        raise BadInputError(
            f"the sampler factory {spec!r} failed: {type(e).__name__}: {e}",
            "make the factory callable without arguments and return an iterable of ids",
        ) from None
    for item in items:
        if isinstance(item, tuple | list) and len(item) == 2:
            yield item[0], str(item[1])
        else:
            yield item, None


def read_order(order: str, count: int) -> tuple[list[Any], list[str] | None]:
    """The first `count` (ids, sources or None) of a file of ids or a `module:factory`."""
    # A `module:factory` that is not also a path is a sampler; anything else is a file of ids.
    if _FACTORY.match(order) and not Path(order).exists():
        samples: Iterator[tuple[Any, str | None]] = _factory_samples(order)
    else:
        samples = _file_samples(Path(order))
    try:
        taken = list(islice(samples, count))
    except BadInputError:
        raise
    except UnicodeDecodeError as e:
        raise BadInputError(
            f"{order} is not UTF-8 text ({e.reason})", "write ids as text"
        ) from None
    except Exception as e:  # noqa: BLE001 - a sampler failing while it iterates
        raise BadInputError(
            f"reading the order {order!r} failed: {type(e).__name__}: {e}",
            "check the sampler or the ids file",
        ) from None
    if not taken:
        raise BadInputError(f"the order {order!r} holds no sample", "give at least one id")
    ids = [i for i, _ in taken]
    sources = [s for _, s in taken]
    if all(s is not None for s in sources):
        return ids, sources  # type: ignore[return-value]
    if any(s is not None for s in sources):
        raise BadInputError(
            f"some samples of {order!r} carry a source and others do not",
            "give every sample its source, or none (and pass --sources or --prepared)",
        )
    return ids, None


def _int_ids(ids: list[Any], n: int, where: str) -> np.ndarray:
    try:
        arr = np.array([int(i) for i in ids], dtype=np.int64)
    except (TypeError, ValueError):
        bad = next(i for i in ids if not str(i).lstrip("-").isdigit())
        raise BadInputError(
            f"sample id {bad!r} is not an integer, so it cannot index {where}",
            "give integer sample ids, or sources with the ids (ID<TAB>SOURCE or (id, source))",
        ) from None
    out = arr[(arr < 0) | (arr >= n)]
    if len(out):
        raise BadInputError(
            f"sample id {int(out[0])} is outside [0, {n}) of {where}",
            "check that the ids index the same dataset",
        )
    return arr


def labels_file(ids: list[Any], path: Path) -> list[str]:
    """Sources of integer ids from a file whose line i is the source of sample i."""
    labels = read_text(
        path, "sources file", "one source per line: line i is the source of sample i"
    ).splitlines()
    arr = _int_ids(ids, len(labels), f"the {len(labels)} lines of {path}")
    return [labels[i] for i in arr.tolist()]


def labels_prepared(ids: list[Any], folder: Path, seq_len: int) -> list[str]:
    """Sources of integer ids as samples of a prepared folder's train split (verified)."""
    from trainguard.data.prepare import PreparedData

    if not folder.is_dir():
        raise BadInputError(
            f"prepared folder {folder} does not exist",
            "give the folder `trainguard data prepare` printed (it holds manifest.json)",
        )
    data = PreparedData.from_dir(folder)
    n = int(data.train.num_samples(seq_len))
    arr = _int_ids(ids, n, f"the {n} train samples of {folder} at seq_len {seq_len}")
    return data.train.sample_sources(arr, seq_len)


def order_check(labels: list[str], window: int | None = None) -> tuple[list[Finding], dict]:
    """D301/D302 and the statistics for an order's source labels."""
    return shuffle_quality(labels, window=window)


def check_order(
    order: str,
    count: int = 20000,
    window: int | None = None,
    sources: Path | None = None,
    prepared: Path | None = None,
    seq_len: int | None = None,
) -> tuple[list[Finding], dict]:
    """`trainguard data order-check`: (findings, stats) of the first `count` samples of
    `order`, their sources from the order itself, from `sources` (a labels file) or from a
    `prepared` folder read at `seq_len`. Bad options are bad input (exit 2) before any read."""
    if count < 2:
        raise BadInputError(f"--count {count} must be at least 2", "use the default 20000")
    if window is not None and window < 2:
        raise BadInputError(f"--window {window} must be at least 2", "or omit it")
    if sources is not None and prepared is not None:
        raise BadInputError("--sources and --prepared both name the sources", "give one of them")
    if prepared is not None and (seq_len is None or seq_len < 1):
        raise BadInputError(
            "--prepared needs --seq-len", "pass the recipe's data.seq_len, e.g. --seq-len 128"
        )
    ids, labels = read_order(order, count)
    if labels is None:
        if sources is not None:
            labels = labels_file(ids, sources)
        elif prepared is not None:
            labels = labels_prepared(ids, prepared, int(seq_len or 0))
        else:
            raise BadInputError(
                f"the samples of {order!r} carry no source",
                "pass --sources (line i: the source of sample i) or --prepared DIR "
                "--seq-len N, or give ID<TAB>SOURCE lines / (id, source) pairs",
            )
    return order_check(labels, window)
