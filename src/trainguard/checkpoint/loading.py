"""Loading from a CheckpointStore's backend: one step as a verified local folder, and the
newest step that verifies (and that the caller can use), falling back past damaged ones with
findings; when checkpoints exist but none can be used, C107 lists every step and its problems.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from trainguard.checkpoint.folder import read_manifest
from trainguard.checkpoint.inventory import junk_findings, none_usable
from trainguard.checkpoint.manifest import UnsafeEntry, parse_manifest
from trainguard.checkpoint.results import LoadedCheckpoint
from trainguard.findings import Finding, has_errors

if TYPE_CHECKING:
    from trainguard.checkpoint.local import LocalBackend
    from trainguard.checkpoint.remote import RemoteBackend


def try_load(
    backend: LocalBackend | RemoteBackend, step: int
) -> tuple[LoadedCheckpoint | None, list[Finding]]:
    """(step `step` fetched and verified, its findings), or (None, why it cannot be loaded)."""
    path, findings, from_cache = backend.fetch(step)
    if has_errors(findings):
        return None, findings
    try:
        raw = read_manifest(path)
    except UnsafeEntry:
        raw = None
    manifest, problems = parse_manifest(raw, step, str(path))
    if manifest is None:  # changed between verification and now
        return None, problems
    return LoadedCheckpoint(step, path, manifest, findings, from_cache), findings


def newest_valid(
    backend: LocalBackend | RemoteBackend,
    root: str,
    rejected: dict[int, list[Finding]],
    warned: set[str],
    usable: Callable[[LoadedCheckpoint], list[Finding]] | None = None,
) -> tuple[LoadedCheckpoint | None, list[Finding]]:
    """(the newest step that verifies and that `usable` finds no error in, every finding on
    the way): `CheckpointStore.load_latest`. Steps that fail are recorded in `rejected` (and
    a step that verifies now leaves it); entries of the root already in `warned` are not
    reported again."""
    folders = backend.step_folders()
    notes = junk_findings(root, backend.ignored, warned)
    # Locally a step folder is renamed into place with its manifest: one without is damage.
    # On an object store it is an upload killed before its commit marker (C204).
    uncommitted = [] if backend.remote else sorted(s for s, c in folders.items() if not c)
    for step in uncommitted:
        notes += backend.verify(step, full=False)
    committed = sorted(s for s, c in folders.items() if c)
    skipped: list[Finding] = []
    for step in reversed(committed):
        loaded, findings = try_load(backend, step)
        if loaded is not None and usable is not None:
            problems = usable(loaded)
            findings = findings + problems
            if has_errors(problems):
                loaded = None
        if loaded is None:
            rejected[step] = findings
            skipped += findings
            continue
        rejected.pop(step, None)  # verified now (a cache or transfer problem passed)
        loaded.findings = notes + skipped + loaded.findings
        return loaded, loaded.findings
    tried = sorted(committed + uncommitted)
    last = notes + skipped
    if tried:
        located = {s: backend.location(s) for s in tried}
        last.append(none_usable(root, located, notes + skipped))
    return None, last
