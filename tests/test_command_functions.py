"""Each command's work is a plain function the tests (and users) call without the command line;
the typer function only parses options, calls it and prints (issue 21, "a layout that shows it").

Each test calls the function and the command with the same inputs and checks that they agree,
or that the function refuses bad input with the command's message before any work."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

import model_zoo
from runhelpers import invoke_cli
from trainguard.errors import BadInputError


def _json(*args: str) -> dict:
    res = invoke_cli(*args, "--json")
    assert res.returncode in (0, 1), res.stdout + res.stderr
    return json.loads(res.stdout)


def test_check_precision_is_a_function() -> None:
    from trainguard.checks.precision_check import check_precision, collective_sizes

    args = dict(dtype="bf16", world_size=64, algorithm="ring", elements=256, seed=3)
    findings, extra = check_precision(**args, sizes=[], shadow_steps=0)
    cli = _json(
        *("check-precision", "--dtype", "bf16", "--world-size", "64", "--elements", "256"),
        *("--seed", "3", "--shadow-steps", "0"),
    )
    assert extra["reduction"] == cli["reduction"]
    assert [f.code for f in findings] == [f["code"] for f in cli["findings"]]
    assert collective_sizes([3], True, in_job=False) == [2, 3, 4]
    with pytest.raises(BadInputError, match="inside a torchrun job"):
        collective_sizes([2], False, in_job=True)


def test_check_model_is_a_function() -> None:
    from trainguard.checks.model_checks import check_target

    target = f"{model_zoo.__file__}:factory"
    report, label, vocab = check_target(target, seq_len=8)
    cli = _json("check-model", target, "--seq-len", "8", "--threads", "1")
    assert (label, vocab) == (cli["target"], cli["vocab_size"])
    assert [f.code for f in report.findings] == [f["code"] for f in cli["findings"]]
    with pytest.raises(BadInputError, match="fp8"):
        check_target(target, dtype="fp8")  # before the model is built


def test_data_order_check_is_a_function(tmp_path: Path) -> None:
    from trainguard.checks.order_check import check_order

    order = tmp_path / "order.txt"
    ids = np.random.default_rng(0).permutation(600)
    order.write_text("".join(f"{i}\tsrc{i % 7}\n" for i in ids))
    findings, stats = check_order(str(order), count=600)
    cli = _json("data", "order-check", str(order), "--count", "600")
    assert {k: cli[k] for k in stats} == json.loads(json.dumps(stats))
    assert [f.code for f in findings] == [f["code"] for f in cli["findings"]]
    with pytest.raises(BadInputError, match="--prepared needs --seq-len"):
        check_order(str(order), prepared=tmp_path)


def test_scale_fit_is_a_function(tmp_path: Path) -> None:
    from trainguard.cli.scale import fit_runs

    runs = tmp_path / "runs.csv"
    grid = itertools.product([1e6, 2e6, 4e6, 8e6], [1e7, 2e7, 4e7, 8e7])
    rows = [f"{n},{d},{1.7 + 400 / n**0.34 + 410 / d**0.28}" for n, d in grid]
    runs.write_text("params,tokens,loss\n" + "\n".join(rows) + "\n")
    result, extra = fit_runs(runs, ["1e8,1e9"], boot=10, seed=1)
    assert pytest.approx(1.7, abs=0.05) == result.law.E
    cli = _json("scale", "fit", str(runs), "--predict", "1e8,1e9", "--boot", "10", "--seed", "1")
    assert cli["fit"] == extra["fit"] and cli["predictions"] == extra["predictions"]
    with pytest.raises(BadInputError, match="--band needs exactly one --predict"):
        fit_runs(runs, [], band=tmp_path / "band.json")


def test_data_inspect_is_a_function(tmp_path: Path) -> None:
    from trainguard.cli.data_inspect import inspect

    source = tmp_path / "docs.jsonl"
    texts = ["word " * 80, "short text", "x" * 30 + " \x07 control"]
    source.write_text(
        "".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts))
    )
    insp, extra = inspect(str(source), n=3, html=tmp_path / "a.html")
    assert insp.total == 3 and (tmp_path / "a.html").is_file()
    cli = _json("data", "inspect", str(source), "--n", "3", "--html", str(tmp_path / "b.html"))
    assert {k: cli[k] for k in ("total", "flagged", "by_code", "samples")} == {
        k: extra[k] for k in ("total", "flagged", "by_code", "samples")
    }
    with pytest.raises(BadInputError):  # the page may not overwrite the source
        inspect(str(source), html=source)


def test_data_prepare_is_a_function(tmp_path: Path, small_corpus: Path) -> None:
    from trainguard.cli.data_prepare import prepare

    out = tmp_path / "prepared"
    options = dict(vocab_size=300, min_frequency=2, seq_len=32, val_fraction=0.1)
    prepared, extra = prepare(str(small_corpus), out, shard_tokens=1 << 16, **options)
    assert not extra["reused"] and extra["train_tokens"] > 0
    assert Path(extra["dir"]).parent == out
    cli = _json(
        *("data", "prepare", str(small_corpus), "--out", str(out), "--vocab-size", "300"),
        *("--min-frequency", "2", "--seq-len", "32", "--val-fraction", "0.1"),
        *("--shard-tokens", str(1 << 16), "--no-progress"),
    )
    assert cli["reused"] and cli["dir"] == extra["dir"]  # the function's output, found again
    assert cli["train_tokens"] == extra["train_tokens"]


def test_contamination_and_doctor_options_are_checked_by_functions() -> None:
    from trainguard.cli.data_contamination import check_options
    from trainguard.cli.doctor import prepare_doctor

    with pytest.raises(BadInputError, match="--val-fraction 0.7"):
        check_options(0.7, 13, 0.8, 0.35, None)
    with pytest.raises(BadInputError, match="--max-examples 0"):
        check_options(0.0, 13, 0.8, 0.35, 0)
    check_options(0.05, 13, 0.8, 0.35, 10)
    _, plan, rounds = prepare_doctor("default", None, None, True, ["none"], 2)
    assert len(rounds) == 2 and plan is not None
    with pytest.raises(BadInputError):
        prepare_doctor("default", None, None, True, ["sideways/r1"], 1)
