"""Guard.step_async: the decision on the device (no host sync in the step), the bookkeeping one
step later. On the CPU the same code runs with CPU tensors: the tests count every host read
(patched torch.Tensor methods), replay random streams with NaNs, infinities, spikes, bursts and
divergence through both paths, and train real models through both and compare bitwise."""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from trainguard.errors import ConfigError
from trainguard.guard.config import GuardsConfig
from trainguard.guard.core import Guard
from trainguard.guard.detectors import synthetic as S
from trainguard.guard.masked_step import masked_step
from trainguard.train.optim import Muon, OptimizerSet

# Everything that turns a tensor into a host value (on CUDA: a sync with the device).
READS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@contextmanager
def counting_reads():
    """Record (method, tensor) for every host read of a tensor inside the block."""
    calls: list[tuple[str, torch.Tensor]] = []
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(name, fn):
        def counted(self, *args, **kwargs):
            calls.append((name, self))
            return fn(self, *args, **kwargs)

        return counted

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield calls
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def make_stream(seed: int, n: int = 260) -> tuple[np.ndarray, np.ndarray]:
    """A loss and gradient-norm stream with planted faults: NaN/inf, single spikes (some
    below the thresholds), bursts of spikes (R204), sometimes a divergence (R104)."""
    rng = np.random.default_rng(seed)
    loss = S.clean_loss(n, seed=seed, noise=float(rng.uniform(0.005, 0.05)))
    grad = S.clean_grad_norm(n, seed=seed + 1, noise=float(rng.uniform(0.05, 0.3)))
    if rng.random() < 0.3:
        loss = S.plant_divergence(loss, int(rng.integers(80, 200)), rate=0.01)
    for at in rng.choice(n, size=int(rng.integers(0, 8)), replace=False):
        kind = rng.integers(0, 5)
        series = loss if rng.random() < 0.5 else grad
        if kind == 0:
            series[at] = math.nan
        elif kind == 1:
            series[at] = math.inf if rng.random() < 0.7 else -math.inf
        else:
            series[at] *= float(rng.choice([1.1, 1.5, 3.0, 30.0, 1e6]))
    if rng.random() < 0.3:  # a burst: several skips close together escalate to R204
        at = int(rng.integers(60, n - 20))
        for k in range(0, 12, 4):
            loss[at + k] *= 5.0
    return loss.astype(np.float32), grad.astype(np.float32)


def config_for(seed: int) -> GuardsConfig:
    rng = np.random.default_rng(10_000 + seed)
    return GuardsConfig(
        spike_min_history=int(rng.choice([8, 20])),
        max_rollbacks=int(rng.integers(0, 2)),
        repeat_count=int(rng.choice([2, 3])),
        actions={"R103": "apply"} if rng.random() < 0.2 else {},
    )


def summary(d):
    values = {k: repr(v) for k, v in d.values.items()}  # repr: NaN equals NaN
    return (d.step, d.action, [(f.code, f.metric, f.data) for f in d.findings], d.rerun, values)


def applied_by_sync(guard, d) -> bool:
    """Whether the update of d's step reaches the weights in a synchronous loop. A rollback or
    halt from the history alone (R104, R204, R203 after a rollback) is decided a step late on
    the device path, which applies the update first: the restore (or the stop) discards it, so
    only a veto by the step's own values (R101-R103 not set to apply) must match."""
    if d.action in ("apply", "skip"):
        return d.action == "apply"
    return not any(
        f.code in ("R101", "R102", "R103") and guard.actions[f.code] != "apply" for f in d.findings
    )


def replay_sync(loss, grad, config):
    guard, out = Guard(config=config), []
    for s in range(len(loss)):
        d = guard.step(s, loss=torch.tensor(loss[s]), grad_norm=torch.tensor(grad[s]))
        out.append((summary(d), applied_by_sync(guard, d)))
        if d.action in ("rollback", "halt"):
            break  # a loop acts on it here; the stream ends
    return out


def replay_device(loss, grad, config, device="cpu"):
    guard, flags, decisions = Guard(config=config), [], []
    losses = torch.tensor(loss, device=device)
    grads = torch.tensor(grad, device=device)
    for s in range(len(loss)):
        pending = guard.step_async(s, loss=losses[s], grad_norm=grads[s])
        if pending.resolved is not None:
            decisions.append(pending.resolved)
        if pending.dropped:
            break
        flags.append(bool(pending.ok))
    else:
        decisions.append(guard.flush())
    return [(summary(d), ok) for d, ok in zip(decisions, flags, strict=False)]


