"""A whole `trainguard run` against an unreliable S3 store: a share of the requests to a real S3
wire-protocol server (moto on 127.0.0.1, through s3fs) fail or stall. The run continues through
the store's retries, every committed checkpoint verifies, and a resume (downloading through the
same faults into an empty cache) loads only a complete one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runhelpers import tiny_recipe_dict


def cached_steps(cache: Path) -> list[str]:
    """The checkpoint steps in the machine's node cache (entries are named by a hash of their
    key; each entry's seal holds the key: URL/step-N#manifest checksum)."""
    seals = [json.loads(p.read_text()) for p in cache.rglob(".entry.json")]
    return sorted(s["key"].rsplit("/", 1)[-1].split("#")[0] for s in seals)


def test_run_and_resume_through_an_unreliable_store(
    small_corpus: Path,
    cache_dir: Path,
    finished_tiny_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    torch_globals: None,
) -> None:
    import trainguard.checkpoint.store as store_module
    from s3_server import make_bucket, s3_server, storage_options
    from test_checkpoint_s3 import FaultyFS, all_committed_valid
    from trainguard.config.load import validate_recipe
    from trainguard.train.guarded_run import run_recipe

    faulty: list[FaultyFS] = []
    real_open = store_module.open_filesystem

    def flaky_open(url: str, options: dict | None):
        fs, path = real_open(url, options)
        faulty.append(FaultyFS(fs, fail=0.1, stall=0.05, seed=len(faulty) + 3))
        return faulty[-1], path

    monkeypatch.setattr(store_module, "open_filesystem", flaky_open)
    monkeypatch.setenv("TRAINGUARD_CACHE", str(tmp_path / "tgcache"))
    with s3_server() as endpoint:
        make_bucket(endpoint, "flaky")
        raw = tiny_recipe_dict(small_corpus, cache_dir)
        raw["checkpoint"] |= {"dir": "s3://flaky/run", "storage_options": storage_options(endpoint)}
        recipe = validate_recipe(raw)
        run = tmp_path / "run"
        result = run_recipe(recipe, run, progress=False, report=False)
        assert result.final_step == 12
        assert faulty[0].injected > 0  # the faults really happened, and were retried through
        assert all_committed_valid(endpoint, "s3://flaky/run", tmp_path) == [4, 8, 12]

        # Resume with an empty cache: the newest checkpoint is downloaded through the faults.
        shutil.rmtree(tmp_path / "tgcache", ignore_errors=True)
        again = run_recipe(recipe, run, progress=False, report=False)
        assert again.resumed_from == 12 and again.final_step == 12
        assert "step-12" in cached_steps(tmp_path / "tgcache")  # fetched again, verified
        assert sum(f.injected for f in faulty[1:]) > 0

    lines = (run / "metrics.jsonl").read_text().splitlines()
    got = [json.loads(x) for x in lines if '"kind": "step"' in x]
    want = [
        json.loads(x)
        for x in (finished_tiny_run / "metrics.jsonl").read_text().splitlines()
        if '"kind": "step"' in x
    ]
    # The store's trouble never touched the training: the same batches, bitwise the same losses.
    assert [r["batch_hash"] for r in got] == [r["batch_hash"] for r in want]
    assert [r["loss"] for r in got] == [r["loss"] for r in want]
