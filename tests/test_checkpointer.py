"""trainguard.Checkpointer in one process: bitwise resume of a real training loop, snapshots for
async saves, bad input, fallback past damaged checkpoints, the layout hook for `run`, and the
restricted unpickler for DCP metadata (a planted pickle must not run)."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_model, save_model
from torch import nn

import trainguard
from trainguard.checkpoint import codec
from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.checkpoint.dcp_safe import UnsafeCheckpointError, read_dcp_metadata
from trainguard.checkpoint.local import QUARANTINE
from trainguard.checkpoint.manifest import MANIFEST, build_manifest, manifest_bytes
from trainguard.errors import BadInputError, NoUsableCheckpoint


@pytest.fixture(autouse=True)
def rng_guard():
    """load_latest restores this process's generators: give them back afterwards."""
    t, r, n = torch.get_rng_state(), random.getstate(), np.random.get_state()
    yield
    torch.set_rng_state(t)
    random.setstate(r)
    np.random.set_state(n)


class Counter:
    """A stateful object of the caller's own (like a sampler or the Guard)."""

    def __init__(self) -> None:
        self.seen, self.skips = 0, [(1, 2)]

    def state_dict(self) -> dict:
        return {"seen": self.seen, "skips": self.skips}

    def load_state_dict(self, state: dict) -> None:
        self.seen, self.skips = state["seen"], state["skips"]


def make_loop(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    state = {"model": model, "optim": opt, "sched": sched, "counter": Counter(), "notes": {}}
    return state


def train(state: dict, steps: int) -> list[float]:
    """Steps that draw from torch (dropout, data), numpy and random: a resume must restore all."""
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 8) + float(np.random.rand()) + random.random()
        loss = state["model"](x).square().mean()
        loss.backward()
        state["optim"].step()
        state["optim"].zero_grad()
        state["sched"].step()
        state["counter"].seen += 4
        losses.append(loss.item())
    return losses


def test_resume_is_bitwise_identical_to_an_uninterrupted_run(tmp_path: Path) -> None:
    torch.manual_seed(123)
    np.random.seed(5)
    random.seed(7)
    state = make_loop()
    train(state, 3)
    state["notes"] = {"epoch": 1, "shape": (2, 3), "ids": np.arange(3)}
    ckpt = trainguard.Checkpointer(tmp_path / "ckpt")
    assert ckpt.save(3, state) == str(tmp_path / "ckpt" / "step-3")
    uninterrupted = train(state, 4)
    final = {k: v.clone() for k, v in state["model"].state_dict().items()}

    resumed = make_loop(seed=99)  # other weights, other generator states
    torch.manual_seed(999)
    assert trainguard.Checkpointer(tmp_path / "ckpt").load_latest(resumed) == 3
    assert resumed["counter"].seen == 12 and resumed["counter"].skips == [(1, 2)]
    assert resumed["notes"]["shape"] == (2, 3) and resumed["notes"]["ids"].tolist() == [0, 1, 2]
    assert resumed["sched"].last_epoch == 3
    assert train(resumed, 4) == uninterrupted
    for k, v in resumed["model"].state_dict().items():
        assert torch.equal(v, final[k]), k
    # Only JSON and safetensors in the folder: nothing that could be unpickled.
    names = sorted(p.name for p in (tmp_path / "ckpt" / "step-3").iterdir())
    assert names == [MANIFEST, "state.json", "state.safetensors"]


def test_fresh_start_returns_none(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "empty")
    assert ckpt.load_latest(make_loop()) is None and ckpt.last_findings == []


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (object(), "state['thing'] is a builtins.object"),
        ({"ok": 1, "inner": [1, {2, 3}]}, "state['thing'].inner[1] is a builtins.set"),
        (lambda: None, "state['thing'] is a builtins.function"),
    ],
)
def test_value_without_state_dict_is_bad_input(tmp_path: Path, value, named: str) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt")
    state = make_loop() | {"thing": value}
    with pytest.raises(BadInputError) as e:
        ckpt.save(1, state)
    assert named in e.value.message and "state_dict()" in e.value.fix
    assert not any((tmp_path / "ckpt").iterdir())  # refused before a byte was written


