"""The optimizers a recipe can name: AdamW, or Muon on hidden matrices with AdamW on the rest.

Muon (Jordan et al. 2024) orthogonalises the momentum of each 2-D hidden weight matrix with a
Newton-Schulz iteration. It is made for those matrices only: embeddings, the tied output head,
norm gains and biases keep AdamW. On the default recipe 300 Muon steps reach about the
validation loss of 500 AdamW steps (docs/benchmarks.md), which is what lets the demo fit its
5-minute budget on two CPU cores.

Why not `torch.optim.Muon`: it runs Newton-Schulz in bfloat16, which lands about 2.6e-2
(relative) from the same iteration in float64, against 1.4e-6 in float32 here; torch before 2.9
has no Muon at all; and the guard's device path skips an update of this Muon through
`found_inf` on the device (guard/masked_step.py). Speed is no reason either way: it depends on
the CPU. On an AMD EPYC with avx512_bf16 (bf16 dot-product units), torch's step over the
default model's matrices took 0.6x the time of this one's (37 ms vs 59 ms, one thread;
`python benchmarks/bench_optimizer.py --configs ""`, docs/benchmarks.md quotes each figure with
its CPU); an earlier "22x slower" came from a machine whose CPU was not recorded. `Muon`
below follows torch's update rule (EMA momentum, Nesterov, shape-adjusted lr, decoupled weight
decay) and iterates in bfloat16 only on CUDA.

Each param group carries `peak_lr`, its own peak learning rate; the run scales every group by
the same schedule factor (train/schedule.py), so AdamW and Muon warm up and decay together.

Both are `Eager` optimizers: torch's own arithmetic, without the wrappers through which
`torch.optim` imports `torch._dynamo` on first use (longer than `import torch` itself, a third
of a restart) only to keep `torch.compile` out of them. The run never compiles.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from trainguard.config.schema import Recipe

# Quintic Newton-Schulz coefficients of Keller Jordan's Muon (also torch.optim.Muon's).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def orthogonalize(
    g: torch.Tensor, steps: int = NS_STEPS, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Approximately U V^T of g = U S V^T: every singular value pushed to about 1.

    The quintic iteration converges to singular values in roughly [0.7, 1.2], not exactly 1,
    which trains as well and takes 5 steps instead of dozens (Jordan et al. 2024). It runs in
    `dtype`: by default bfloat16 on CUDA, float32 elsewhere.
    """
    a, b, c = NS_COEFFICIENTS
    if dtype is None:
        dtype = torch.bfloat16 if g.is_cuda else torch.float32
    x = g.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:  # iterate on the wide side: X X^T is the smaller Gram matrix
        x = x.T
    x = x / x.norm().clamp(min=1e-7)  # spectral norm <= Frobenius norm = 1: inside convergence
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(g.dtype)


def _unwrap(method: Callable, wrapper: str, module: str) -> Callable:
    """What torch's dynamo wrapper named `wrapper` (defined in `module`) wraps in `method`,
    looking through other wrappers (torch hooks a class's `step` once it has an instance);
    `method` itself when no such wrapper is found (another torch version: only slower)."""
    f: Any = method
    while f is not None:
        code = getattr(f, "__code__", None)
        here = code is not None and code.co_filename.replace("\\", "/").endswith(module)
        if here and code.co_name == wrapper:
            return f.__wrapped__
        f = getattr(f, "__wrapped__", None)
    return method


def _eager(method: Callable) -> Callable:
    """An `Optimizer` method without `torch._disable_dynamo` (torch/_compile.py), which imports
    `torch._dynamo` on the first call to mark the method as never compiled."""
    return _unwrap(method, "inner", "torch/_compile.py")


def _eager_step(step: Callable) -> Callable:
    """An optimizer's `step` without `_use_grad_for_differentiable` (torch/optim/optimizer.py),
    which imports `torch._dynamo` for two graph breaks; its grad mode is kept."""
    inner = _unwrap(step, "_use_grad", "torch/optim/optimizer.py")
    if inner is step:
        return step

    @functools.wraps(inner)
    def eager_step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        with torch.set_grad_enabled(self.defaults["differentiable"]):  # as `_use_grad` does
            return inner(self, *args, **kwargs)

    return eager_step


class Eager:
    """Mixin for a `torch.optim.Optimizer`: the same methods, none importing `torch._dynamo`
    (the module docstring says why). A step of an Eager optimizer equals torch's bitwise."""

    add_param_group = _eager(torch.optim.Optimizer.add_param_group)
    zero_grad = _eager(torch.optim.Optimizer.zero_grad)
    state_dict = _eager(torch.optim.Optimizer.state_dict)
    load_state_dict = _eager(torch.optim.Optimizer.load_state_dict)


class AdamW(Eager, torch.optim.AdamW):
    """`torch.optim.AdamW`, unchanged but for the `Eager` methods."""

    step = _eager_step(torch.optim.AdamW.step)


