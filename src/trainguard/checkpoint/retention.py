"""Which checkpoints to delete: keep the newest `keep` valid ones, never the newest valid one.

A pure function, so the rule is tested apart from any file system. Validity here is the cheap
structural check (manifest intact, every file present with the right size); the full checksum
check runs when a checkpoint is written and when it is loaded.
"""

from __future__ import annotations


def plan_retention(
    status: dict[int, bool], keep: int, protect: frozenset[int] = frozenset()
) -> list[int]:
    """Steps to delete, ascending, given {step: valid} for every step folder.

    - the newest `keep` valid steps stay;
    - the newest valid step always stays, whatever `keep` says (keep >= 1 is enforced);
    - older valid steps go;
    - invalid folders (no manifest, damaged) older than the newest valid step go: they can
      never be loaded and a newer good copy exists. Invalid folders newer than every valid
      one stay for inspection; they are never loaded.
    - steps in `protect` (the one just written) stay.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    valid = sorted((s for s, ok in status.items() if ok), reverse=True)
    if not valid:
        return []  # nothing proven good: deleting anything could lose the last copy
    kept = set(valid[:keep]) | set(protect)
    newest_valid = valid[0]
    doomed = [s for s, ok in status.items() if s not in kept and (ok or s < newest_valid)]
    return sorted(doomed)