# 100 streams in the default run, 300 more in the slow set.
BLOCKS = [*range(2), *(pytest.param(b, marks=pytest.mark.slow) for b in range(2, 8))]


@pytest.mark.parametrize("block", BLOCKS)
def test_device_decisions_equal_the_synchronous_ones_on_random_streams(block):
    """50 streams per block: the device's skip flag of every step and the decision (action,
    findings with their data, rerun, values) read back one step later equal Guard.step's."""
    faults = 0
    for seed in range(block * 50, block * 50 + 50):
        loss, grad = make_stream(seed)
        config = config_for(seed)
        want, got = replay_sync(loss, grad, config), replay_device(loss, grad, config)
        assert got == want, f"stream {seed}"
        faults += sum(1 for (d, applied) in want if not applied)
    assert faults > 10  # the streams do exercise skips, rollbacks and halts


def test_the_hot_path_reads_nothing_back():
    """Judging a step and masking its update perform no .item()/.cpu()/.tolist()/... at all;
    the bookkeeping reads exactly one buffer per step: the previous step's staged copy."""
    loss = S.clean_loss(120, seed=3, noise=0.02).astype(np.float32)
    grad = S.clean_grad_norm(120, seed=4).astype(np.float32)
    loss[70], grad[90] = math.nan, grad[90] * 1e6
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizers = [
        torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True),  # found_inf
        torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=0.1),  # where
    ]
    guard = Guard()
    staged_before = None
    for s in range(len(loss)):
        for p in model.parameters():
            p.grad = torch.full_like(p, float(loss[s]))
        with counting_reads() as calls:
            pending = guard.step_async(
                s, loss=torch.tensor(loss[s]), grad_norm=torch.tensor(grad[s])
            )
            for opt in optimizers:
                pending.optimizer_step(opt)
        staged_now = guard._pending[1].host
        if staged_before is None:
            assert calls == []
        else:
            assert [(name, t is staged_before) for name, t in calls] == [("numpy", True)], s
        staged_before = staged_now
    assert guard.flush().step == len(loss) - 1
    assert guard.skipped == 2


def train_pair(make_optimizer, device_path: bool, steps: int = 60, inject=None):
    """A small regression trained with either path; returns the decisions and final state."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2048, 8, generator=g), torch.randn(8, 4, generator=g)
    y = x @ w + 0.1 * torch.randn(2048, 4, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = make_optimizer(model)
    # Four faults, far enough apart not to escalate to a rollback (R204).
    guard = Guard(config=GuardsConfig(spike_min_history=8, repeat_window=10))
    decisions = []
    for step in range(steps):
        idx = torch.arange(step * 32, step * 32 + 32) % len(x)
        xb, yb = x[idx].clone(), y[idx].clone()
        if inject is not None:
            xb, yb = inject(step, xb, yb)
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        if device_path:
            pending = guard.step_async(step, loss=loss.detach(), model=model)
            if pending.resolved is not None:
                decisions.append(pending.resolved.action)
            pending.optimizer_step(opt)
        else:
            d = guard.step(step, loss=loss, model=model, optimizer=opt)
            decisions.append(d.action)
            opt.step()
        opt.zero_grad(set_to_none=True)
    if device_path:
        decisions.append(guard.flush().action)
    return decisions, model.state_dict(), opt.state_dict()


def faults(step, xb, yb):
    if step in (12, 30):
        xb[0, 0] = math.nan
    if step in (20, 41):
        yb = yb * 40.0
    return xb, yb


def muon_set(model):
    matrices = [p for p in model.parameters() if p.dim() == 2]
    others = [p for p in model.parameters() if p.dim() != 2]
    return OptimizerSet(
        {
            "muon": Muon(matrices, lr=0.02, weight_decay=0.1),
            "adamw": torch.optim.AdamW(others, lr=1e-3, weight_decay=0.1),
        }
    )


OPTIMIZERS = {
    "adamw_fused": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True),
    "adamw_single": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1),
    "adam_foreach": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, foreach=True),
    "sgd_momentum": lambda m: torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9),
    "muon_and_adamw": muon_set,
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_skipped_updates_leave_weights_and_moments_exactly_as_the_sync_path(name):
    """NaN and spike batches (one at step 12: before any moment exists for SGD/Muon state
    creation) are skipped by the device flag; weights, moments, step counts and the
    decisions equal the synchronous path's bitwise."""
    make = OPTIMIZERS[name]
    sync = train_pair(make, False, inject=faults)
    dev = train_pair(make, True, inject=faults)
    assert dev[0] == sync[0]
    assert [i for i, a in enumerate(sync[0]) if a != "apply"] == [12, 20, 30, 41]
    for k, v in sync[1].items():
        assert torch.equal(dev[1][k], v), k
    assert str(dev[2]) == str(sync[2])  # every moment and step count, bitwise


