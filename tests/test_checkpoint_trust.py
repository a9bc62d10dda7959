"""Checkpoints are untrusted data: manifest paths stay inside their folder, nothing that failed
verification is ever deleted (quarantine), junk in the checkpoint root never crashes anything,
a checkpoint that verifies but cannot be loaded falls back, and every command that reads a
checkpoint verifies it. The run-level cases use copies of the session's finished tiny run."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from runhelpers import forge_manifest, invoke_cli
from trainguard.checkpoint import CheckpointStore
from trainguard.checkpoint.layout import classify
from trainguard.checkpoint.manifest import MANIFEST, build_manifest, manifest_bytes
from trainguard.cli import app
from trainguard.codes import all_codes
from trainguard.util.hashing import bytes_checksum, file_checksum

runner = CliRunner()


def payload(step: int):
    def write(folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(bytes((step + i) % 251 for i in range(2000)))
        (folder / "loader.json").write_text(json.dumps({"position": step}))
        (folder / "sub").mkdir()
        (folder / "sub" / "rng.pt").write_bytes(b"rng" * step)

    return write


def codes(findings) -> list[str]:
    return [f.code for f in findings]


def flip_byte(path: Path, offset: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def forge(folder: Path, step: int, files: dict[str, dict]) -> None:
    (folder / MANIFEST).write_bytes(forge_manifest(step, files))


def reseal(folder: Path) -> None:
    """Rewrite a checkpoint's manifest for its current files: it verifies again."""
    old = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).unlink()
    manifest = build_manifest(folder, old["step"], old["meta"])
    (folder / MANIFEST).write_bytes(manifest_bytes(manifest))


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# -- manifest entries are plain relative paths inside the folder ---------------------------------


@pytest.mark.parametrize("name", ["../../outside.bin", "sub/../../../outside.bin", "ABSOLUTE"])
def test_manifest_names_outside_the_folder_are_refused(tmp_path: Path, name: str) -> None:
    store = CheckpointStore(str(tmp_path / "ckpts"))
    store.save(1, payload(1))
    store.save(2, payload(2))
    outside = tmp_path / "outside.bin"  # a real file, right size and checksum
    outside.write_bytes(b"secret" * 10)
    name = str(outside) if name == "ABSOLUTE" else name
    entry = {"size": outside.stat().st_size, "checksum": file_checksum(outside)}
    forge(tmp_path / "ckpts" / "step-2", 2, {name: entry})
    assert codes(store.verify(2)) == ["C108"]
    loaded = store.load_latest()
    assert loaded.step == 1 and codes(loaded.findings) == ["C108"]
    assert name in loaded.findings[0].message


