"""The Hugging Face adapter in real `transformers` Trainer runs on CPU (tiny GPT-2 on random
tokens, no download, default clipping `max_grad_norm=1.0`, default `logging_steps=500`).

The faults are in the data: the samples of step 12's batch make the loss NaN, those of step
30's multiply it by 1000 (both after the detectors' warm-up). Guarded, exactly those two updates
are skipped, at their own steps, bitwise (parameters and AdamW moments, with weight decay on);
unguarded (the same trainer, the guard disabled) the weights go NaN. Resume takes the newest
checkpoint that verifies (corrupt newer ones quarantined) with the guard's windows, and replays
bitwise; a rollback restores the last checkpoint and never trains on the bad samples again.
Two DDP processes on gloo agree on every decision, roll back a corrupted replica together and
name a rank that computes much slower (H202); a rank that hangs is named by the other (R301),
which exits 3 for a restart.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from runhelpers import judged_on_device  # noqa: E402
from trainguard.checkpoint.staging import one_thread  # noqa: E402
from trainguard.config.distributed import DistributedConfig  # noqa: E402
from trainguard.errors import ConfigError, CorruptError, RunHalted  # noqa: E402
from trainguard.guard.config import GuardsConfig  # noqa: E402
from trainguard.guard.core import Guard  # noqa: E402
from trainguard.integrations.hf import GuardedTrainer, TrainguardCallback  # noqa: E402
from trainguard.integrations.hf_checkpoints import verified_best  # noqa: E402

# One worker builds this file's session runs under `-n N --dist loadgroup`.
pytestmark = pytest.mark.xdist_group("hf-trainer")

NAN_STEP, SPIKE_STEP, STEPS, SAVE_EVERY = 12, 30, 40, 10
# States recorded after this many updates: around each poisoned step and around a clean one.
SNAP = (NAN_STEP, NAN_STEP + 1, 20, 21, SPIKE_STEP, SPIKE_STEP + 1)
# 12 steps of history before spikes are scored: a resume at step 20 without the saved windows
# would have seen only 10 by step 30, and the spike would be applied.
WARMUP = GuardsConfig(spike_min_history=12, spike_window=16)
ROLLBACK = {"R102": "rollback", "R103": "rollback"}  # spikes roll back instead of skipping


class Tokens(torch.utils.data.Dataset):
    """256 random 16-token samples; each batch carries its sample ids."""

    def __init__(self) -> None:
        self.x = torch.randint(0, 128, (256, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.x[i], "labels": self.x[i], "sample_id": torch.tensor(i)}


class Poisoned(GuardedTrainer):
    """Poisons the loss of any batch holding a bad sample; records what each step trained on."""

    nan_ids: set[int]
    spike_ids: set[int]
    seen: list[tuple[int, list[int], float]]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids = inputs.pop("sample_id").tolist()
        if return_outputs:  # an evaluation: neither recorded nor poisoned
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.seen.append((self.state.global_step, ids, loss.item()))
        if self.nan_ids & set(ids):
            loss = loss * math.nan
        if self.spike_ids & set(ids):
            loss = loss * 1000
        return loss


class Snapshots(transformers.TrainerCallback):
    """Parameters, AdamW state and the scheduler's count after the updates counted in SNAP."""

    def __init__(self) -> None:
        self.at: dict[int, dict[str, Any]] = {}

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if state.global_step in SNAP:
            moments = optimizer.state_dict()["state"]
            self.at[state.global_step] = {
                "params": [p.detach().clone() for p in model.parameters()],
                "moments": {k: {n: t.clone() for n, t in v.items()} for k, v in moments.items()},
                "lr_steps": kwargs["lr_scheduler"].last_epoch,
            }


def make_trainer(
    out: Path,
    *,
    guard: Guard | None = None,
    eval_dataset: Any = None,
    cls: type[Poisoned] | None = None,
    **overrides: Any,
) -> Poisoned:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=16, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    settings = dict(
        output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=4, save_steps=SAVE_EVERY,
        report_to=[], use_cpu=True, seed=0, learning_rate=1e-3, weight_decay=0.1,
        disable_tqdm=True, remove_unused_columns=False,
    )  # fmt: skip
    args = transformers.TrainingArguments(**{**settings, **overrides})
    guard = guard if guard is not None else Guard(run_dir=out, config=WARMUP)
    trainer = (cls or Poisoned)(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=Tokens(),
        eval_dataset=eval_dataset,
        guard=guard,
    )
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    sampler = trainer._get_train_sampler()
    trainer.nan_ids = set(sampler.batch_ids(NAN_STEP).tolist())
    trainer.spike_ids = set(sampler.batch_ids(SPIKE_STEP).tolist())
    trainer.seen = []
    return trainer


