"""The Lightning adapter in real Lightning runs on CPU (a tiny next-token LightningModule on
random tokens, AdamW with weight decay, a per-step LR schedule, `gradient_clip_val=1.0`).

The faults are in the data: the samples of step 12's batch make the loss NaN, those of step
30's multiply it by 1000. Guarded, exactly those two updates are skipped at their own steps
(bitwise: parameters and moments), judged on the unclipped gradient norm, with no phantom skip
after them, and training reaches max_steps; unguarded the weights go NaN. Resume takes the
newest `step-N` folder that verifies, with the guard's state from the callback's state_dict,
and replays bitwise; a rollback restores the last checkpoint and continues without the bad
samples.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

from torch.utils.data import DataLoader, Dataset  # noqa: E402

from runhelpers import judged_on_device  # noqa: E402
from trainguard import ElasticSampler  # noqa: E402
from trainguard.config.distributed import DistributedConfig  # noqa: E402
from trainguard.errors import ConfigError, RunHalted  # noqa: E402
from trainguard.guard.config import GuardsConfig  # noqa: E402
from trainguard.guard.core import Guard  # noqa: E402
from trainguard.integrations.lightning import (  # noqa: E402
    TrainguardLightningCallback,
    VerifiedModelCheckpoint,
    fit,
)

# One worker builds this file's session runs under `-n N --dist loadgroup`.
pytestmark = pytest.mark.xdist_group("lightning-trainer")

NAN_STEP, SPIKE_STEP, STEPS, SAVE_EVERY, BATCH, VOCAB = 12, 30, 40, 10, 4, 64
SNAP = (NAN_STEP, NAN_STEP + 1, 20, 21, SPIKE_STEP, SPIKE_STEP + 1)  # updates done
WARMUP = GuardsConfig(spike_min_history=12, spike_window=16)  # see test_guard_hf.py
ROLLBACK = {"R102": "rollback", "R103": "rollback"}  # spikes roll back instead of skipping


class Tokens(Dataset):
    def __init__(self) -> None:
        self.x = torch.randint(0, VOCAB, (256, 9), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple:
        return self.x[i], i


class TinyLM(L.LightningModule):
    """Embedding -> ReLU -> linear next-token model; poisons the loss of a batch holding a bad
    sample; records what each step trained on and the gradient norm right after backward."""

    def __init__(self, nan_ids: set[int], spike_ids: set[int]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, 32)
        self.out = torch.nn.Linear(32, VOCAB)
        self.nan_ids, self.spike_ids = nan_ids, spike_ids
        self.seen: list[tuple[int, list[int], float]] = []
        self.norms: dict[int, float] = {}
        self.flaky_step: int | None = None  # its first computation only is corrupted

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, ids = batch
        ids = ids.tolist()
        logits = self.out(torch.relu(self.emb(x[:, :-1])))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        self.seen.append((self.trainer.global_step, ids, loss.item()))
        if self.nan_ids & set(ids):
            loss = loss * math.nan
        step = self.trainer.global_step
        if step == self.flaky_step and [s for s, _, _ in self.seen].count(step) == 1:
            loss = loss * math.nan  # a transient fault: the rerun computes it cleanly
        if self.spike_ids & set(ids):
            loss = loss * 1000
        return loss

    def on_after_backward(self) -> None:
        # Right after the backward pass: the gradients before anything clips or drops them.
        grads = [p.grad.norm() for p in self.parameters() if p.grad is not None]
        if grads:
            self.norms[self.trainer.global_step] = float(torch.stack(grads).norm())

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.01 * s))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Snapshots(L.Callback):
    def __init__(self) -> None:
        self.at: dict[int, dict[str, Any]] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step in SNAP:
            opt = trainer.optimizers[0]
            self.at[trainer.global_step] = {
                "params": [p.detach().clone() for p in pl_module.parameters()],
                "moments": {
                    i: {k: v.clone() for k, v in s.items()}
                    for i, s in opt.state_dict()["state"].items()
                },
                "lr_steps": trainer.lr_scheduler_configs[0].scheduler.last_epoch,
            }


@dataclass
class Run:
    module: TinyLM
    trainer: Any
    callback: TrainguardLightningCallback
    out: Path
    snaps: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def params(self) -> list:
        return [p.detach().clone() for p in self.module.parameters()]

    def rows(self, kind: str) -> list[dict]:
        lines = (self.out / "guard.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == kind]

    def actions(self) -> list[tuple[int, str]]:
        return [(h["step"], h["action"]) for h in self.callback.guard.history]


def train(
    out: Path, *, guard: Guard | None = None, max_steps: int = STEPS, every: int = SAVE_EVERY,
    snapshots: bool = False, resume: bool = True, flaky: int | None = None,
) -> Run:  # fmt: skip
    dataset = Tokens()
    sampler = ElasticSampler(len(dataset), global_batch_size=BATCH, seed=0)  # endless
    loader = DataLoader(dataset, sampler=sampler, batch_size=BATCH)
    module = TinyLM(
        set(sampler.batch_ids(NAN_STEP).tolist()), set(sampler.batch_ids(SPIKE_STEP).tolist())
    )
    module.flaky_step = flaky
    callback = TrainguardLightningCallback(
        sampler, guard=guard if guard is not None else Guard(run_dir=out, config=WARMUP)
    )
    callbacks = [callback, VerifiedModelCheckpoint(out / "ckpt", every_n_train_steps=every,
                                                   save_top_k=-1)]  # fmt: skip
    run = Run(module, None, callback, out)
    if snapshots:
        snap = Snapshots()
        callbacks.append(snap)
        run.snaps = snap.at
    run.trainer = L.Trainer(
        max_steps=max_steps, gradient_clip_val=1.0, callbacks=callbacks, logger=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
    )  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fit(run.trainer, module, train_dataloaders=loader, resume=resume)
    finally:
        torch.set_num_threads(threads)
    return run


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


@pytest.fixture(scope="session")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return train(tmp_path_factory.mktemp("lightning_guarded"), snapshots=True)


def test_exactly_the_poisoned_updates_are_skipped_at_their_own_steps(guarded: Run) -> None:
    assert guarded.actions() == [(NAN_STEP, "skip"), (SPIKE_STEP, "skip")]  # no phantom skips
    found = {(f["code"], f["step"]) for f in guarded.rows("finding") if f["severity"] != "info"}
    assert found == {("R101", NAN_STEP), ("R102", SPIKE_STEP), ("R103", SPIKE_STEP)} | {
        ("R206", NAN_STEP),  # each rerun on its batch: the same again, the data's fault
        ("R206", SPIKE_STEP),
    }
    s = guarded.snaps
    for step in (NAN_STEP, SPIKE_STEP):
        assert same(s[step]["params"], s[step + 1]["params"])
        assert same(s[step]["moments"], s[step + 1]["moments"])
        assert s[step + 1]["lr_steps"] == s[step]["lr_steps"] + 1  # the schedule moves on
    assert not same(s[20]["params"], s[21]["params"])
    assert not same(s[20]["moments"], s[21]["moments"])
    assert guarded.trainer.global_step == STEPS and not guarded.trainer.should_stop
    assert all(p.isfinite().all() for p in guarded.params)


def test_the_guard_judges_the_unclipped_gradient_norm(guarded: Run) -> None:
    (r103,) = [f for f in guarded.rows("finding") if f["code"] == "R103"]
    unclipped = guarded.module.norms[SPIKE_STEP]  # seen by the module after its backward
    assert r103["data"]["value"] == pytest.approx(unclipped, rel=1e-5)
    assert r103["data"]["value"] > 100 * guarded.trainer.gradient_clip_val


def test_unguarded_control_run_goes_nan(tmp_path: Path) -> None:
    off = Guard(config=GuardsConfig(enabled=False))
    run = train(tmp_path, guard=off, max_steps=NAN_STEP + 2, every=100)
    assert run.actions() == []
    assert not all(p.isfinite().all() for p in run.params)


@pytest.fixture(scope="session")
def resumed(guarded: Run, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The guarded run's folder with step-30 and step-40 corrupted, fitted again."""
    out = tmp_path_factory.mktemp("lightning_resumed") / "out"
    shutil.copytree(guarded.out, out)
    for step in (30, 40):
        ckpt = out / "ckpt" / f"step-{step}" / "checkpoint.ckpt"
        data = bytearray(ckpt.read_bytes())
        data[len(data) // 2] ^= 0x10
        ckpt.write_bytes(bytes(data))
    return train(out)


def test_resume_skips_corrupt_checkpoints_to_the_newest_that_verifies(resumed: Run) -> None:
    found = [(f["code"], f["step"]) for f in resumed.rows("finding") if f["code"][0] == "C"]
    assert found == [("C101", 40), ("C101", 30), ("C112", 40), ("C112", 30)]
    quarantined = sorted(p.name for p in (resumed.out / "ckpt" / "quarantine").iterdir())
    assert quarantined == ["step-30", "step-40"]
    assert resumed.module.seen[0][0] == 20


def test_resume_keeps_the_guard_state_and_replays_bitwise(guarded: Run, resumed: Run) -> None:
    assert resumed.actions() == [(NAN_STEP, "skip"), (SPIKE_STEP, "skip")]
    assert same(resumed.params, guarded.params)
    first = {s: (ids, loss) for s, ids, loss in guarded.module.seen if s >= 20}
    assert {s: (ids, loss) for s, ids, loss in resumed.module.seen} == first


def test_rollback_restores_the_last_checkpoint_and_skips_the_bad_samples(tmp_path: Path) -> None:
    run = train(tmp_path, guard=Guard(run_dir=tmp_path, config=WARMUP, actions=ROLLBACK), every=8)
    assert run.actions() == [(NAN_STEP, "skip"), (SPIKE_STEP, "rollback")]
    (event,) = run.rows("event")
    assert (event["from_step"], event["to_step"], event["skipped_steps"]) == (SPIKE_STEP, 24, [30])
    seen, reruns = first_runs(run.module.seen)
    assert reruns == [NAN_STEP, SPIKE_STEP]  # each bad step rerun once on its batch (R206)
    assert [s for s, _, _ in seen] == [*range(SPIKE_STEP + 1), *range(24, STEPS)]
    second = seen[SPIKE_STEP + 1 :]
    replay = {s: (ids, loss) for s, ids, loss in second if s < SPIKE_STEP}
    assert replay == {s: (ids, loss) for s, ids, loss in seen[24:SPIKE_STEP]}  # bitwise
    after = [ids for s, ids, _ in second if s >= SPIKE_STEP]
    assert not any(run.module.spike_ids & set(ids) for ids in after)
    assert after[0] == run.callback.sampler.order.sample_ids(31 * BATCH, BATCH).tolist()
    assert run.trainer.global_step == STEPS
    assert all(p.isfinite().all() for p in run.params)
    # No checkpoint was written between the decision and the restore: step-32 is the replay's.
    ckpts = sorted(int(p.name[5:]) for p in (tmp_path / "ckpt").glob("step-*"))
    assert ckpts == [8, 16, 24, 32, 40]
    state = torch.load(tmp_path / "ckpt" / "step-32" / "checkpoint.ckpt", weights_only=True)
    (saved,) = [v for k, v in state["callbacks"].items() if "TrainguardLightningCallback" in k]
    assert saved["sampler"]["skipped_positions"] == [[120, 124]]
    assert saved["guard"]["rollbacks"] == 1


def test_a_halt_saves_nothing_more_and_raises(tmp_path: Path) -> None:
    no_rollbacks = WARMUP.model_copy(update={"max_rollbacks": 0})
    guard = Guard(run_dir=tmp_path, config=no_rollbacks, actions=ROLLBACK)
    with pytest.raises(RunHalted, match=f"halted the run at step {SPIKE_STEP}"):
        train(tmp_path, guard=guard, every=SPIKE_STEP + 1)  # a save due right after the halt
    assert [(h["step"], h["action"]) for h in guard.history] == [(12, "skip"), (30, "halt")]
    assert list((tmp_path / "ckpt").glob("step-*")) == []  # called off


def test_layouts_that_cannot_resume_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="filename"):
        VerifiedModelCheckpoint(tmp_path, filename="{epoch}")
    with pytest.raises(ConfigError, match="ElasticSampler"):
        TrainguardLightningCallback(torch.utils.data.SequentialSampler(range(4)))  # type: ignore[arg-type]
    sized = ElasticSampler(8, global_batch_size=4, seed=0, max_steps=2)
    trainer = L.Trainer(max_steps=2, callbacks=[TrainguardLightningCallback(sized)], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False)  # fmt: skip
    with pytest.raises(ConfigError, match="endless"):
        trainer.fit(TinyLM(set(), set()), DataLoader(Tokens(), sampler=sized, batch_size=4))


