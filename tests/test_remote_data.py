"""Prepared data on S3 (issue 14, item 1): fetched once per node into the node cache, memory-
mapped by every process, verified on reuse, bounded by the cache's size limit.

Against moto's S3 server on 127.0.0.1 with a request counter (tests/s3_server.py): the GETs
of every object are counted as the server sees them.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("moto")
pytest.importorskip("s3fs")

from s3_server import Traffic, make_bucket, s3_server, storage_options  # noqa: E402
from trainguard.config.schema import DataConfig, TokenizerConfig  # noqa: E402
from trainguard.data.prepare import open_prepared, prepare_data  # noqa: E402
from trainguard.util.hashing import bytes_checksum  # noqa: E402
from trainguard.util.node_cache import NodeCache  # noqa: E402

BUCKET = "trainguard-remote-data"
# under pytest-xdist the module's tests run on one worker, so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_remote_data")

WORKER = """
import json, sys
from trainguard.config.schema import DataConfig
from trainguard.data.prepare import open_prepared
from trainguard.util.hashing import bytes_checksum

data = open_prepared(DataConfig(**json.loads(sys.argv[1])))
out = {}
for split in ("train", "val"):
    ds = getattr(data, split)
    out[split] = bytes_checksum(ds.tokens(0, ds.n_tokens).tobytes())
data.close()
print(json.dumps(out))
"""


def _checksums(data, splits: tuple[str, ...] = ("train", "val")) -> dict[str, str]:
    return {
        s: bytes_checksum(getattr(data, s).tokens(0, getattr(data, s).n_tokens).tobytes())
        for s in splits
    }


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory):
    """A prepared folder of several shards, uploaded to moto's S3; the server's traffic."""
    base = tmp_path_factory.mktemp("remote")
    corpus = base / "corpus"
    corpus.mkdir()
    rng = random.Random(3)
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "river",
        "stone",
        "light",
        "night",
        "paper",
        "glass",
        "tree",
        "road",
    ]
    for i in range(40):
        (corpus / f"d{i:02d}.txt").write_text(" ".join(rng.choice(words) for _ in range(120)))
    cfg = DataConfig(source=str(corpus), cache_dir=str(base / "cache"), shard_tokens=1024)
    cfg = cfg.model_copy(update={"seq_len": 8, "val_fraction": 0.2})
    local = prepare_data(cfg, TokenizerConfig(vocab_size=300), progress=False)
    files = sorted(p.name for p in local.dir.iterdir())
    assert sum(n.startswith("train-") for n in files) >= 3  # several shards to fetch
    traffic = Traffic()
    with s3_server(traffic) as endpoint:
        fs = make_bucket(endpoint, BUCKET)
        fs.put(str(local.dir) + "/", f"{BUCKET}/prep/", recursive=True)
        yield {
            "endpoint": endpoint,
            "traffic": traffic,
            "files": files,
            "meta_bytes": sum(p.stat().st_size for p in local.dir.iterdir() if p.suffix != ".bin"),
            "expected": _checksums(local),
        }


def _cfg(remote: dict, node: Path, max_gb: float = 64.0) -> dict:
    return {
        "prepared": f"s3://{BUCKET}/prep",
        "storage_options": storage_options(remote["endpoint"]),
        "node_cache_dir": str(node),
        "node_cache_max_gb": max_gb,
        "seq_len": 8,
    }


def _processes(cfgs: list[dict]) -> list[dict]:
    """Start one process per config at once; each prints its data's checksums."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps(c)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in cfgs
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out))
    return outs


def _gets(remote: dict) -> dict[str, int]:
    prefix = f"/{BUCKET}/prep/"
    return {k[len(prefix) :]: v for k, v in remote["traffic"].gets.items() if k.startswith(prefix)}


def test_n_processes_on_a_node_cause_one_get_per_shard(remote: dict, tmp_path: Path) -> None:
    remote["traffic"].reset()
    node = tmp_path / "node"
    outs = _processes([_cfg(remote, node)] * 3)
    assert outs == [remote["expected"]] * 3  # every process reads the very same tokens
    gets = _gets(remote)
    assert gets == {name: 1 for name in remote["files"]}, gets
    # The counter does see redundant fetches: three machines (three caches) fetch three times.
    remote["traffic"].reset()
    _processes([_cfg(remote, tmp_path / f"machine{i}") for i in range(3)])
    assert set(_gets(remote).values()) == {3}


def test_a_resume_reads_the_verified_cache_and_refetches_only_damage(
    remote: dict, tmp_path: Path
) -> None:
    node = tmp_path / "node"
    _processes([_cfg(remote, node)])
    remote["traffic"].reset()
    assert _processes([_cfg(remote, node)] * 2) == [remote["expected"]] * 2
    assert _gets(remote) == {}  # nothing downloaded again
    damaged = next(node.glob("*/train-00001.bin"))
    data = bytearray(damaged.read_bytes())
    data[5] ^= 0x01  # same size: only the checksum can tell
    damaged.write_bytes(bytes(data))
    assert _processes([_cfg(remote, node)]) == [remote["expected"]]
    assert _gets(remote) == {"train-00001.bin": 1}


def test_the_cache_keeps_to_its_size_limit(remote: dict, tmp_path: Path) -> None:
    node = tmp_path / "node"
    shard_bytes = 1024 * 2  # uint16 tokens
    limit_gb = (remote["meta_bytes"] + 2.5 * shard_bytes) / 1e9  # the small files, two shards
    remote["traffic"].reset()
    assert _processes([_cfg(remote, node, limit_gb)]) == [remote["expected"]]
    kept = NodeCache(node).entries()
    assert sum(size for _, size, _ in kept) <= limit_gb * 1e9
    assert 1 <= len(kept) < len(remote["files"]) - 4  # evicted, least recently used first
    # The worker read the val split last: its shards are the ones kept, and are reused.
    assert {Path(name).name for name in _cached_files(node)} >= {
        n for n in remote["files"] if n.startswith("val-")
    }
    remote["traffic"].reset()
    data = open_prepared(DataConfig(**_cfg(remote, node, limit_gb)))
    assert _checksums(data, ("val",))["val"] == remote["expected"]["val"]
    data.close()
    assert not [n for n in _gets(remote) if n.startswith("val-")], _gets(remote)


def _cached_files(node: Path) -> list[str]:
    return [p.name for p in node.glob("*/*") if not p.name.startswith(".")]


def test_a_run_trains_on_remote_data_and_resumes_without_a_download(
    remote: dict, tmp_path: Path
) -> None:
    import yaml

    from runhelpers import run_cli, tiny_recipe_dict

    recipe = tiny_recipe_dict(tmp_path / "unused-source", tmp_path / "cache")
    recipe["data"] |= _cfg(remote, tmp_path / "node")
    recipe["train"] |= {"max_steps": 4, "eval_interval": 4}
    recipe["checkpoint"] = {"interval": 2, "keep": 2}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    remote["traffic"].reset()
    run = ("run", str(path), "--run-dir", str(tmp_path / "run"), "-q", "--no-evals")
    res = run_cli(*run)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _gets(remote) and set(_gets(remote).values()) == {1}
    remote["traffic"].reset()
    res = run_cli(*run, "--set", "train.max_steps=6")  # a resume on the same node
    assert res.returncode == 0, res.stderr[-3000:]
    assert _gets(remote) == {}
    assert not (tmp_path / "cache").exists()  # nothing was prepared from the source