@dataclass
class Run:
    trainer: Poisoned
    out: Path
    snaps: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def params(self) -> list:
        return [p.detach().clone() for p in self.trainer.model.parameters()]

    def rows(self, kind: str) -> list[dict]:
        lines = (self.out / "guard.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == kind]

    def actions(self) -> list[tuple[int, str]]:
        return [(h["step"], h["action"]) for h in self.trainer.guard.history]


def train(out: Path, resume: Any = None, snapshots: bool = False, **kw: Any) -> Run:
    trainer = make_trainer(out, **kw)
    run = Run(trainer, out)
    if snapshots:
        cb = Snapshots()
        trainer.add_callback(cb)
        run.snaps = cb.at
    with one_thread():
        trainer.train(resume_from_checkpoint=resume)
    return run


@pytest.fixture(scope="session")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return train(tmp_path_factory.mktemp("hf_guarded"), snapshots=True)


def first_runs(seen: list[tuple]) -> tuple[list[tuple], list[int]]:
    """The computations of each step without the guard's reruns (the same samples again, right
    after the first, or after the next step's on the device path), and the steps rerun."""
    kept: list[tuple] = []
    reruns: list[int] = []
    for entry in seen:
        again = [k for k in kept[-2:] if list(k[1]) == list(entry[1])]
        if again:
            reruns.append(again[-1][0])
        else:
            kept.append(entry)
    return kept, reruns


def same(a: Any, b: Any) -> bool:
    """Bitwise equality of nested tensors (NaN-safe)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    return a == b


def test_exactly_the_poisoned_updates_are_skipped_at_their_own_steps(guarded: Run) -> None:
    assert guarded.actions() == [(NAN_STEP, "skip"), (SPIKE_STEP, "skip")]
    found = {(f["code"], f["step"]) for f in guarded.rows("finding") if f["severity"] != "info"}
    assert found == {("R101", NAN_STEP), ("R102", SPIKE_STEP), ("R103", SPIKE_STEP)} | {
        ("R206", NAN_STEP),  # each rerun on its batch: the same again, the data's fault
        ("R206", SPIKE_STEP),
    }
    # The norm judged is the one before the Trainer clips to max_grad_norm=1.0.
    (r103,) = [f for f in guarded.rows("finding") if f["code"] == "R103"]
    assert r103["data"]["value"] > 100 * guarded.trainer.args.max_grad_norm
    s = guarded.snaps
    for step in (NAN_STEP, SPIKE_STEP):  # no parameter, moment, weight-decay or count change
        assert same(s[step]["params"], s[step + 1]["params"])
        assert same(s[step]["moments"], s[step + 1]["moments"])
        assert s[step + 1]["lr_steps"] == s[step]["lr_steps"] + 1  # the schedule moves on
    assert not same(s[20]["params"], s[21]["params"])  # a clean step does update
    assert not same(s[20]["moments"], s[21]["moments"])
    assert guarded.trainer.state.global_step == STEPS
    assert all(p.isfinite().all() for p in guarded.params)


def test_train_loss_averages_the_applied_updates_only(guarded: Run) -> None:
    """The Trainer's own `train_loss` averages in the skipped 1000x spike (and a stand-in for
    the NaN); GuardedTrainer's leaves both out and keeps the Trainer's beside it."""
    summary = guarded.trainer.state.log_history[-1]
    applied = [loss for step, _, loss in guarded.trainer.seen if step not in (NAN_STEP, SPIKE_STEP)]
    assert len(applied) == STEPS - 2
    assert summary["train_loss"] == pytest.approx(sum(applied) / len(applied), rel=1e-5)
    assert summary["train_loss_with_skipped"] > 10 * summary["train_loss"]  # the spike's share
    assert summary["train_loss_skipped_updates"] == 2
    skipped = guarded.trainer.skipped_updates
    assert skipped is not None and skipped["count"] == 2
    assert skipped["steps"] == [NAN_STEP, SPIKE_STEP]
    assert skipped["train_loss_average"].startswith("excludes")


def test_unguarded_control_run_goes_nan(tmp_path: Path) -> None:
    off = Guard(config=GuardsConfig(enabled=False))  # the same trainer and data, not guarded
    run = train(tmp_path, guard=off, max_steps=NAN_STEP + 2, save_strategy="no")
    assert run.actions() == []
    assert not all(p.isfinite().all() for p in run.params)


@pytest.fixture(scope="session")
def resumed(guarded: Run, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The guarded run's folder with checkpoints 30 and 40 corrupted, resumed with True."""
    out = tmp_path_factory.mktemp("hf_resumed") / "out"
    shutil.copytree(guarded.out, out)
    for step in (30, 40):
        weights = out / f"checkpoint-{step}" / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0x10  # one bit of the last weight
        weights.write_bytes(bytes(data))
    return train(out, resume=True)


