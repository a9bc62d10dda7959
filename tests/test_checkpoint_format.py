"""One checkpoint format (issue 21, item 1): `trainguard run` saves through the public
Checkpointer in FlatLayout, which checks a step against the caller's state before anything
loads and copies modules and optimizers in the writer thread for any state; every reader of
weights goes through `checkpoint.read.read_module_state`; a run dir of the previous release
(tests/fixtures/old_run, written by commit 912c6b4) is refused with the one-line command that
converts it, and resumes bitwise once converted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from runhelpers import invoke_cli
from test_checkpoint_trust import tree_digest
from trainguard import Checkpointer
from trainguard.checkpoint.folder import verify_local_folder
from trainguard.checkpoint.read import read_module_state

FIXTURE = Path(__file__).parent / "fixtures" / "old_run"


def test_a_step_that_does_not_fit_is_passed_over_before_anything_loads(tmp_path: Path) -> None:
    """Step 2 holds a module of another shape under the same key: checked against the
    caller's module it is C111 and passed over; the module is never half loaded."""
    root = tmp_path / "ckpt"
    small, opt = nn.Linear(4, 4), None
    opt = torch.optim.AdamW(small.parameters())
    Checkpointer(root).save(1, {"model": small, "optimizer": opt})
    big = nn.Linear(4, 8)
    Checkpointer(root).save(2, {"model": big, "optimizer": torch.optim.AdamW(big.parameters())})
    restored = nn.Linear(4, 4)
    ckpt = Checkpointer(root)
    state = {"model": restored, "optimizer": torch.optim.AdamW(restored.parameters())}
    assert ckpt.load_latest(state) == 1  # the old code: step 2, BadInputError mid-load
    (c111,) = [f for f in ckpt.last_findings if f.code == "C111"]
    assert c111.step == 2 and "shape" in c111.message
    assert torch.equal(restored.weight, small.weight)


def test_background_copy_works_for_any_state_and_refills_its_buffers(tmp_path: Path) -> None:
    """The default layout copies modules and optimizers in the writer thread (background_copy)
    into buffers kept per queue slot; the files are those a save in the loop writes."""
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters())
    state = {"model": model, "optimizer": opt, "note": {"step": 0}}
    background = Checkpointer(tmp_path / "bg", async_save=True, background_copy=True, keep=5)
    in_loop = Checkpointer(tmp_path / "sync", keep=5)
    try:
        for step in (1, 2, 3):
            model(torch.randn(2, 8)).pow(2).mean().backward()
            opt.step()
            state["note"] = {"step": step}
            in_loop.save(step, state)
            handle = background.save(step, state)
            background.wait_copied()
            with torch.no_grad():  # the live state moves on before the copy is written
                model.weight.add_(1.0)
            handle.wait()
            with torch.no_grad():
                model.weight.sub_(1.0)
    finally:
        background.close()
    assert background.layout.stagings[0].refills == 4  # model and optimizer, saves 2 and 3
    for step in (1, 2, 3):
        for name in ("state.json", "state.safetensors"):
            a = (tmp_path / "bg" / f"step-{step}" / name).read_bytes()
            assert a == (tmp_path / "sync" / f"step-{step}" / name).read_bytes(), (step, name)


@pytest.mark.parametrize("sharded", [False, True])
def test_read_module_state_reads_a_flat_and_a_sharded_step(tmp_path: Path, sharded: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10))
    model[1].weight = model[0].weight  # tied, as the GPT's head
    opt = torch.optim.AdamW(model.parameters())
    Checkpointer(tmp_path, sharded=sharded).save(3, {"model": model, "optimizer": opt})
    state = read_module_state(tmp_path / "step-3", "model")
    expected = model.state_dict()
    assert sorted(state) == sorted(expected)
    assert all(torch.equal(state[k], expected[k]) for k in expected)


def _old_run(tmp_path: Path, corpus: Path, cache: Path) -> tuple[Path, Path]:
    """The fixture run dir (old format, killed after step 4 of 6) and its recipe, pointed at
    this session's copy of the same corpus."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    raw = yaml.safe_load((run / "recipe.yaml").read_text())
    raw["data"]["source"], raw["data"]["cache_dir"] = str(corpus), str(cache)
    (run / "recipe.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    return run, recipe


def refused_then_converted(run: Path, recipe: Path) -> None:
    """`run` on the old run dir: exit 2 naming the command, nothing written; the command:
    the old step in the attic byte for byte, the new one verifies."""
    before = tree_digest(run)
    res = invoke_cli("run", str(recipe), "--run-dir", str(run), "-q", "--no-evals")
    assert res.returncode == 2, res.stderr[-2000:]
    assert f"trainguard checkpoint convert {run}" in res.stderr and "Traceback" not in res.stderr
    after = {k: v for k, v in tree_digest(run).items() if k != ".lock"}  # the run's lock
    assert after == before  # refused before anything was written
    res = invoke_cli("checkpoint", "convert", str(run), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    done = json.loads(res.stdout)
    assert done["converted"] == [4] and done["left"] == {}
    old = FIXTURE / "checkpoints" / "step-4"
    assert tree_digest(Path(done["attic"]) / "step-4") == tree_digest(old)  # never deleted
    step4 = run / "checkpoints" / "step-4"
    assert verify_local_folder(step4, 4) == []
    assert {p.name for p in step4.iterdir()} == {"state.json", "state.safetensors", "manifest.json"}
    res = invoke_cli("checkpoint", "convert", str(run))  # again: nothing of the old format
    assert res.returncode == 0 and "no checkpoint of the earlier format" in res.stdout


def test_an_old_run_dir_is_refused_with_the_command_that_converts_it(
    tmp_path: Path, small_corpus: Path, cache_dir: Path
) -> None:
    refused_then_converted(*_old_run(tmp_path, small_corpus, cache_dir))


@pytest.mark.slow
def test_a_converted_run_dir_resumes_bitwise(
    tmp_path: Path, small_corpus: Path, cache_dir: Path
) -> None:
    """The old release's steps 1-4, converted, then this release's 5-6: bitwise the weights
    of an uninterrupted run of this release (which are the old release's too: checked when
    the fixture was made)."""
    run, recipe = _old_run(tmp_path, small_corpus, cache_dir)
    refused_then_converted(run, recipe)
    res = invoke_cli("run", str(recipe), "--run-dir", str(run), "-q", "--no-evals", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["resumed_from"] == 4
    res = invoke_cli("run", str(recipe), "--run-dir", str(tmp_path / "fresh"), "-q", "--no-evals")
    assert res.returncode == 0, res.stderr[-2000:]
    resumed = read_module_state(run / "checkpoints" / "step-6")
    fresh = read_module_state(tmp_path / "fresh" / "checkpoints" / "step-6")
    assert sorted(resumed) == sorted(fresh)
    assert all(torch.equal(resumed[k], fresh[k]) for k in fresh)  # bitwise


def test_a_damaged_old_step_is_not_converted_and_is_named(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    weights = run / "checkpoints" / "step-4" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    before = tree_digest(run / "checkpoints")
    res = invoke_cli("checkpoint", "convert", str(run), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    done = json.loads(res.stdout)
    assert done["converted"] == [] and "4" in done["left"] and "C10" in done["left"]["4"]
    assert tree_digest(run / "checkpoints") == before  # nothing moved, nothing written