@pytest.mark.timeout(60)  # the old code read /dev/zero and the FIFO forever
def test_symlinks_devices_and_fifos_are_never_read(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    store = CheckpointStore(str(root), keep=5)
    for s in (1, 2, 3, 4, 5):
        store.save(s, payload(s))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # step 2: model.safetensors is a symlink to an identical copy outside the folder
    model2 = root / "step-2" / "model.safetensors"
    (elsewhere / "model.safetensors").write_bytes(model2.read_bytes())
    model2.unlink()
    model2.symlink_to(elsewhere / "model.safetensors")
    # step 3: the folder `sub` is a symlink to an identical copy outside
    os.rename(root / "step-3" / "sub", elsewhere / "sub")
    (root / "step-3" / "sub").symlink_to(elsewhere / "sub")
    # step 4: a manifest entry for an absolute device path
    forge(root / "step-4", 4, {"/dev/zero": {"size": 0, "checksum": "0" * 32}})
    # step 5: a FIFO where the manifest expects an empty file
    os.mkfifo(root / "step-5" / "pipe")
    forge(root / "step-5", 5, {"pipe": {"size": 0, "checksum": bytes_checksum(b"")}})
    assert codes(store.verify(4)) == ["C108"]
    assert codes(store.verify(5)) == ["C109"] and "FIFO" in store.verify(5)[0].message
    assert codes(store.verify(2)) == ["C109"] and "symbolic link" in store.verify(2)[0].message
    assert codes(store.verify(3)) == ["C109"]
    loaded = store.load_latest()
    assert loaded.step == 1
    assert sorted(codes(loaded.findings)) == ["C108", "C109", "C109", "C109"]


# -- quarantine, never delete --------------------------------------------------------------------


def test_retention_quarantines_failed_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    store = CheckpointStore(str(root), keep=2)
    for s in (1, 2, 3):
        store.save(s, payload(s))
    flip_byte(root / "step-3" / "model.safetensors")
    evidence = (root / "step-3" / "model.safetensors").read_bytes()
    assert store.load_latest().step == 2  # step 3 failed verification (C101)
    # The old code kept 4 and the corrupt 3 and deleted 2, the state the run resumed from.
    info = store.save(4, payload(4))
    assert store.steps() == [2, 4] and info.deleted == []
    assert (root / "quarantine" / "step-3" / "model.safetensors").read_bytes() == evidence
    assert "C112" in codes(info.findings)
    # Saving over a step that failed verification moves it aside first.
    flip_byte(root / "step-4" / "model.safetensors")
    assert store.load_latest().step == 2
    store.save(4, payload(4))
    assert store.verify(4) == [] and (root / "quarantine" / "step-4" / MANIFEST).is_file()
    # A structurally damaged old step goes to quarantine too, under a free name.
    (root / "step-2" / "loader.json").write_text("{}")
    store.save(5, payload(5))
    assert store.steps() == [4, 5]
    assert (root / "quarantine" / "step-2" / "loader.json").read_text() == "{}"
    store.load_latest()  # the quarantine folder is never scanned nor warned about
    assert codes(store.last_findings) == []


def test_junk_in_the_checkpoint_root_is_ignored_with_one_warning_each(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    store = CheckpointStore(str(root))
    store.save(1, payload(1))
    store.save(2, payload(2))
    import shutil

    shutil.copytree(root / "step-2", root / "step-0020")  # not the canonical name of step 20
    shutil.copytree(root / "step-2", root / "step-20.bak")
    (root / "step-old").mkdir()
    (root / "step-5").write_text("a file, not a folder")
    shutil.copytree(root / "step-1", root / "step-7")
    (root / "step-7" / MANIFEST).unlink()  # a step folder without a manifest
    assert store.steps() == [1, 2]
    loaded = store.load_latest()
    assert loaded.step == 2
    warned = sorted(f.where.rsplit("/", 1)[-1] for f in loaded.findings if f.code == "C110")
    assert warned == ["step-0020", "step-20.bak", "step-5", "step-old"]
    assert all(f.severity == "warning" for f in loaded.findings if f.code == "C110")
    (c104,) = [f for f in loaded.findings if f.code == "C104"]
    assert c104.step == 7 and "manifest" in c104.message
    assert [f.code for f in store.load_latest().findings] == ["C104"]  # warned once only


def test_no_fix_text_advises_deleting_a_folder() -> None:
    advice = re.compile(
        r"\b(delete|remove|rm)\b(\s+[^\s,;.]+){0,3}?\s+(folders?|directory|dir)\b"
        r"|\bdelete\s+(it|them|the)\b|\brm\s+-r",
        re.I,
    )
    bad = [c.code for c in all_codes() if advice.search(c.fix)]
    assert bad == []


# -- atomic writes never follow a planted symlink ------------------------------------------------


def test_atomic_writes_and_checkpoint_temps_never_follow_planted_symlinks(tmp_path: Path) -> None:
    from trainguard.train.rundir import ensure_writable
    from trainguard.util.atomic import atomic_write_text

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    pid = os.getpid()
    # The names the old code opened with a plain open(): predictable from the pid.
    (run / f".report.html.tmp-{pid}").symlink_to(victim)
    (run / f".write-probe-{pid}").symlink_to(victim)
    atomic_write_text(run / "report.html", "<html>")
    ensure_writable(run)
    assert victim.read_text() == "precious"
    assert (run / "report.html").read_text() == "<html>" and not (run / "report.html").is_symlink()
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    (victim_dir / "keep.txt").write_text("keep")
    root = tmp_path / "ckpts"
    store = CheckpointStore(str(root))
    store.save(1, payload(1))
    (root / f".tmp-step-2-{pid}").symlink_to(victim_dir)
    (root / f".trash-step-1-{pid}").symlink_to(victim_dir)
    store.save(2, payload(2))
    store.save(1, payload(1))  # saved again: the old step-1 is replaced
    assert store.steps() == [1, 2] and store.verify(1) == [] and store.verify(2) == []
    assert [p.name for p in victim_dir.iterdir()] == ["keep.txt"]


# -- a checkpoint that verifies but cannot be loaded ---------------------------------------------


def _tiny_training_state():
    from trainguard.config.load import recipe_to_dict, validate_recipe
    from trainguard.model.gpt import GPT
    from trainguard.train.optim import build_optimizer

    recipe = validate_recipe(
        {
            "model": {"n_layers": 1, "d_model": 16, "n_heads": 2},
            "data": {"seq_len": 8},
            "train": {"optimizer": "adamw"},
        }
    )
    torch.manual_seed(0)
    model = GPT(recipe.model, vocab_size=32, seq_len=8)
    optimizer = build_optimizer(recipe, model)
    model(torch.randint(0, 32, (2, 8))).sum().backward()
    optimizer.step()
    return recipe, model, optimizer, recipe_to_dict(recipe)


def edit_state(folder: Path, change) -> None:
    """Rewrite a step's state.json / state.safetensors through `change(doc, tensors)` and
    reseal its manifest: the step verifies, with content anyone who can write it could put."""
    from safetensors.torch import load_file, save_file

    doc = json.loads((folder / "state.json").read_text())
    tensors = load_file(folder / "state.safetensors")
    change(doc, tensors)
    save_file(tensors, str(folder / "state.safetensors"))
    (folder / "state.json").write_text(json.dumps(doc))
    reseal(folder)


def test_unloadable_checkpoints_fall_back_naming_the_file(tmp_path: Path) -> None:
    from loophelpers import run_checkpointer, run_state
    from trainguard import ElasticSampler
    from trainguard.train.run_state import RunState

    recipe, model, optimizer, _ = _tiny_training_state()
    root = tmp_path / "ckpts"
    checkpointer = run_checkpointer(root)
    progress = RunState()
    sampler = ElasticSampler(100, global_batch_size=2, seed=0)
    state = run_state(model, optimizer, sampler, progress=progress)
    saved = {}
    for s in (1, 2, 3, 4):
        progress.step = s
        with torch.no_grad():  # every step's weights differ: a half-loaded model would show
            next(model.parameters()).add_(1.0)
        saved[s] = {k: v.clone() for k, v in model.state_dict().items()}
        checkpointer.save(s, state)

    def wrong_weight(doc: dict, tensors: dict) -> None:  # a tensor of another shape
        key = next(k for k in tensors if k.startswith("state['model']"))
        tensors[key] = torch.zeros(3, 3)

    def wrong_moment(doc: dict, tensors: dict) -> None:  # a moment of the wrong shape
        key = next(k for k in tensors if k.startswith("state['optimizer']") and "exp_avg" in k)
        tensors[key] = torch.zeros(3, 3)

    def wrong_counter(doc: dict, tensors: dict) -> None:
        doc["values"]["run"]["step"] = "two"

    edit_state(root / "step-4", wrong_weight)
    edit_state(root / "step-3", wrong_moment)
    edit_state(root / "step-2", wrong_counter)
    # Checking a step reads its files against the model and changes nothing.
    before = {k: v.clone() for k, v in model.state_dict().items()}
    parts = classify(state)
    assert codes(checkpointer.layout.check(root / "step-4", parts, 4)) == ["C111"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    assert checkpointer.load_latest(state) == 1
    found = {f.step: f.message for f in checkpointer.last_findings if f.code == "C111"}
    assert sorted(found) == [2, 3, 4]
    assert "state['model']" in found[4] and "state['optimizer']" in found[3]
    assert "state['run']" in found[2]
    assert all(torch.equal(saved[1][k], v) for k, v in model.state_dict().items())
    assert progress.step == 1


def test_rollback_falls_back_past_a_state_that_does_not_decode(tmp_path: Path) -> None:
    from loophelpers import context, run_checkpointer, run_state
    from trainguard import ElasticSampler
    from trainguard.guard.core import Guard
    from trainguard.guard.decision import Decision
    from trainguard.train import actions
    from trainguard.train.callback import Callbacks
    from trainguard.train.loop import Loop
    from trainguard.train.run_state import RunState

    _, model, optimizer, _ = _tiny_training_state()
    root = tmp_path / "ckpts"
    checkpointer = run_checkpointer(root, keep=5)
    sampler = ElasticSampler(100, global_batch_size=2, seed=0)
    progress, guard, callbacks = RunState(), Guard(), Callbacks([])
    state = run_state(model, optimizer, sampler, progress=progress, guard=guard)
    for s in (4, 8):
        progress.step = s
        checkpointer.save(s, state)

    def foreign(doc: dict, tensors: dict) -> None:  # what a pickle would hold: an object
        doc["values"]["optimizer"] = {"__tg__": "object", "class": "argparse.Namespace"}

    edit_state(root / "step-8", foreign)
    ctx = context(tmp_path / "run", model, optimizer)
    ctx.progress = progress
    progress.step = 9
    loop = Loop(ctx, None, sampler, guard, checkpointer, callbacks, state)  # type: ignore[arg-type]
    actions.roll_back(loop, Decision(9, "rollback", []))
    assert ctx.step == 4
    (c111,) = [f for f in ctx.findings if f.code == "C111"]
    assert c111.step == 8 and "state['optimizer']" in c111.message


# -- whole runs: refuse to start over silently, --fresh, unloadable checkpoints ------------------


def test_every_checkpoint_corrupt_refuses_then_fresh_sets_the_run_aside(
    tiny_recipe: Path, tiny_run_copy: Path
) -> None:
    run = tiny_run_copy
    ckpts = run / "checkpoints"
    flip_byte(ckpts / "step-12" / "state.safetensors")
    with open(ckpts / "step-8" / "state.safetensors", "r+b") as f:
        f.truncate(100)
    (ckpts / "step-4" / "state.json").write_text('{"values": {}}')
    (run / ".lock").write_text("held by another helper's lock")
    lock_inode = (run / ".lock").stat().st_ino
    metrics = (run / "metrics.jsonl").read_bytes()
    folders = tree_digest(ckpts)
    res = invoke_cli("run", str(tiny_recipe), "--run-dir", str(run), "-q")
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "C107" in res.stderr, res.stderr
    for step, why in ((4, "state.json"), (8, "state.safetensors"), (12, "state.safetensors")):
        assert re.search(rf"step {step}\b[^;]*{re.escape(why)}", res.stderr), res.stderr
    assert "--fresh" in res.stderr
    assert (run / "metrics.jsonl").read_bytes() == metrics
    assert tree_digest(ckpts) == folders
    res = invoke_cli(
        "run", str(tiny_recipe), "--run-dir", str(run), "-q", "--json", "--fresh",
        "--set", "train.max_steps=4",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    payload = json.loads(res.stdout)
    assert payload["resumed_from"] is None and payload["final_step"] == 4
    (attic,) = (run / "attic").iterdir()
    assert (attic / "metrics.jsonl").read_bytes() == metrics
    assert tree_digest(attic / "checkpoints") == folders
    # The run's lock (util/runlock.py) rewrites its holder record, but --fresh never moves it.
    assert (run / ".lock").stat().st_ino == lock_inode
    assert not (attic / ".lock").exists()
    assert "C113" in [f["code"] for f in payload["findings"]]


def test_run_falls_back_past_checkpoints_that_verify_but_cannot_be_loaded(
    tiny_recipe: Path, tiny_run_copy: Path
) -> None:
    run = tiny_run_copy
    ckpts = run / "checkpoints"
    edit_state(ckpts / "step-12", lambda doc, t: doc["values"].update(optimizer=[1, 2]))
    (ckpts / "step-8" / "state.json").write_text("{not json")
    reseal(ckpts / "step-8")
    res = invoke_cli(
        "run", str(tiny_recipe), "--run-dir", str(run), "-q", "--json",
        "--set", "train.max_steps=6",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert "weights_only" not in res.stdout + res.stderr and "Traceback" not in res.stderr
    payload = json.loads(res.stdout)
    assert payload["resumed_from"] == 4 and payload["final_step"] == 6
    named = {(f["step"], f["data"]["file"]) for f in payload["findings"] if f["code"] == "C111"}
    assert named == {(12, "state.json"), (8, "state.json")}
    # Retention after the save at step 6 moved both aside instead of keeping or deleting them.
    assert sorted(p.name for p in (ckpts / "quarantine").iterdir()) == ["step-12", "step-8"]
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith("step-")) == [
        "step-4",
        "step-6",
    ]


# -- the commands that read checkpoints: eval, check-tokenizer, report ---------------------------


def test_eval_and_check_tokenizer_verify_and_fall_back(tiny_run_copy: Path) -> None:
    run = tiny_run_copy
    step12 = run / "checkpoints" / "step-12"
    flip_byte(step12 / "state.safetensors")
    res = runner.invoke(app, ["eval", str(run), "--max-examples", "4", "--json"])
    out = json.loads(res.stdout)
    assert out["checkpoint"].endswith("step-8") and "C101" in [f["code"] for f in out["findings"]]
    res = runner.invoke(app, ["eval", str(step12), "--max-examples", "4", "--json"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)
    assert [f["code"] for f in json.loads(res.stdout)["findings"]] == ["C101"]
    tok = str(run / "tokenizer.json")
    res = runner.invoke(app, ["check-tokenizer", tok, "--checkpoint", str(step12), "--json"])
    assert res.exit_code == 1 and "C101" in [f["code"] for f in json.loads(res.stdout)["findings"]]
    res = runner.invoke(app, ["check-tokenizer", tok, "--checkpoint", str(run), "--json"])
    out = json.loads(res.stdout)
    assert "C101" in [f["code"] for f in out["findings"]]
    assert out["undertrained"]["checkpoint"].endswith("step-8")
    with open(step12 / "state.safetensors", "r+b") as f:
        f.truncate(50)  # the old code: a safetensors traceback
    res = runner.invoke(app, ["eval", str(step12), "--json"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)
    assert [f["code"] for f in json.loads(res.stdout)["findings"]] == ["C102"]


def test_report_survives_junk_and_shows_corrupt_checkpoints_invalid(tiny_run_copy: Path) -> None:
    from trainguard.report.build import collect, write_report

    run = tiny_run_copy
    ckpts = run / "checkpoints"
    flip_byte(ckpts / "step-12" / "state.safetensors")
    (ckpts / "step-old").mkdir()
    (ckpts / "step-20.bak").mkdir()
    (ckpts / "step-5").write_text("not a folder")
    rows = {str(c["step"]): c for c in collect(run)["checkpoints"]}
    assert rows["4"]["valid"] and rows["8"]["valid"] and not rows["12"]["valid"]
    assert "C101" in rows["12"]["problem"] and "state.safetensors" in rows["12"]["problem"]
    for junk in ("step-old", "step-20.bak", "step-5"):
        assert not rows[junk]["valid"] and "C110" in rows[junk]["problem"]
    _, md = write_report(run)
    assert "step 12: INVALID" in md.read_text()