def test_resume_skips_corrupt_checkpoints_to_the_newest_that_verifies(resumed: Run) -> None:
    findings = [(f.code, f.step) for f in resumed.trainer.checkpoint_findings]
    assert findings == [("C101", 40), ("C101", 30), ("C112", 40), ("C112", 30)]
    assert {r["code"] for r in resumed.rows("finding")} >= {"C101"}  # reported in guard.jsonl
    assert sorted(p.name for p in (resumed.out / "quarantine").iterdir()) == [
        "checkpoint-30",
        "checkpoint-40",
    ]
    assert resumed.trainer.seen[0][0] == 20  # resumed from checkpoint-20


def test_resume_keeps_the_guard_state_and_replays_bitwise(guarded: Run, resumed: Run) -> None:
    # The skip of step 12 comes back with the state; the spike at step 30 is caught only
    # because the detector windows were restored (10 steps since the resume < the warm-up).
    assert resumed.actions() == [(NAN_STEP, "skip"), (SPIKE_STEP, "skip")]
    assert same(resumed.params, guarded.params)
    first = {s: (ids, loss) for s, ids, loss in guarded.trainer.seen if s >= 20}
    assert {s: (ids, loss) for s, ids, loss in resumed.trainer.seen} == first


def test_resume_from_an_explicit_corrupt_checkpoint_is_refused(resumed: Run, tmp_path) -> None:
    bad = resumed.out / "quarantine" / "checkpoint-30"
    target = tmp_path / "checkpoint-30"
    shutil.copytree(bad, target)
    trainer = make_trainer(tmp_path)
    with pytest.raises(CorruptError, match="model.safetensors is corrupt"):
        trainer.train(resume_from_checkpoint=str(target))


def test_rollback_restores_the_last_checkpoint_and_skips_the_bad_samples(tmp_path: Path) -> None:
    run = train(tmp_path, guard=Guard(run_dir=tmp_path, config=WARMUP, actions=ROLLBACK),
                save_steps=8)  # fmt: skip
    assert run.actions() == [(NAN_STEP, "skip"), (SPIKE_STEP, "rollback")]
    (event,) = run.rows("event")
    assert (event["from_step"], event["to_step"], event["skipped_steps"]) == (SPIKE_STEP, 24, [30])
    seen, reruns = first_runs(run.trainer.seen)
    assert reruns == [NAN_STEP, SPIKE_STEP]  # each bad step rerun once on its batch (R206)
    steps = [s for s, _, _ in seen]
    assert steps == [*range(SPIKE_STEP + 1), *range(24, STEPS)]  # continued by itself
    second = seen[SPIKE_STEP + 1 :]
    replay = {s: (ids, loss) for s, ids, loss in second if s < SPIKE_STEP}
    assert replay == {s: (ids, loss) for s, ids, loss in seen[24:SPIKE_STEP]}  # bitwise
    bad = run.trainer.spike_ids
    after = [ids for s, ids, _ in second if s >= SPIKE_STEP]
    assert not any(bad & set(ids) for ids in after)  # never trained on again
    sampler = run.trainer.elastic_sampler
    assert after[0] == sampler.order.sample_ids(31 * 4, 4).tolist()  # step 30 reads block 31
    assert run.trainer.state.global_step == STEPS
    assert all(p.isfinite().all() for p in run.params)
    saved = json.loads((tmp_path / "checkpoint-32" / "trainguard_state.json").read_text())
    assert saved["sampler"]["skipped_positions"] == [[120, 124]]  # the skip is checkpointed
    assert saved["guard"]["rollbacks"] == 1


