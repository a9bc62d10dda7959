"""`python -m trainguard.cli._planted KIND ARGS...`: `trainguard ARGS...` with one subtle software
change of `drills/planted.py` planted in this process only (the reference drills start their
runs this way). It lives with the command line because it runs the command line; the changes
themselves stay in `drills/planted.py`."""

from __future__ import annotations

import sys

from trainguard.cli import main as cli
from trainguard.drills.planted import PLANTS


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in PLANTS:
        sys.exit(f"usage: python -m trainguard.cli._planted {{{','.join(PLANTS)}}} ARGS...")
    PLANTS[argv[0]]()
    sys.argv = ["trainguard", *argv[1:]]
    cli()


if __name__ == "__main__":
    main(sys.argv[1:])