def test_bad_state_and_step_are_refused(tmp_path: Path) -> None:
    class SaveOnly:
        def state_dict(self) -> dict:
            return {}

    ckpt = Checkpointer(tmp_path / "ckpt")
    with pytest.raises(BadInputError, match="no load_state_dict"):
        ckpt.save(1, {"x": SaveOnly()})
    with pytest.raises(BadInputError, match="dict with string keys"):
        ckpt.save(1, [torch.zeros(1)])  # type: ignore[arg-type]
    for step in (-1, True, 1.5):
        with pytest.raises(BadInputError, match="completed steps"):
            ckpt.save(step, {"x": torch.zeros(1)})  # type: ignore[arg-type]
    with pytest.raises(BadInputError, match="rate_limit_mb_s"):
        Checkpointer(tmp_path / "x", rate_limit_mb_s=0)
    ckpt.save(1, {"x": torch.zeros(1)})
    with pytest.raises(BadInputError, match="state keys"):
        ckpt.load_latest({"y": torch.zeros(1)})


def test_codec_round_trip_keeps_every_type() -> None:
    base = torch.arange(12.0)
    value = {
        0: {"step": torch.tensor(3.0), "exp_avg": base.view(3, 4).t()},  # int key, a view
        "betas": (0.9, 0.999),
        "tied": [base, base],
        "np": (np.float32(1.5), np.arange(4, dtype=np.int16)),
        "dtype": torch.bfloat16,
        codec.TAG: "a user key that looks like a tag",
        "nan": float("inf"),
    }
    skeleton, tensors = codec.encode(value, "v", copy=True)
    back = codec.decode(json.loads(json.dumps(skeleton)), tensors)
    assert set(back) == set(value) and back["betas"] == (0.9, 0.999)
    assert torch.equal(back[0]["exp_avg"], value[0]["exp_avg"])
    assert back["tied"][0] is back["tied"][1]  # one tensor stored once
    assert isinstance(back["np"][0], np.float32) and back["np"][1].dtype == np.int16
    assert back["dtype"] is torch.bfloat16 and back[codec.TAG] == value[codec.TAG]