def test_a_halt_saves_nothing_more_and_raises(tmp_path: Path) -> None:
    no_rollbacks = WARMUP.model_copy(update={"max_rollbacks": 0})
    guard = Guard(run_dir=tmp_path, config=no_rollbacks, actions=ROLLBACK)
    trainer = make_trainer(tmp_path, guard=guard, max_steps=SPIKE_STEP + 1)
    with one_thread(), pytest.raises(RunHalted, match=f"halted the run at step {SPIKE_STEP}"):
        trainer.train()
    assert [(h["step"], h["action"]) for h in guard.history] == [(12, "skip"), (30, "halt")]
    # The last step's save (global_step = max_steps) was called off: the state after a halt
    # decision is never checkpointed.
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        "checkpoint-10",
        "checkpoint-20",
        "checkpoint-30",
    ]


def test_the_callback_alone_in_a_plain_trainer_is_refused(tmp_path: Path) -> None:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, use_cpu=True, report_to=[], disable_tqdm=True
    )
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=1, vocab_size=16, n_positions=8)
    tokens = torch.zeros(8, dtype=torch.long)
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config), args=args, callbacks=[TrainguardCallback()],
        train_dataset=[{"input_ids": tokens, "labels": tokens}],
    )  # fmt: skip
    with pytest.raises(ConfigError, match="GuardedTrainer"):
        trainer.train()


# -- retention: save_total_limit -----------------------------------------------------------------
def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x10
    path.write_bytes(bytes(data))


class CorruptAt(transformers.TrainerCallback):
    """Flips one byte of `checkpoint-N/model.safetensors` once `at` updates are done."""

    def __init__(self, out: Path, name: str, at: int) -> None:
        self.path, self.at = out / name / "model.safetensors", at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            _flip_byte(self.path)


def test_save_total_limit_quarantines_a_folder_that_fails_verification(tmp_path: Path) -> None:
    """The rotation lets checkpoint-2 go at the save of 6 and checkpoint-4 at 8: the corrupt
    checkpoint-2 is moved to quarantine/ (C101, C112), the sound checkpoint-4 is deleted."""
    trainer = make_trainer(tmp_path, max_steps=8, save_steps=2, save_total_limit=2)
    trainer.add_callback(CorruptAt(tmp_path, "checkpoint-2", at=3))
    with one_thread():
        trainer.train()
    trainer.guard.close()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-6", "checkpoint-8"]
    kept = tmp_path / "quarantine" / "checkpoint-2"
    assert sorted(p.name for p in (tmp_path / "quarantine").iterdir()) == ["checkpoint-2"]
    assert (kept / "manifest.json").exists()  # the evidence, whole
    rows = [json.loads(x) for x in (tmp_path / "guard.jsonl").read_text().splitlines()]
    found = [(r["code"], r["step"]) for r in rows if r.get("code", "").startswith("C")]
    assert found == [("C101", 2), ("C112", 2)]
    assert [(f.code, f.step) for f in trainer.checkpoint_findings] == found


class CorruptOnSave(transformers.TrainerCallback):
    """Flips one byte of `checkpoint-N/model.safetensors` right after the folder of step `at`
    is committed (this callback's `on_save` runs after trainguard's)."""

    def __init__(self, out: Path, at: int) -> None:
        self.out, self.at = out, at

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            _flip_byte(self.out / f"checkpoint-{self.at}" / "model.safetensors")


class FinalWeights(transformers.TrainerCallback):
    """The parameters after the last update, before the Trainer loads the best folder."""

    params: list | None = None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == args.max_steps:
            self.params = [p.detach().clone() for p in model.parameters()]


def best_at_end(out: Path, max_steps: int, *callbacks: transformers.TrainerCallback) -> Poisoned:
    """save_total_limit=1 with load_best_model_at_end, and the first folder the best: the
    "best" eval loss is the highest (greater_is_better), the untrained model's."""
    trainer = make_trainer(
        out, max_steps=max_steps, save_steps=2, save_total_limit=1, eval_strategy="steps",
        eval_steps=2, load_best_model_at_end=True, metric_for_best_model="loss",
        greater_is_better=True, eval_dataset=Tokens(),
    )  # fmt: skip
    for callback in callbacks:
        trainer.add_callback(callback)
    with one_thread():
        trainer.train()
    trainer.guard.close()
    return trainer


