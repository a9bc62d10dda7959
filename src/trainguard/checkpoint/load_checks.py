"""What a resume checks and restores beyond the files' checksums: the payload's own format
(a sharded checkpoint's DCP metadata must be plain DCP metadata), that every rank sees the step
rank 0 verified, which rank wrote a damaged shard, and each rank's random generators."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from trainguard.checkpoint.dcp_files import METADATA_FILE, shard_rank
from trainguard.checkpoint.folder import read_manifest
from trainguard.checkpoint.inventory import unloadable
from trainguard.checkpoint.layout import FlatLayout
from trainguard.checkpoint.manifest import MANIFEST, UnsafeEntry
from trainguard.checkpoint.results import LoadedCheckpoint
from trainguard.checkpoint.rng import derived_seed, restore_rng, seed_all
from trainguard.codes.checkpoint import C107_IN_LOOP
from trainguard.errors import BadInputError, NoUsableCheckpoint
from trainguard.findings import Finding


def unlisted(loaded: LoadedCheckpoint, names: Iterable[str]) -> list[Finding]:
    """C111 for the first of `names` (files a load reads) that the manifest does not list:
    it is never opened (a FIFO would block the load, a link would read outside the step)."""
    for name in names:
        if name not in loaded.manifest["files"]:
            why = f"it is not listed in the step's {MANIFEST}, so it was not read"
            return [unloadable(loaded.step, loaded.path, name, why)]
    return []


def check_payload(loaded: LoadedCheckpoint) -> list[Finding]:
    """Format checks after the checksums and before anything reads the payload: a sharded
    checkpoint's DCP metadata must unpickle as plain DCP metadata (C120), and every file it
    names must be listed in the manifest (C111)."""
    info = loaded.manifest.get("meta", {}).get("checkpointer", {})
    if not info.get("sharded"):
        return []
    from trainguard.checkpoint.dcp_safe import UnsafeCheckpointError, read_dcp_metadata

    found = unlisted(loaded, [METADATA_FILE])
    if found:
        return found
    try:
        metadata = read_dcp_metadata(loaded.path / METADATA_FILE)
    except UnsafeCheckpointError as e:
        return [
            Finding.of(
                "C120",
                f"checkpoint step {loaded.step}: {e.message}",
                step=loaded.step,
                where=str(loaded.path / METADATA_FILE),
                data={"file": METADATA_FILE},
            )
        ]
    data = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
    shards = {str(getattr(s, "relative_path", "")) for s in data.values()}
    return unlisted(loaded, [*sorted(shards), *FlatLayout.files])


def same_manifest(folder: Path, step: int, checksum: str, rank: int) -> None:
    """BadInputError unless `folder` holds the step rank 0 verified (manifest checksum)."""
    try:
        mine = json.loads(read_manifest(folder) or b"")["manifest_checksum"]
    except (OSError, ValueError, KeyError, TypeError, UnsafeEntry) as e:
        raise BadInputError(
            f"rank {rank} cannot read checkpoint step {step} at {folder} ({e}) although rank 0 "
            "verified it: the checkpoint root is not shared by every rank",
            "put local checkpoint roots on a file system every rank mounts at the same path, "
            "or use an object-store URL (s3://...)",
        ) from e
    if mine != checksum:
        raise BadInputError(
            f"rank {rank} sees a different checkpoint step {step} at {folder} than rank 0",
            "use one checkpoint root shared by every rank (same path, same file system)",
        )


def name_rank(f: Finding) -> Finding:
    """A finding about a DCP shard file names the rank that wrote it."""
    rank = shard_rank(str(f.data.get("file", "")))
    if rank is not None and f.rank is None:
        f.rank = rank
        f.message += f" (rank {rank}'s shard)"
    return f


def refuse_if_none_usable(findings: list[Finding], root: str) -> None:
    """NoUsableCheckpoint when checkpoints exist but none verifies (C107), as `run` refuses."""
    none = [f for f in findings if f.code == "C107"]
    if none:
        raise NoUsableCheckpoint(
            f"C107: {none[0].message}; nothing in {root} was changed",
            C107_IN_LOOP.format(folder=root),
            findings=findings,
        )


def restore_generators(rng: list[dict], step: int, rank: int, size: int) -> list[Finding]:
    """Restore this rank's saved generator states, or derive them (rng.py) on a rank the
    checkpoint has none for; C121 when the world size changed."""
    if rank < len(rng):
        restore_rng(rng[rank])
    else:
        seed_all(derived_seed(int(rng[0]["initial_seed"]), step, rank))
    if len(rng) == size:
        return []
    return [
        Finding.of(
            "C121",
            f"checkpoint step {step} was saved by {len(rng)} ranks and resumed on {size}: "
            + (
                f"ranks {len(rng)}-{size - 1} got generator states derived from the seed"
                if size > len(rng)
                else f"the generator states of ranks {size}-{len(rng) - 1} are not used"
            ),
            step=step,
            data={"saved_world_size": len(rng), "world_size": size},
        )
    ]
