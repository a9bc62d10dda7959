"""Checkpoint messages fit their reader: what a Checkpointer in the user's own loop is told
names the Checkpointer's folder and options, what `trainguard run` is told names the run's
flags (--fresh) and recipe keys, and the registry entries (docs/codes.md) say both."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runhelpers import invoke_cli
from trainguard import Checkpointer
from trainguard.codes import all_codes, get_code
from trainguard.errors import NoUsableCheckpoint, StorageError


def test_a_checkpointer_with_no_usable_step_is_told_what_to_do_with_its_own_folder(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ckpt"
    ckpt = Checkpointer(root)
    for step in (1, 2):
        ckpt.save(step, {"w": torch.full((10,), float(step))})
        (root / f"step-{step}" / "state.safetensors").write_bytes(b"garbage")
    with pytest.raises(NoUsableCheckpoint) as e:
        Checkpointer(root).load_latest({"w": torch.zeros(10)})
    fix = e.value.fix
    assert "C107" in e.value.message
    assert "--fresh" not in fix and "trainguard run" not in fix  # not this reader's tool
    assert "load_latest" in fix and f"a good copy of a step from backup into {root}" in fix
    assert "giving a Checkpointer a new folder" in fix


def test_a_checkpointer_on_a_file_is_told_about_its_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(StorageError) as e:
        Checkpointer(tmp_path / "file")
    assert "the Checkpointer's path" in e.value.fix and "checkpoint.dir" in e.value.fix


@pytest.mark.slow  # a tiny run of its own; test_run_refusals checks C107's refusal in the run
def test_the_run_with_no_usable_step_names_fresh_though_the_entry_says_both(
    tiny_recipe: Path, tiny_run_copy: Path
) -> None:
    c107 = get_code("C107").fix  # docs/codes.md: both readers
    assert "--fresh" in c107 and "In your own loop" in c107 and "Checkpointer" in c107
    for step in (4, 8, 12):
        (tiny_run_copy / "checkpoints" / f"step-{step}" / "state.safetensors").write_bytes(b"x")
    res = invoke_cli("run", str(tiny_recipe), "--run-dir", str(tiny_run_copy), "-q")
    assert res.returncode == 1, res.stderr[-2000:]
    fix = res.stderr[res.stderr.rindex("fix:") :]  # the refusal's own fix, last
    assert "trainguard run --fresh" in fix and "RUN_DIR/attic" in fix
    assert "Checkpointer" not in fix and "load_latest" not in fix


def test_checkpoint_codes_naming_a_run_setting_name_the_checkpointers_too() -> None:
    # A fix naming a recipe key or a run flag also names the Checkpointer's way, and back.
    for code in all_codes():
        if not code.code.startswith("C") or code.code in ("C113", "C150"):  # run-only events
            continue
        run_words = ("checkpoint.dir", "checkpoint.interval", "--fresh", "--run-dir")
        if any(w in code.fix for w in (*run_words, "retry attempts", "stagger")):
            assert "Checkpointer" in code.fix, code.code