def test_the_end_of_training_quarantines_a_corrupt_folder_the_trainer_deletes(
    tmp_path: Path,
) -> None:
    """With save_total_limit=1 the Trainer deletes every folder but the best at the end,
    unverified: the corrupt last folder is moved to quarantine/ instead (C101, C112)."""
    trainer = best_at_end(tmp_path, 6, CorruptOnSave(tmp_path, at=6))
    assert trainer.state.best_model_checkpoint == str(tmp_path / "checkpoint-2")
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]
    assert sorted(p.name for p in (tmp_path / "quarantine").iterdir()) == ["checkpoint-6"]
    assert [(f.code, f.step) for f in trainer.checkpoint_findings] == [("C101", 6), ("C112", 6)]


def test_a_best_folder_that_fails_verification_is_not_loaded(tmp_path: Path) -> None:
    """load_best_model_at_end loads the best folder unverified: a corrupt one is quarantined
    and the model keeps its final weights; nothing else is deleted."""
    final = FinalWeights()
    trainer = best_at_end(tmp_path, 4, CorruptAt(tmp_path, "checkpoint-2", at=3), final)
    assert trainer.state.best_model_checkpoint is None
    assert final.params is not None and same(final.params, list(trainer.model.parameters()))
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-4"]
    assert sorted(p.name for p in (tmp_path / "quarantine").iterdir()) == ["checkpoint-2"]
    assert [(f.code, f.step) for f in trainer.checkpoint_findings] == [("C101", 2), ("C112", 2)]


def test_a_best_folder_that_is_gone_is_left_to_the_trainer(tmp_path: Path) -> None:
    """A best folder deleted from outside, or no checkpoint-N folder: nothing to verify or
    move (the Trainer says it cannot find it); one that is there and fails is named."""
    assert verified_best(str(tmp_path / "checkpoint-2")) == []
    assert verified_best(None) == []
    (tmp_path / "best").mkdir()
    assert verified_best(str(tmp_path / "best")) == []
    (tmp_path / "checkpoint-3").mkdir()  # no manifest: not a committed folder
    assert [f.step for f in verified_best(str(tmp_path / "checkpoint-3"))] == [3]


# -- gradient accumulation -----------------------------------------------------------------------
GA_NAN = 5  # the step whose second micro-batch holds a NaN sample


class MicroLosses(GuardedTrainer):
    """Records each micro-batch's loss as the Trainer has it (what `training_step` returns and
    the Trainer adds up for its log: already divided by the accumulation, or by the step's
    token count when the model takes `num_items_in_batch`); a batch holding a bad sample gets
    a NaN loss."""

    nan_ids: set[int]
    micro: list[tuple[int, float]]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids = set(inputs.pop("sample_id").tolist())
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return loss * math.nan if self.nan_ids & ids else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        step = self.state.global_step
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.micro.append((step, loss.item()))
        return loss


class EveryStep(transformers.TrainerCallback):
    """The parameters after every update (index = updates done)."""

    def __init__(self) -> None:
        self.params: dict[int, list] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.params[state.global_step] = [p.detach().clone() for p in model.parameters()]


