"""`trainguard data order-check`: a user's loader order, from a file of ids or a Python sampler,
is flagged when it mixes sources poorly (D301) and passes when it is a random order."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from trainguard.cli import app

runner = CliRunner()
# 60 files of uneven length, read in order: the sources of samples 0..N-1.
SIZES = np.random.default_rng(0).integers(20, 120, size=60)
LABELS = np.repeat([f"src/file{i:02d}.txt" for i in range(60)], SIZES)
N = len(LABELS)


def check(*args: str) -> tuple[int, dict]:
    res = runner.invoke(app, ["data", "order-check", *args, "--json"])
    assert res.exit_code in (0, 1, 2), res.output
    return res.exit_code, (json.loads(res.stdout) if res.exit_code != 2 else {"error": res.output})


def write_ids(path: Path, ids, with_sources: bool = False) -> Path:
    lines = [f"{i}\t{LABELS[i]}" if with_sources else str(i) for i in ids]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def labels_file(tmp_path: Path) -> Path:
    path = tmp_path / "labels.txt"
    path.write_text("\n".join(LABELS) + "\n")
    return path


def test_ids_file_sequential_is_poor_and_shuffled_passes(tmp_path, labels_file):
    sequential = write_ids(tmp_path / "seq.txt", range(N))
    code, out = check(str(sequential), "--sources", str(labels_file))
    assert code == 0  # D301 is a warning
    assert [f["code"] for f in out["findings"]] == ["D301"]
    assert out["samples"] == N and out["sources"] == 60 and out["order"] == str(sequential)
    shuffled = write_ids(tmp_path / "perm.txt", np.random.default_rng(1).permutation(N))
    code, out = check(str(shuffled), "--sources", str(labels_file))
    assert (code, out["findings"]) == (0, [])
    assert 0.7 < out["mean_chi2_ratio"] < 1.3
    # The same orders with the sources on each line need no labels file.
    inline = write_ids(tmp_path / "inline.txt", range(N), with_sources=True)
    assert [f["code"] for f in check(str(inline))[1]["findings"]] == ["D301"]


SAMPLERS = f"""
    import numpy as np
    import torch

    from trainguard.checks.shuffle_quality import buffer_shuffle_order

    N = {N}


    def torch_random():
        return torch.utils.data.RandomSampler(
            range(N), generator=torch.Generator().manual_seed(0)
        )


    def torch_sequential():
        return torch.utils.data.SequentialSampler(range(N))


    def small_buffer():
        return buffer_shuffle_order(N, buffer=64, seed=0).tolist()


    def infinite():
        rng = np.random.default_rng(3)
        while True:
            yield int(rng.integers(N))


    def broken():
        raise RuntimeError("no dataset here")
"""


def test_python_samplers(tmp_path, labels_file, monkeypatch):
    (tmp_path / "my_samplers.py").write_text(textwrap.dedent(SAMPLERS))
    monkeypatch.chdir(tmp_path)  # importable like `python -m` from the folder
    src = ["--sources", str(labels_file)]
    assert check("my_samplers:torch_random", *src)[1]["findings"] == []
    for poor in ("torch_sequential", "small_buffer"):
        found = check(f"my_samplers:{poor}", *src)[1]["findings"]
        assert [f["code"] for f in found] == ["D301"], poor
    # An endless sampler is read up to --count samples.
    code, out = check("my_samplers:infinite", *src, "--count", "3000")
    assert (code, out["samples"], out["findings"]) == (0, 3000, [])
    code, out = check("my_samplers:broken", *src)
    assert code == 2 and "no dataset here" in out["error"]


def test_prepared_data_order(tmp_path, small_corpus, cache_dir):
    """Sample ids of a trainguard prepared folder: the sources are the files samples start in."""
    # The tiny recipe's data settings: the session's prepared cache is reused.
    res = runner.invoke(
        app,
        [
            "data",
            "prepare",
            str(small_corpus),
            "--out",
            str(cache_dir),
            "--vocab-size",
            "512",
            "--val-fraction",
            "0.1",
            "--seq-len",
            "32",
            "--no-progress",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    folder = json.loads(res.stdout)["dir"]
    n = json.loads(res.stdout)["train_samples"]
    args = ["--prepared", folder, "--seq-len", "32"]
    sequential = write_ids(tmp_path / "seq.txt", range(n))
    assert [f["code"] for f in check(str(sequential), *args)[1]["findings"]] == ["D301"]
    shuffled = write_ids(tmp_path / "perm.txt", np.random.default_rng(2).permutation(n))
    assert check(str(shuffled), *args)[1]["findings"] == []


def test_one_source_is_not_measurable(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("".join(f"{i}\tweb\n" for i in range(500)))
    code, out = check(str(path))
    assert code == 0 and [f["code"] for f in out["findings"]] == ["D302"]


def test_bad_input(tmp_path, labels_file):
    ids = write_ids(tmp_path / "ids.txt", range(100))
    (tmp_path / "words.txt").write_text("a\nb\nc\n")
    (tmp_path / "mixed.txt").write_text("1\tweb\n2\n")
    (tmp_path / "empty.txt").write_text("\n\n")
    cases = [
        ([str(tmp_path / "nope.txt")], "does not exist"),
        ([str(tmp_path)], "is a folder"),
        (["no_such_module_xyz:factory"], "cannot import"),
        (["json:no_such_factory"], "no callable"),
        ([str(ids)], "carry no source"),
        ([str(tmp_path / "words.txt"), "--sources", str(labels_file)], "not an integer"),
        ([str(tmp_path / "mixed.txt")], "some samples"),
        ([str(tmp_path / "empty.txt")], "holds no sample"),
        ([str(ids), "--sources", str(tmp_path / "missing.txt")], "does not exist"),
        ([str(ids), "--prepared", str(tmp_path)], "--seq-len"),
        ([str(ids), "--prepared", str(tmp_path / "none"), "--seq-len", "8"], "does not exist"),
        ([str(ids), "--sources", str(labels_file), "--prepared", str(tmp_path)], "give one"),
    ]
    short = tmp_path / "short.txt"
    short.write_text("a\nb\n")
    cases.append(([str(ids), "--sources", str(short)], "outside [0, 2)"))
    for args, words in cases:
        code, out = check(*args)
        assert code == 2, args
        assert words in out["error"], (args, out["error"])
