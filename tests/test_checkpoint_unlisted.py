"""A load reads only files the manifest lists (issue 26, item 5): a file left out of a re-signed
manifest is never opened, whatever it is (a FIFO blocked the resume forever, a link was read
unverified from outside the checkpoint). The step is passed over as unloadable (C111) and the
previous one is used; the framework adapters' folders hold nothing their manifest does not list.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from runhelpers import invoke_cli
from trainguard import Checkpointer
from trainguard.checkpoint.manifest import MANIFEST, manifest_bytes
from trainguard.util.hashing import bytes_checksum


def drop_from_manifest(folder: Path, name: str) -> None:
    """Rewrite `folder`'s manifest without `name`, self-checksum and all, as anyone who can
    write the folder can (the self-checksum is integrity, not authenticity)."""
    doc = json.loads((folder / MANIFEST).read_text())
    doc["files"].pop(name)
    body = {k: v for k, v in doc.items() if k != "manifest_checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    doc["manifest_checksum"] = bytes_checksum(text.encode("utf-8"))
    (folder / MANIFEST).write_bytes(manifest_bytes(doc))


def fifo_instead(folder: Path, name: str) -> None:
    drop_from_manifest(folder, name)
    (folder / name).unlink()
    os.mkfifo(folder / name)


def link_instead(folder: Path, name: str, outside: Path) -> None:
    """`name` left out of the manifest and made a link to a copy outside the checkpoint."""
    drop_from_manifest(folder, name)
    shutil.move(folder / name, outside)
    (folder / name).symlink_to(outside)


def c111(findings) -> set[tuple[int, str]]:
    return {(f.step, f.data["file"]) for f in findings if f.code == "C111"}


@pytest.mark.timeout(30)  # the old code blocked forever opening the FIFO
def test_run_layout_never_opens_files_the_manifest_does_not_list(tmp_path: Path) -> None:
    from loophelpers import run_checkpointer, run_state
    from test_checkpoint_trust import _tiny_training_state
    from trainguard import ElasticSampler
    from trainguard.train.run_state import RunState

    _, model, optimizer, _ = _tiny_training_state()
    root = tmp_path / "ckpts"
    checkpointer = run_checkpointer(root)
    progress = RunState()
    sampler = ElasticSampler(100, global_batch_size=2, seed=0)
    state = run_state(model, optimizer, sampler, progress=progress)
    for s in (1, 2, 3):
        progress.step = s
        checkpointer.save(s, state)
    fifo_instead(root / "step-3", "state.safetensors")
    outside = tmp_path / "outside-state.json"
    link_instead(root / "step-2", "state.json", outside)
    kept = outside.read_bytes()
    assert checkpointer.load_latest(state) == 1  # the old code: step 2, through the link
    assert c111(checkpointer.last_findings) == {(3, "state.safetensors"), (2, "state.json")}
    assert "not listed" in " ".join(f.message for f in checkpointer.last_findings)
    assert progress.step == 1 and outside.read_bytes() == kept
    from trainguard.checkpoint.folder import RefusedFile, open_listed

    with (
        pytest.raises(RefusedFile, match="not listed"),
        open_listed(root / "step-2", "state.json"),
    ):
        pass


@pytest.mark.timeout(30)
def test_checkpointer_falls_back_past_an_unlisted_fifo(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    model = nn.Linear(4, 4)
    ckpt = Checkpointer(root)
    ckpt.save(1, {"model": model})
    first = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ckpt.save(2, {"model": model})
    fifo_instead(root / "step-2", "state.json")
    restored = nn.Linear(4, 4)
    assert Checkpointer(root).load_latest({"model": restored}) == 1
    assert torch.equal(restored.weight, first)


@pytest.mark.timeout(60)
def test_a_sharded_checkpoint_never_reads_an_unlisted_shard(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    model = nn.Linear(4, 4)
    ckpt = Checkpointer(root, sharded=True)
    ckpt.save(1, {"model": model})
    first = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ckpt.save(2, {"model": model})
    ckpt.close()
    shard = next(p.name for p in (root / "step-2").iterdir() if p.name.endswith(".distcp"))
    fifo_instead(root / "step-2", shard)
    restored = nn.Linear(4, 4)
    loader = Checkpointer(root)
    assert loader.load_latest({"model": restored}) == 1
    assert c111(loader.last_findings) == {(2, shard)}
    assert torch.equal(restored.weight, first)


def test_framework_folders_hold_only_what_their_manifest_lists(tmp_path: Path) -> None:
    from trainguard.integrations.verified import commit_folder, newest_verified, verify_folder

    root = tmp_path / "out"
    for step in (1, 2, 3):
        folder = root / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text(json.dumps({"step": step}))
        (folder / "optimizer.pt").write_bytes(b"x" * step)
        commit_folder(folder, step)
    assert verify_folder(root / "checkpoint-3", 3) == []
    os.mkfifo(root / "checkpoint-3" / "rng_state.pth")  # the Trainer would open it
    outside = tmp_path / "outside.pt"
    outside.write_bytes(b"y")
    link_instead(root / "checkpoint-2", "optimizer.pt", outside)
    assert [f.code for f in verify_folder(root / "checkpoint-3", 3)] == ["C109"]
    found = newest_verified(root, "checkpoint-")
    assert found.step == 1
    by_step = {f.step: (f.code, f.data["file"]) for f in found.findings}
    assert by_step == {3: ("C109", "rng_state.pth"), 2: ("C109", "optimizer.pt")}
    (root / "checkpoint-1" / "extra.bin").write_bytes(b"z")  # a plain file, never verified
    assert [f.code for f in verify_folder(root / "checkpoint-1", 1)] == ["C111"]


@pytest.mark.timeout(120)
def test_run_resumes_past_unlisted_files_and_quarantines_them(
    tiny_recipe: Path, tiny_run_copy: Path, tmp_path: Path
) -> None:
    run = tiny_run_copy
    ckpts = run / "checkpoints"
    fifo_instead(ckpts / "step-12", "state.safetensors")
    outside = tmp_path / "state-elsewhere.json"
    link_instead(ckpts / "step-8", "state.json", outside)
    kept = outside.read_bytes()
    res = invoke_cli(
        "run", str(tiny_recipe), "--run-dir", str(run), "-q", "--json",
        "--set", "train.max_steps=6",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    payload = json.loads(res.stdout)
    assert payload["resumed_from"] == 4 and payload["final_step"] == 6
    named = {(f["step"], f["data"]["file"]) for f in payload["findings"] if f["code"] == "C111"}
    assert named == {(12, "state.safetensors"), (8, "state.json")}
    assert sorted(p.name for p in (ckpts / "quarantine").iterdir()) == ["step-12", "step-8"]
    assert outside.read_bytes() == kept


def test_eval_never_reads_weights_the_manifest_does_not_list(tiny_run_copy: Path) -> None:
    from typer.testing import CliRunner

    from trainguard.cli import app

    ckpts = tiny_run_copy / "checkpoints"
    # step 12's weights replaced by a link to step 8's, left out of the re-signed manifest
    drop_from_manifest(ckpts / "step-12", "state.safetensors")
    (ckpts / "step-12" / "state.safetensors").unlink()
    (ckpts / "step-12" / "state.safetensors").symlink_to(ckpts / "step-8" / "state.safetensors")
    res = CliRunner().invoke(app, ["eval", str(tiny_run_copy), "--max-examples", "4", "--json"])
    out = json.loads(res.stdout)
    assert out["checkpoint"].endswith("step-8")  # the old code: step-12, through the link
    named = {(f["step"], f["data"]["file"]) for f in out["findings"] if f["code"] == "C111"}
    assert named == {(12, "state.safetensors")}