def test_gradient_accumulation_judges_the_step_loss_and_skips_the_whole_step(
    tmp_path: Path,
) -> None:
    """gradient_accumulation_steps=2: the loss judged is the step's, the sum of its two
    micro-batches' losses as the Trainer has them (each already a share of the step's mean),
    the loss the Trainer itself logs for the step; a NaN in one micro-batch skips the whole
    step (both micro-batches' gradients, no update)."""
    from trainguard.metrics.jsonl import MetricsLog

    steps = MetricsLog(tmp_path, "steps.jsonl")  # every judged step's metrics, as sent
    guard = Guard(run_dir=tmp_path, config=WARMUP, sinks=[steps])
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=16, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=8, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, seed=0, learning_rate=1e-3, disable_tqdm=True, remove_unused_columns=False,
    )  # fmt: skip
    trainer = MicroLosses(
        model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Tokens(), guard=guard
    )
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    every = EveryStep()
    trainer.add_callback(every)
    sampler = trainer._get_train_sampler()
    assert sampler.global_batch_size == 8  # two micro-batches of 4 per optimizer step
    trainer.nan_ids = {int(sampler.batch_ids(GA_NAN)[5])}  # in the second micro-batch
    trainer.micro = []
    with one_thread():
        trainer.train()
    guard.close()

    rows = [json.loads(x) for x in steps.path.read_text().splitlines()]
    judged = {r["step"]: float(r["loss"]) for r in rows if r["kind"] == "step"}  # "nan" too
    logged = {h["step"] - 1: h["loss"] for h in trainer.state.log_history if "loss" in h}
    micro: dict[int, list[float]] = {}
    for step, loss in trainer.micro:
        micro.setdefault(step, []).append(loss)
    assert sorted(judged) == sorted(micro) == list(range(8))
    assert all(len(losses) == 2 for losses in micro.values())  # both micro-batches of a step
    for step in range(8):
        if step == GA_NAN:
            assert math.isnan(judged[step])
            continue
        assert judged[step] == pytest.approx(sum(micro[step]), rel=1e-6)  # not the last one's
        assert judged[step] == pytest.approx(logged[step], abs=1e-4)  # the Trainer rounds
        assert abs(judged[step] - 2 * micro[step][1]) > 1e-3  # the two shares differ
    assert not math.isnan(micro[GA_NAN][0])  # the first micro-batch alone was clean
    assert [(h["step"], h["action"]) for h in guard.history] == [(GA_NAN, "skip")]
    assert same(every.params[GA_NAN], every.params[GA_NAN + 1])  # the whole step skipped
    assert not same(every.params[GA_NAN - 1], every.params[GA_NAN])
    assert all(p.isfinite().all() for p in every.params[8])
    # train_loss: the 7 applied steps; the skipped one's clean first micro-batch left out too.
    applied = [judged[step] for step in range(8) if step != GA_NAN]
    summary = trainer.state.log_history[-1]
    assert summary["train_loss"] == pytest.approx(sum(applied) / 7, rel=1e-5)


# -- DDP: two gloo processes ---------------------------------------------------------------------
CTX = multiprocessing.get_context("fork")
FLIP_AT = 5  # rank 1's weights get one bit flipped after this update
SLOW_FROM = 7  # rank 1 computes much slower from this step on (after the rollback to 4)
HANG_AT = 6  # in the hung-rank test, rank 1 never finishes this step's forward


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:  # busy CPU time: a slow chip, not an idle one
        pass


class Flipping(Poisoned):
    """Rank 1 corrupts one weight once, after the update of step FLIP_AT (silent corruption),
    and is a slow rank from step `slow_from` on: 0.3 s of busy CPU time in every forward, over
    ten times a step of this model, so the straggler stays plain on a loaded machine. With
    `hang_at`, it never finishes that step's forward."""

    flipped = False
    slow_from: int | None = SLOW_FROM
    hang_at: int | None = None

    def training_step(self, model, inputs, num_items_in_batch=None):
        mine = self.args.process_index == 1 and not self.flipped
        if mine and self.state.global_step == FLIP_AT + 1:
            with torch.no_grad():
                w = next(self.model.parameters())
                w.view(-1)[:1].view(torch.int32)[0] ^= 1 << 12  # a mantissa bit
            self.flipped = True
        return super().training_step(model, inputs, num_items_in_batch)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        step = self.state.global_step  # inside GuardedTrainer's timed forward phase
        if self.args.process_index == 1 and step == self.hang_at:
            time.sleep(300)  # hung: the test stops this rank with SIGTERM, as a launcher would
        if self.args.process_index == 1 and self.slow_from is not None and step >= self.slow_from:
            _burn(0.3)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def _ddp_worker(rank: int, tmp: Path, port: int, hang_at: int | None = None) -> None:
    env = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": 2, "LOCAL_WORLD_SIZE": 2,
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}  # fmt: skip
    os.environ.update({k: str(v) for k, v in env.items()})
    torch.set_num_threads(1)
    out = tmp / "out"
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=10, per_device_train_batch_size=2, save_steps=4,
        report_to=[], use_cpu=True, seed=0, learning_rate=1e-3, disable_tqdm=True,
        remove_unused_columns=False, ddp_backend="gloo", ddp_find_unused_parameters=False,
    )  # fmt: skip
    assert args.world_size == 2  # sets up the process group the guard's part needs
    # Timings gathered every 2 steps, a straggler named after 2 steps behind (the run is short);
    # with hang_at, short timeouts so the hang is named soon.
    hang = {"collective_timeout_s": 5, "hang_timeout_s": 5} if hang_at is not None else {}
    guard = Guard(
        run_dir=tmp / f"rank{rank}", config=WARMUP,
        distributed=DistributedConfig(
            replica_check_interval=2, straggler_interval=2, straggler_steps=2, **hang
        ),
    )  # fmt: skip
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=128, n_positions=16, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    trainer = Flipping(
        model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Tokens(), guard=guard
    )
    if hang_at is not None:
        trainer.slow_from, trainer.hang_at = None, hang_at
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    sampler = trainer._get_train_sampler()
    # A NaN in rank 1's half of step 2's global batch only: both ranks must skip step 2.
    trainer.nan_ids = {int(sampler.batch_ids(2)[2])}
    trainer.spike_ids, trainer.seen = set(), []
    trainer.train()
    weights = [p.detach().flatten().tolist() for p in trainer.model.parameters()]
    seen, reruns = first_runs(trainer.seen)
    result = {"history": guard.history, "weights": weights, "step": trainer.state.global_step,
              "seen": [s for s, _, _ in seen], "reruns": reruns}  # fmt: skip
    (tmp / f"rank{rank}.json").write_text(json.dumps(result))
    guard.close()
    torch.distributed.destroy_process_group()


