"""A package's public names imported on first use (PEP 562's module `__getattr__`).

`import trainguard` and `import trainguard.doctor` stay cheap: a run imports what it uses, and a
restart does not pay for the parts it never touches (docs/benchmarks.md, the restart row).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports `names[name]` (a module path) when
    `name` is first looked up, and returns its attribute of that name."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