class CorruptAt(L.Callback):
    """Flips one byte of `step-N/checkpoint.ckpt` once `at` updates are done."""

    def __init__(self, path: Path, at: int) -> None:
        self.path, self.at = path, at

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.at:
            data = bytearray(self.path.read_bytes())
            data[len(data) // 2] ^= 0x10
            self.path.write_bytes(bytes(data))


def test_top_k_quarantines_a_folder_that_fails_verification(tmp_path: Path) -> None:
    """save_top_k=1: the save of step 4 lets step-2 go, the save of 6 lets step-4 go. The
    corrupt step-2 is moved to quarantine/ (C101, C112); the sound step-4 is deleted."""
    dataset = Tokens()
    sampler = ElasticSampler(len(dataset), global_batch_size=BATCH, seed=0)
    guard = Guard(run_dir=tmp_path, config=WARMUP)
    ckpt = tmp_path / "ckpt"
    trainer = L.Trainer(
        max_steps=6, logger=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", devices=1,
        callbacks=[TrainguardLightningCallback(sampler, guard=guard),
                   CorruptAt(ckpt / "step-2" / "checkpoint.ckpt", at=3),
                   VerifiedModelCheckpoint(ckpt, every_n_train_steps=2, save_top_k=1)],
    )  # fmt: skip
    fit(trainer, TinyLM(set(), set()), train_dataloaders=DataLoader(dataset, sampler=sampler,
                                                                    batch_size=BATCH))  # fmt: skip
    guard.close()
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-6"]
    assert sorted(p.name for p in (ckpt / "quarantine").iterdir()) == ["step-2"]
    assert (ckpt / "quarantine" / "step-2" / "manifest.json").exists()  # the evidence, whole
    rows = [json.loads(x) for x in (tmp_path / "guard.jsonl").read_text().splitlines()]
    assert [(r["code"], r["step"]) for r in rows if r["code"][0] == "C"] == [
        ("C101", 2),
        ("C112", 2),
    ]


# -- the device path (guards.decide_on="device": what CUDA gets by default) -----------------------
DEVICE = WARMUP.model_copy(update={"decide_on": "device"})


def test_device_path_skips_the_same_updates_bitwise(guarded: Run, tmp_path: Path) -> None:
    """Judged on the device and masked there, decisions read back a step later (before each
    save): the same skips and findings, bitwise the same weights and moments as the host path,
    and checkpoints whose guard state is the host path's."""
    guard, calls = judged_on_device(Guard(run_dir=tmp_path, config=DEVICE))
    run = train(tmp_path, guard=guard, snapshots=True)
    assert calls == list(range(STEPS))  # every step went through step_async
    assert run.actions() == guarded.actions() == [(NAN_STEP, "skip"), (SPIKE_STEP, "skip")]
    codes = [(f["code"], f["step"]) for f in run.rows("finding")]
    assert codes == [(f["code"], f["step"]) for f in guarded.rows("finding")]
    assert same(run.snaps, guarded.snaps)
    assert same(run.params, guarded.params)
    for name in ("step-20", "step-40"):
        a, b = (torch.load(r.out / "ckpt" / name / "checkpoint.ckpt", weights_only=True)
                for r in (run, guarded))  # fmt: skip
        assert same(a["state_dict"], b["state_dict"])
        assert same(a["optimizer_states"], b["optimizer_states"])
        key = next(k for k in a["callbacks"] if "TrainguardLightningCallback" in k)
        assert a["callbacks"][key]["guard"] == b["callbacks"][key]["guard"]


# -- DDP: two gloo processes ---------------------------------------------------------------------
CTX = multiprocessing.get_context("fork")
FLIP_AT = 5  # rank 1's weights get one bit flipped after this update


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FlippingLM(TinyLM):
    """Rank 1 corrupts one weight once, after the update of step FLIP_AT (silent corruption)."""

    flipped = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.global_rank == 1 and self.trainer.global_step == FLIP_AT + 1 and not self.flipped:
            with torch.no_grad():
                self.out.weight.view(-1)[:1].view(torch.int32)[0] ^= 1 << 12  # a mantissa bit
            self.flipped = True
        return super().training_step(batch, batch_idx)


def _ddp_worker(rank: int, tmp: Path, port: int) -> None:
    # Launched like torchrun launches: Lightning sees LOCAL_RANK and creates no processes.
    env = {"RANK": rank, "LOCAL_RANK": rank, "NODE_RANK": 0, "WORLD_SIZE": 2,
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}  # fmt: skip
    os.environ.update({k: str(v) for k, v in env.items()})
    torch.set_num_threads(1)
    dataset = Tokens()
    sampler = ElasticSampler(len(dataset), global_batch_size=BATCH, seed=0, rank=rank,
                             world_size=2)  # fmt: skip
    # A NaN in rank 1's half of step 2's global batch only: both ranks must skip step 2.
    module = FlippingLM({int(sampler.batch_ids(2)[BATCH // 2])}, set())
    guard = Guard(
        run_dir=tmp / f"rank{rank}", config=WARMUP,
        distributed=DistributedConfig(replica_check_interval=2, straggler_interval=2),
    )  # fmt: skip
    callback = TrainguardLightningCallback(sampler, guard=guard)
    trainer = L.Trainer(
        max_steps=10, gradient_clip_val=1.0, logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=2, strategy="ddp",
        use_distributed_sampler=False,
        callbacks=[callback, VerifiedModelCheckpoint(tmp / "ckpt", every_n_train_steps=4,
                                                     save_top_k=-1)],
    )  # fmt: skip
    assert trainer.global_rank == rank and sampler.rank == trainer.global_rank
    fit(trainer, module, train_dataloaders=DataLoader(dataset, sampler=sampler,
                                                      batch_size=BATCH // 2))  # fmt: skip
    result = {"history": guard.history, "step": trainer.global_step,
              "weights": [p.detach().flatten().tolist() for p in module.parameters()],
              "seen": [s for s, _, _ in first_runs(module.seen)[0]],
              "reruns": first_runs(module.seen)[1]}  # fmt: skip
    (tmp / f"rank{rank}.json").write_text(json.dumps(result))
    guard.close()
    torch.distributed.destroy_process_group()


def test_ddp_ranks_agree_and_roll_back_a_corrupted_replica(tmp_path: Path) -> None:
    port = _free_port()
    procs = [CTX.Process(target=_ddp_worker, args=(r, tmp_path, port)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    # Both ranks took every decision together: the rank-local NaN is skipped on both, the
    # replica check after the flip (step 6) rolls both back to step-4.
    assert r0["history"] == r1["history"]
    assert [(h["step"], h["action"]) for h in r0["history"]] == [(2, "skip"), (6, "rollback")]
    assert r0["seen"] == r1["seen"] == [*range(7), *range(4, 10)]
    assert r0["reruns"] == r1["reruns"] == [2]  # both ranks rerun the skipped step together
    assert r0["weights"] == r1["weights"]  # bitwise: the replicas agree again
    assert r0["step"] == r1["step"] == 10
    rows = [json.loads(x) for x in (tmp_path / "rank1" / "guard.jsonl").read_text().splitlines()]
    (h201,) = [r for r in rows if r.get("code") == "H201"]  # two replicas: no majority
    assert h201["step"] == 6 and h201["data"]["replica_set"] == [0, 1]
    # Nobody is slow: rank 0, which alone writes the checkpoints, is not named a straggler.
    assert [r for r in rows if r.get("code") == "H202"] == []
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-4", "step-8"]


@pytest.mark.parametrize("decide_on", ["host", "device"])
def test_a_rerun_tells_a_transient_fault_from_bad_data(tmp_path: Path, decide_on: str) -> None:
    """Step 5 fails once (transient: R205, hardware); step 12's batch is poisoned and fails
    again when rerun on the same batch (R206, data). Both updates are skipped; each of the two
    steps is computed twice."""
    config = WARMUP.model_copy(update={"decide_on": decide_on})
    guard = Guard(run_dir=tmp_path, config=config)
    run = train(tmp_path, guard=guard, max_steps=16, every=100, flaky=5)
    found = {(f["code"], f["step"]) for f in run.rows("finding")}
    assert {("R205", 5), ("R206", NAN_STEP)} <= found
    assert not {("R206", 5), ("R205", NAN_STEP)} & found
    assert run.actions() == [(5, "skip"), (NAN_STEP, "skip")]
    # Computed twice: the batches of steps 5 and 12 (on the device path the rerun comes with
    # the next step, so count the batches, not the Trainer's step).
    batches = [ids for _, ids, _ in run.module.seen]
    count = [batches.count(run.callback.sampler.batch_ids(s).tolist()) for s in (4, 5, 12)]
    assert count == [1, 2, 2]
    assert all(p.isfinite().all() for p in run.params)


def test_strategies_the_guard_cannot_judge_are_refused() -> None:
    """Checked in the callback's `setup`, before any step. FSDP and DeepSpeed cannot be built
    on this CPU machine by a Trainer: the strategy objects themselves are checked."""
    from lightning.pytorch.strategies import (
        DDPStrategy,
        DeepSpeedStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
        SingleDeviceStrategy,
    )

    from trainguard.integrations.lightning import check_strategy

    check_strategy(SingleDeviceStrategy("cpu"))
    check_strategy(DDPStrategy())
    deepspeed = object.__new__(DeepSpeedStrategy)  # its __init__ needs deepspeed installed
    for strategy, why in ((deepspeed, "DeepSpeed"), (FSDPStrategy(), "FSDP"),
                          (ModelParallelStrategy(), "untested")):  # fmt: skip
        with pytest.raises(ConfigError, match=why) as e:
            check_strategy(strategy)
        assert "ddp" in e.value.fix