def _guard_rows(tmp: Path, rank: int) -> list[dict]:
    lines = (tmp / f"rank{rank}" / "guard.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def test_ddp_ranks_agree_roll_back_a_corrupted_replica_and_name_a_straggler(
    tmp_path: Path,
) -> None:
    port = _free_port()
    procs = [CTX.Process(target=_ddp_worker, args=(r, tmp_path, port)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    # Both ranks took every decision together: the rank-local NaN is skipped on both, the
    # replica check after the flip (step 6) rolls both back to checkpoint-4.
    assert r0["history"] == r1["history"]
    assert [(h["step"], h["action"]) for h in r0["history"]] == [(2, "skip"), (6, "rollback")]
    assert r0["seen"] == r1["seen"] == [*range(7), *range(4, 10)]
    assert r0["reruns"] == r1["reruns"] == [2]  # both ranks rerun the skipped step together
    assert r0["weights"] == r1["weights"]  # the replicas agree again
    assert r0["step"] == r1["step"] == 10
    rows = _guard_rows(tmp_path, 1)
    (h201,) = [r for r in rows if r.get("code") == "H201"]  # two replicas: no majority
    assert h201["step"] == 6 and h201["data"]["replica_set"] == [0, 1]
    # Rank 1 is slow from step 7 (after the rollback): behind in steps 7 and 8, named at 8, on
    # both ranks, once, as busy; rank 0, which also saves the checkpoints, is never named.
    for rank in (0, 1):
        h202 = [r for r in _guard_rows(tmp_path, rank) if r.get("code") == "H202"]
        assert [(r["rank"], r["step"]) for r in h202] == [(1, 8)], h202
        assert h202[0]["data"]["score"] < 0.5 and h202[0]["data"]["kind"] == "busy"


@pytest.mark.slow  # a hang waits out two timeouts; the straggler above runs by default
def test_ddp_hung_rank_is_named_and_the_others_exit_3(tmp_path: Path) -> None:
    port = _free_port()
    procs = [CTX.Process(target=_ddp_worker, args=(r, tmp_path, port, HANG_AT)) for r in range(2)]
    for p in procs:
        p.start()
    rank0, rank1 = procs
    rank0.join(180)
    try:
        assert rank0.exitcode == 3  # the hung-rank exit, for the launcher to restart the job
        assert rank1.is_alive()  # still asleep in its forward
    finally:
        if rank1.is_alive():
            os.kill(rank1.pid, signal.SIGTERM)  # what a launcher does to the job's other ranks
        rank1.join(30)
    (r301,) = [r for r in _guard_rows(tmp_path, 0) if r.get("code") == "R301"]
    assert r301["rank"] == 1 and r301["step"] == HANG_AT
    assert r301["data"]["missing_ranks"] == [1] and r301["data"]["exit_status"] == 3
    report = tmp_path / "rank0" / r301["data"]["stack_file"]
    assert "training_step" in report.read_text()  # rank 0's own stacks, inside the Trainer
    assert not (tmp_path / "rank0.json").exists()  # training never went on past the hang


# -- the device path (guards.decide_on="device": what CUDA gets by default) -----------------------
DEVICE = WARMUP.model_copy(update={"decide_on": "device"})


def test_device_path_skips_the_same_updates_bitwise(guarded: Run, tmp_path: Path) -> None:
    """Judged on the device and masked there (AdamW with weight decay: the where-restored
    snapshot), decisions read back a step later: the same skips, findings, checkpoints and
    bitwise the same weights and moments as the host path."""
    guard, calls = judged_on_device(Guard(run_dir=tmp_path, config=DEVICE))
    run = train(tmp_path, guard=guard, snapshots=True)
    assert calls == list(range(STEPS))  # every step went through step_async
    assert run.actions() == guarded.actions() == [(NAN_STEP, "skip"), (SPIKE_STEP, "skip")]
    codes = [(f["code"], f["step"]) for f in run.rows("finding")]
    assert codes == [(f["code"], f["step"]) for f in guarded.rows("finding")]
    assert same(run.snaps, guarded.snaps)
    assert same(run.params, guarded.params)
    assert same(run.trainer.optimizer.state_dict(), guarded.trainer.optimizer.state_dict())
    saved = {p.name for p in tmp_path.glob("checkpoint-*")}
    assert saved == {p.name for p in guarded.out.glob("checkpoint-*")}
    # train_loss leaves out the skipped steps here too, though each decision came a step late.
    ours_skipped, theirs_skipped = run.trainer.skipped_updates, guarded.trainer.skipped_updates
    assert ours_skipped is not None and theirs_skipped is not None
    assert ours_skipped["steps"] == theirs_skipped["steps"] == [NAN_STEP, SPIKE_STEP]
    ours, theirs = run.trainer.state.log_history[-1], guarded.trainer.state.log_history[-1]
    assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-6)


@pytest.mark.slow  # two Trainer runs; the skip test above keeps the device path by default
def test_device_path_rolls_back_to_the_same_end(tmp_path: Path) -> None:
    runs = {}
    for mode, config in (("host", WARMUP), ("device", DEVICE)):
        out = tmp_path / mode
        runs[mode] = train(out, guard=Guard(run_dir=out, config=config, actions=ROLLBACK),
                           save_steps=8)  # fmt: skip
    host, device = runs["host"], runs["device"]
    assert device.actions() == host.actions() == [(NAN_STEP, "skip"), (SPIKE_STEP, "rollback")]
    assert [e["to_step"] for e in device.rows("event")] == [24]
    # The rollback arrived with step 31's call: step 31 was computed, never applied.
    seen, reruns = first_runs(device.trainer.seen)
    assert [s for s, _, _ in seen][: SPIKE_STEP + 3] == [*range(SPIKE_STEP + 2), 24]
    assert reruns == [NAN_STEP, SPIKE_STEP]  # each rerun a step late, with the next step
    assert same(device.params, host.params)


# -- rerun on the same batch (R205 hardware, R206 data), on both paths ---------------------------
class Flaky(Poisoned):
    """The first computation of step `flaky_step` is corrupted (a NaN loss), the second is not:
    a fault of the machine, not of the batch."""

    flaky_step = 5

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        step = self.state.global_step
        first = [s for s, _, _ in self.seen].count(step) == 1  # the first computation only
        if not return_outputs and step == self.flaky_step and first:
            out = out * math.nan
        return out


@pytest.mark.parametrize("config", [WARMUP, DEVICE], ids=["host", "device"])
def test_a_rerun_tells_a_transient_fault_from_bad_data(tmp_path: Path, config: Any) -> None:
    """Step 5 fails once (transient: R205, hardware); step 12's batch is poisoned and fails
    again when rerun (R206, data). Both updates are skipped; each step is computed twice."""
    guard = Guard(run_dir=tmp_path, config=config)
    trainer = make_trainer(tmp_path, guard=guard, cls=Flaky, max_steps=16, save_steps=100)
    with one_thread():
        trainer.train()
    found = {(f["code"], f["step"]) for f in Run(trainer, tmp_path).rows("finding")}
    assert {("R205", 5), ("R206", NAN_STEP)} <= found
    assert not {("R206", 5), ("R205", NAN_STEP)} & found
    assert [h["step"] for h in guard.history] == [5, NAN_STEP]  # both skipped
    # Computed twice: the batches of steps 5 and 12 (on the device path the rerun comes with
    # the next step, so count the batches, not the Trainer's step).
    batches = [ids for _, ids, _ in trainer.seen]
    count = [batches.count(trainer.elastic_sampler.batch_ids(s).tolist()) for s in (4, 5, 12)]
    assert count == [1, 2, 2]
    assert all(p.isfinite().all() for p in trainer.model.parameters())