class Muon(Eager, torch.optim.Optimizer):
    """MomentUm Orthogonalized by Newton-Schulz, for 2-D weight matrices only.

    Per step: m <- lerp(m, g, 1 - momentum); u <- lerp(g, m, momentum) (Nesterov);
    W <- W (1 - lr * weight_decay) - lr * sqrt(max(1, rows / cols)) * orthogonalize(u).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.02,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
    ) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum})
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(
                        f"Muon updates 2-D matrices only, got a parameter of shape "
                        f"{tuple(p.shape)}; give it to AdamW"
                    )

    # `found_inf` (GradScaler's convention, a 0-dim tensor, 1 = skip), set by the guard's
    # device-side skip (guard/masked_step.py): the update is selected away on the device.
    _step_supports_found_inf = True

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:  # a skipped parameter gets no update and no decay
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                scale = -lr * math.sqrt(max(1.0, p.size(0) / p.size(1)))
                if found_inf is None:
                    buf.lerp_(p.grad, 1 - mu)
                    update = orthogonalize(p.grad.lerp(buf, mu))
                    p.mul_(1 - lr * wd)
                    p.add_(update, alpha=scale)
                    continue
                # The same arithmetic out of place, kept only where found_inf is 0.
                keep = found_inf.to(p.device, non_blocking=True) == 0
                new_buf = buf.lerp(p.grad, 1 - mu)
                update = orthogonalize(p.grad.lerp(new_buf, mu))
                new_p = p.mul(1 - lr * wd).add_(update, alpha=scale)
                buf.copy_(torch.where(keep, new_buf, buf))
                p.copy_(torch.where(keep, new_p, p))


class OptimizerSet:
    """Several torch optimizers over disjoint parameters, stepped, saved and restored as one.

    It offers what the run uses of `torch.optim.Optimizer`: `param_groups`, `state`, `step`,
    `zero_grad`, `state_dict` and `load_state_dict`. The state dict is keyed by optimizer name,
    so a checkpoint says which optimizer each part of the state belongs to.
    """

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        if not optimizers:
            raise ValueError("an OptimizerSet needs at least one optimizer")
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    @property
    def state(self) -> dict[torch.Tensor, dict[str, Any]]:
        merged: dict[torch.Tensor, dict[str, Any]] = {}
        for opt in self.optimizers.values():
            merged.update(opt.state)
        return merged

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.optimizers):
            raise ValueError(
                f"optimizer state holds {sorted(state)} but this run uses "
                f"{sorted(self.optimizers)}: the checkpoint was written with another optimizer"
            )
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


Optimizer = torch.optim.Optimizer | OptimizerSet


def split_params(
    model: nn.Module,
) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """(hidden 2-D matrices, embeddings with the tied head, the rest: norm gains and biases)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    matrices, embeds, others = [], [], []
    for p in model.parameters():  # a tied tensor appears once
        if not p.requires_grad:
            continue
        if id(p) in embeddings:
            embeds.append(p)
        elif p.dim() == 2:
            matrices.append(p)
        else:
            others.append(p)
    return matrices, embeds, others


def _with_peak(groups: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(g, peak_lr=g["lr"]) for g in groups if g["params"]]


def build_optimizer(recipe: Recipe, model: nn.Module) -> Optimizer:
    """The recipe's optimizer over `model`'s parameters (`train.optimizer`).

    adamw: weight decay on hidden matrices only (decaying norm gains, biases and embeddings
    pulls scales and rare-token rows toward zero for no regularising gain). muon: Muon on the
    hidden matrices (decoupled weight decay, lr adjusted by matrix shape),
    AdamW without decay on everything else. On CPU `foreach`/`fused` stay at torch's
    defaults, the single-tensor loops: deterministic, so the same recipe gives bitwise the same
    weights. On CUDA AdamW is fused: torch's fastest, and the guard's device path skips its
    update through `found_inf` at no cost (guard/masked_step.py).
    """
    t = recipe.train
    matrices, embeds, others = split_params(model)
    betas = (t.beta1, t.beta2)
    fused = True if any(p.is_cuda for p in model.parameters()) else None
    if t.optimizer == "adamw":
        groups = _with_peak(
            [
                {"params": matrices, "weight_decay": t.weight_decay, "lr": t.lr},
                {"params": embeds + others, "weight_decay": 0.0, "lr": t.lr},
            ]
        )
        return AdamW(groups, lr=t.lr, betas=betas, fused=fused)
    muon = Muon(
        _with_peak([{"params": matrices, "lr": t.muon_lr}]),
        lr=t.muon_lr,
        weight_decay=t.weight_decay,
        momentum=t.muon_momentum,
    )
    adamw = AdamW(
        _with_peak([{"params": embeds + others, "lr": t.lr}]),
        lr=t.lr,
        betas=betas,
        weight_decay=0.0,
        fused=fused,
    )
    return OptimizerSet({"muon": muon, "adamw": adamw})