def test_a_skipped_first_step_creates_no_optimizer_state():
    """With zeroed gradients AdamW would decay the weights and count a step; the generic
    masked step undoes all of it, including state the step created."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 3))
    opt = torch.optim.AdamW([p], lr=0.1, weight_decay=0.5)
    before = p.detach().clone()
    p.grad = torch.randn(5, 3)
    repair = masked_step(opt, torch.tensor(False))
    assert torch.equal(p, before)  # the device selected the old weights
    repair.undo()  # the host's part, once the flag is read back
    assert len(opt.state) == 0
    p.grad = torch.zeros(5, 3)
    opt.step()
    assert not torch.equal(p, before)  # what scaling gradients to zero would have done


def test_rollback_and_halt_arrive_with_the_next_step_which_is_dropped():
    loss = S.clean_loss(300, seed=1, noise=0.02)
    for at in (200, 210, 220):
        loss[at] *= 3.0
    guard = Guard(config=GuardsConfig(max_rollbacks=1))
    for s in range(300):
        pending = guard.step_async(s, loss=torch.tensor(float(loss[s])))
        if pending.dropped:
            break
    assert pending.step == 221 and pending.resolved.action == "rollback"
    assert pending.resolved.bad_steps == [200, 210, 220]
    assert guard.pending_rollback is pending.resolved
    with pytest.raises(RuntimeError, match="dropped"):
        pending.optimizer_step(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))


def test_state_dict_refuses_a_pending_step_and_flush_resolves_it():
    guard = Guard()
    guard.step_async(0, loss=torch.tensor(1.0))
    with pytest.raises(RuntimeError, match="flush"):
        guard.state_dict()
    with pytest.raises(RuntimeError, match="flush"):
        guard.step(1, loss=1.0)
    assert guard.flush().step == 0
    assert guard.flush() is None
    assert guard.state_dict()["monitors"]["loss/spike"]["window"]["values"] == [1.0]


def test_skip_codes_the_device_cannot_decide_are_refused():
    guard = Guard(actions={"R104": "skip"})
    with pytest.raises(ConfigError, match="R104"):
        guard.step_async(0, loss=torch.tensor(1.0))
    Guard(actions={"R104": "halt", "R102": "rollback"}).step_async(0, loss=torch.tensor(1.0))


def test_host_floats_are_judged_without_device_work():
    """An adapter that only has a logged float: the same decision, still no read."""
    loss = S.clean_loss(80, seed=2, noise=0.02)
    loss[50] *= 4.0
    guard, flags = Guard(config=GuardsConfig(spike_min_history=8)), []
    for s in range(80):
        with counting_reads() as calls:
            pending = guard.step_async(s, loss=float(loss[s]))
        assert [n for n, _ in calls] in ([], ["numpy"])
        flags.append(bool(pending.ok))
    assert [i for i, ok in enumerate(flags) if not ok] == [50]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_hot_path_never_syncs_and_decides_like_the_host():
    """On a GPU: the decisions on CUDA tensors (float64 comparisons on the device) equal the
    host path's, and judging a step plus the masked update of each kind (fused found_inf,
    Muon found_inf, the where-restored snapshot) run under torch's sync debug mode set to
    error: any device-to-host sync in them raises."""
    dev = torch.device("cuda")
    for seed in range(20):
        loss, grad = make_stream(seed)
        config = config_for(seed)
        assert replay_device(loss, grad, config, dev) == replay_sync(loss, grad, config), seed
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64, bias=False).to(dev)
    optimizers = [
        torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True),
        Muon(model.parameters(), lr=0.02),
        torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
    ]
    loss = S.clean_loss(60, seed=3, noise=0.02).astype(np.float32)
    loss[40] = math.nan
    losses = torch.tensor(loss, device=dev)
    guard, flags = Guard(config=GuardsConfig(spike_min_history=8)), []
    for s in range(60):
        for p in model.parameters():
            p.grad = torch.full_like(p, 1e-3)
        guard.flush()  # the bookkeeping of the previous step: the one read, outside the check
        torch.cuda.set_sync_debug_mode("error")
        try:
            pending = guard.step_async(s, loss=losses[s], model=model)
            for opt in optimizers:
                pending.optimizer_step(opt)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        flags.append(bool(pending.ok))
    assert [i for i, ok in enumerate(flags) if not ok] == [40]
    assert torch.isfinite(model.weight).all()
