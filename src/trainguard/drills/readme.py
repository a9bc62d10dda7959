"""The fire-drill matrix in docs/drills.md, held between two markers and regenerated from the code.

    python -m trainguard.drills.readme docs/drills.md    # runs every drill (minutes), rewrites it

tests/test_docs.py checks that page against the code the way docs/codes.md is checked: the
drills it lists are the registered ones, in order, and the pre-flight precision drill's row is
what the code renders (default run); the whole matrix is rendered again and compared in the slow
set (tests/test_drill.py). Host names and timings change from machine to machine, so both sides
go through `normalise` first; the losses do not (CPU runs are deterministic for a given torch
build and CPU kernel set, docs/drills.md).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

BEGIN = "<!-- drill-matrix:begin (python -m trainguard.drills.readme docs/drills.md) -->"
END = "<!-- drill-matrix:end -->"

_HOST = re.compile(r"\b(rank \d+) \([^()]*\)")  # rank 1 (vm) -> rank 1 (HOST)
_ELAPSED = re.compile(r"(\(\w+, )\d+(?:\.\d+)?s\)")  # exit 3 (forward, 5.18s)
_SCORE = re.compile(r"\bscore \d+(?:\.\d+)?")  # a straggler's measured slowness
_TOOK = re.compile(r"\bin \d+(?:\.\d+)?s\b")  # doctor exit 1 in 18.1s


def normalise(markdown: str) -> str:
    """The matrix with what depends on the machine replaced: host names, measured seconds and
    straggler scores. Everything else (codes, steps, actions, losses) is compared as it is."""
    text = _HOST.sub(r"\1 (HOST)", markdown)
    text = _ELAPSED.sub(r"\1Ts)", text)
    text = _TOOK.sub("in Ts", text)
    return _SCORE.sub("score S", text)


def table_in(readme: str) -> str:
    """The markdown between the markers (ValueError naming them when they are missing)."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no drill matrix between {BEGIN!r} and {END!r}")
    return readme[start + len(BEGIN) : end].strip("\n") + "\n"


def with_table(readme: str, table: str) -> str:
    """`readme` with the markdown between the markers replaced by `table`."""
    table_in(readme)  # the markers must be there
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table.strip()}\n{END}{tail}"


def row_for(table: str, fault: str) -> str | None:
    """The row of the drill whose registered fault is `fault` (its first cell is the fault,
    maybe followed by the fault plan in parentheses), or None."""
    for line in table.splitlines()[2:]:
        cell = line.split(" | ", 1)[0].removeprefix("| ")
        if cell == fault or cell.startswith(f"{fault} ("):
            return line
    return None


def main(argv: list[str]) -> int:
    from trainguard.drills.matrix import matrix_markdown, verdict
    from trainguard.drills.runner import DrillContext, cleanup
    from trainguard.drills.scenarios import run_drills

    path = Path(argv[0] if argv else "docs/drills.md")
    readme = path.read_text(encoding="utf-8")
    table_in(readme)  # fail before minutes of drills, not after
    ctx = DrillContext(workdir=Path(tempfile.mkdtemp(prefix="tg-drill-readme-")))
    try:
        # Recorded with two drills side by side on the 2-core machine the table describes, as
        # tests/test_drill.py checks it: more processes than cores, on purpose.
        rows = run_drills(ctx, jobs=2, oversubscribe=True)
    finally:
        cleanup(ctx)
    table = matrix_markdown(rows)
    failed = verdict(rows)
    if failed:
        print(table + "\n" + "\n".join(str(f) for f in failed), file=sys.stderr)
        print(f"{path} left as it was: fix the failing drills first", file=sys.stderr)
        return 1
    path.write_text(with_table(readme, table), encoding="utf-8")
    print(f"wrote the drill matrix ({len(rows)} rows) into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