def test_corrupt_latest_falls_back_with_a_logged_finding(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt", keep=2)
    state = make_loop()
    for step in (1, 2, 3):
        train(state, 1)
        ckpt.save(step, state)
    assert ckpt.steps() == [2, 3]  # retention
    damaged = tmp_path / "ckpt" / "step-3" / "state.safetensors"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x40
    damaged.write_bytes(bytes(data))
    fresh = make_loop(seed=5)
    with caplog.at_level("INFO", logger="trainguard.checkpoint"):
        assert Checkpointer(tmp_path / "ckpt").load_latest(fresh) == 2
    assert fresh["counter"].seen == 8
    (finding,) = [f for f in caplog.records if "C101" in f.getMessage()]
    assert "state.safetensors" in finding.getMessage() and finding.levelname == "ERROR"


def test_async_save_captures_the_state_before_returning(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt", async_save=True)
    state = make_loop()
    train(state, 2)
    saved = {k: v.clone() for k, v in state["model"].state_dict().items()}
    handle = ckpt.save(2, state)
    with torch.no_grad():  # the loop goes on at once, changing weights and counters in place
        for p in state["model"].parameters():
            p.mul_(-3.0)
    state["counter"].seen = -1
    assert handle.wait(timeout=60) == str(tmp_path / "ckpt" / "step-2")
    ckpt.close()
    fresh = make_loop(seed=3)
    assert Checkpointer(tmp_path / "ckpt").load_latest(fresh) == 2
    assert fresh["counter"].seen == 8
    for k, v in fresh["model"].state_dict().items():
        assert torch.equal(v, saved[k]), k


FULL_DISK = textwrap.dedent(
    """
    import resource, signal, sys, torch
    from trainguard.checkpoint.checkpointer import Checkpointer
    from trainguard.errors import StorageError

    root, mode = sys.argv[1], sys.argv[2]
    ckpt = Checkpointer(root, async_save=(mode == "async"))
    small, big = {"w": torch.zeros(10)}, {"w": torch.zeros(200_000)}
    first = ckpt.save(1, small)
    if mode == "async":
        first.wait()
    # A real kernel limit: writes past 100 kB fail with EFBIG, as on a full disk.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    try:
        handle = ckpt.save(2, big)
        if mode == "async":
            ckpt.close()  # never waited for: close raises the background error
        print("SAVED")
    except StorageError as e:
        print(e)
    """
)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_full_disk_keeps_the_previous_checkpoint(tmp_path: Path, mode: str) -> None:
    root = tmp_path / "ckpt"
    res = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(root), mode], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert "C106" in res.stdout and "file size limit" in res.stdout, res.stdout
    assert sorted(p.name for p in root.iterdir()) == ["step-1"]
    state = {"w": torch.ones(10)}
    assert Checkpointer(root).load_latest(state) == 1 and torch.equal(state["w"], torch.zeros(10))


class RunLayout:
    """The layout hook as `trainguard run` would use it: its own file names (eval and report
    read model.safetensors and loader.json directly)."""

    name = "run-like/1"

    def snapshot(self, parts, rng, copy):
        by = {p.key: p for p in parts}
        model = by["model"].value
        return model, dict(by["loader"].value), rng[0]["torch_cpu"].clone()

    def write(self, folder: Path, snapshot) -> None:
        model, loader, rng = snapshot
        save_model(model, str(folder / "model.safetensors"))
        (folder / "loader.json").write_text(json.dumps(loader))
        codec.write_state(folder, "rng", *codec.encode([{"torch_cpu": rng}], "rng"))

    def read(self, folder: Path, parts, state, step):
        by = {p.key: p for p in parts}
        load_model(by["model"].value, str(folder / "model.safetensors"))
        state["loader"] = json.loads((folder / "loader.json").read_text())
        rng = codec.read_state(folder, "rng")
        return [{**capture_now(), **rng[0]}]


def capture_now() -> dict:
    from trainguard.checkpoint.rng import capture_rng

    return capture_rng()


def test_layout_hook_keeps_an_existing_file_layout(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)
    ckpt = Checkpointer(tmp_path / "run", layout=RunLayout())
    ckpt.save(4, {"model": model, "loader": {"epoch": 0, "position": 16}})
    folder = tmp_path / "run" / "step-4"
    assert {"model.safetensors", "loader.json", MANIFEST} <= {p.name for p in folder.iterdir()}
    eval_model = nn.Linear(3, 2)
    load_model(eval_model, str(folder / "model.safetensors"))  # what `trainguard eval` does
    assert torch.equal(eval_model.weight, model.weight)
    state = {"model": nn.Linear(3, 2), "loader": {}}
    assert Checkpointer(tmp_path / "run", layout=RunLayout()).load_latest(state) == 4
    assert state["loader"] == {"epoch": 0, "position": 16}
    assert torch.equal(state["model"].weight, model.weight)
    with pytest.raises(BadInputError, match="layout"):  # the default layout cannot read it
        Checkpointer(tmp_path / "run").load_latest({"model": nn.Linear(3, 2), "loader": {}})


class CheckingLayout(RunLayout):
    """RunLayout that reads its steps against the caller's objects first (as `run`'s does)."""

    def __init__(self, bad: set[int]) -> None:
        self.bad = bad

    def check(self, folder: Path, parts, step: int) -> list:
        from trainguard.checkpoint.inventory import unloadable

        return (
            [unloadable(step, folder, "loader.json", "it does not fit")] if step in self.bad else []
        )


def test_layout_check_passes_a_step_over_and_the_meta_comes_back(tmp_path: Path) -> None:
    model = nn.Linear(3, 2)
    ckpt = Checkpointer(tmp_path / "run", keep=5, layout=CheckingLayout(bad=set()))
    for s in (4, 8):
        ckpt.save(s, {"model": model, "loader": {"position": s}}, meta={"data": {"v": s}})
    state = {"model": nn.Linear(3, 2), "loader": {}}
    reader = Checkpointer(tmp_path / "run", layout=CheckingLayout(bad={8}))
    assert reader.load_latest(state) == 4  # step 8 verifies but does not fit: passed over
    assert [(f.code, f.step) for f in reader.last_findings if f.code == "C111"] == [("C111", 8)]
    assert state["loader"] == {"position": 4}
    assert reader.last_meta["data"] == {"v": 4} and reader.last_path.name == "step-4"
    assert "checkpointer" in reader.last_meta  # its own entry stays beside the caller's


class Evil:
    """What an attacker plants: a pickle that runs a shell command when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_planted_dcp_metadata_is_refused_and_never_runs(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    ckpt = Checkpointer(root, sharded=True, keep=2)  # DCP, one process
    model = nn.Linear(4, 4)
    for step in (0, 1, 2):
        ckpt.save(step, {"model": model, "epoch": step})
    ckpt.close()  # waits for retention, which runs after each sharded save's commit
    assert ckpt.steps() == [1, 2]
    folder = root / "step-2"
    read_dcp_metadata(folder / ".metadata")  # DCP's own metadata is accepted
    evil = pickle.dumps(Evil(tmp_path / "pwned-check"))
    pickle.loads(evil)  # the payload is live: a bare pickle.load runs it
    assert (tmp_path / "pwned-check").exists()

    (folder / ".metadata").write_bytes(pickle.dumps(Evil(tmp_path / "pwned")))
    # The attacker can also rewrite the manifest, so the checksums match.
    old = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_bytes(manifest_bytes(build_manifest(folder, 2, old["meta"])))
    with pytest.raises(UnsafeCheckpointError):
        read_dcp_metadata(folder / ".metadata")
    state = {"model": nn.Linear(4, 4), "epoch": 0}
    loader = Checkpointer(root)
    assert loader.load_latest(state) == 1 and state["epoch"] == 1
    (finding,) = [f for f in loader.last_findings if f.code == "C120"]
    assert "posix.system" in finding.message and finding.step == 2
    assert not (tmp_path / "pwned").exists()
    assert torch.equal(state["model"].weight, model.weight)
    # The refused step is evidence: the next save's retention quarantines it, never deletes.
    loader.save(3, state)
    loader.close()
    assert ckpt.steps() == [1, 3] and (root / QUARANTINE / "step-2" / ".metadata").exists()


def test_missing_shard_falls_back_naming_the_file_and_rank(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    model = nn.Linear(4, 4)
    ckpt = Checkpointer(root, sharded=True)
    ckpt.save(1, {"model": model})
    first = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ckpt.save(2, {"model": model})
    ckpt.close()  # retention runs after each sharded save: not while the test damages a step
    (root / "step-2" / "__0_0.distcp").unlink()
    state = {"model": nn.Linear(4, 4)}
    loader = Checkpointer(root)
    assert loader.load_latest(state) == 1
    (finding,) = [f for f in loader.last_findings if f.code == "C103"]
    assert "__0_0.distcp" in finding.message and finding.rank == 0
    assert torch.equal(state["model"].weight, first)


def test_all_checkpoints_damaged_refuses_to_start_over(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    ckpt = Checkpointer(root)
    for step in (1, 2):
        ckpt.save(step, {"w": torch.full((100,), float(step))})
    for step in (1, 2):
        (root / f"step-{step}" / "state.safetensors").write_bytes(b"garbage")
    state = {"w": torch.zeros(100)}
    with pytest.raises(NoUsableCheckpoint) as e:
        Checkpointer(root).load_latest(state)
    assert "C107" in e.value.message and "new folder" in e.value.fix
    assert {f.code for f in e.value.findings} >= {"C102", "C107"}
    assert torch.equal(state["w"], torch.zeros(100))
    assert sorted(p.name for p in root.iterdir()) == ["step-1", "step-2"]  # nothing moved
