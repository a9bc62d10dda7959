"""`optimizer.step()` kept or undone by a flag that stays on the device: a skipped update
without reading the flag on the host (`Guard.step_async`).

Why not scale the gradients by the flag: with a zero gradient AdamW still decays the weights,
decays both moments and counts the step, so a "skipped" step would change the model and every
later update. What the synchronous guard does (no gradient, so torch optimizers pass over the
parameter: no update, no decay, no moment change, no step count) must hold exactly. Per
optimizer, the cheapest way that does:

1. torch optimizers that take GradScaler's `found_inf` (`_step_supports_amp_scaling`: Adam,
   AdamW, SGD, Adagrad with `fused=True`): the fused kernel leaves parameters and moments alone
   when `found_inf` is 1 and the step count is taken back, all on the device. Free.
2. trainguard's Muon reads `found_inf` too (`_step_supports_found_inf`): each matrix and its
   momentum are selected with `torch.where` as they are updated.
3. Any other optimizer: the parameters with gradients and their optimizer state on the flag's
   device are copied before the step and selected back after it, `torch.where(ok, new, old)`:
   one copy of the parameters and state per step (memory and bandwidth; prefer 1 or 2 on a
   large model). State held elsewhere (AdamW's step counter stays on the CPU unless it is
   `capturable` or `fused`), and state the step created (the first step), are put back on the
   host by `HostRepair.undo` when the flag is read back, one step later, before the next update
   can read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class HostRepair:
    """What a skipped masked step left for the host to undo once the flag is known."""

    tensors: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    """(live tensor, its value before the step) not on the flag's device: copied back."""
    state: list[tuple[dict[str, Any], str, Any]] = field(default_factory=list)
    """(state dict, key, value before the step) for optimizer state that is not a tensor on
    the flag's device: assigned back."""
    created: list[tuple[Any, Any]] = field(default_factory=list)
    """(optimizer.state, parameter) whose state the step created: removed again."""

    @torch.no_grad()
    def undo(self) -> None:
        for live, old in self.tensors:
            live.copy_(old)
        for st, key, old in self.state:
            st[key] = old
        for opt_state, p in self.created:
            opt_state.pop(p, None)

    def extend(self, other: HostRepair) -> None:
        self.tensors += other.tensors
        self.state += other.state
        self.created += other.created


def masked_step(optimizer: Any, ok: torch.Tensor) -> HostRepair:
    """`optimizer.step()`, its effect kept where `ok` (a 0-dim bool tensor) is true. Never reads
    `ok` on the host; returns what the host must undo if `ok` turns out false."""
    mask = MaskedUpdate(optimizer, ok)
    try:
        optimizer.step()
    finally:
        repair = mask.end()
    return repair


def _torch_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers inside `optimizer`: an OptimizerSet's parts (train/optim.py), a
    framework's wrapper's `.optimizer` (accelerate, Lightning), or itself."""
    parts = getattr(optimizer, "optimizers", None)
    if isinstance(parts, dict):
        return [o for part in parts.values() for o in _torch_optimizers(part)]
    for attr in ("optimizer", "_optimizer"):  # accelerate's and Lightning's wrappers
        inner = getattr(optimizer, attr, None)
        if inner is not None and hasattr(inner, "param_groups") and inner is not optimizer:
            return _torch_optimizers(inner)
    return [optimizer]


def _skips_by_found_inf(optimizer: Any) -> bool:
    # torch sets _step_supports_amp_scaling when built fused; a state dict loaded later may
    # have turned `fused` off in the groups (a CPU checkpoint resumed on CUDA): then not.
    fused = getattr(optimizer, "_step_supports_amp_scaling", False) and all(
        g.get("fused") for g in optimizer.param_groups
    )
    return bool(fused or getattr(optimizer, "_step_supports_found_inf", False))


class MaskedUpdate:
    """Masks the next `optimizer.step()`, whoever calls it: built before the step (the mask
    set, the snapshots taken), `end()` after it (the mask removed, the snapshots selected back).
    For loops that do not call the optimizer themselves (the Trainer adapters)."""

    def __init__(self, optimizer: Any, ok: torch.Tensor) -> None:
        self.ok = ok
        self._flagged: list[Any] = []
        self._snapshots: list[_Snapshot] = []
        for opt in _torch_optimizers(optimizer):
            if _skips_by_found_inf(opt):
                opt.found_inf = (~ok).to(torch.float32)  # GradScaler's convention: 1 = skip
                self._flagged.append(opt)
            else:
                self._snapshots.append(_Snapshot(opt))

    def end(self) -> HostRepair:
        """After the step: what the host must undo if `ok` turns out false."""
        repair = HostRepair()
        for opt in self._flagged:
            if hasattr(opt, "found_inf"):
                del opt.found_inf
        self._flagged = []
        for snap in self._snapshots:
            repair.extend(snap.select(self.ok))
        self._snapshots = []
        return repair


class _Snapshot:
    """An optimizer's parameters (with gradients) and their state, copied before its step."""

    @torch.no_grad()
    def __init__(self, optimizer: Any) -> None:
        self.state = optimizer.state
        self.params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        self.had_state = {id(p) for p in self.params if p in self.state}
        self.saved_params = [(p, p.detach().clone()) for p in self.params]
        self.saved_state: list[tuple[dict[str, Any], str, Any]] = []
        for p in self.params:
            if id(p) not in self.had_state:
                continue
            for key, value in self.state[p].items():
                kept = value.clone() if isinstance(value, torch.Tensor) else value
                self.saved_state.append((self.state[p], key, kept))

    @torch.no_grad()
    def select(self, ok: torch.Tensor) -> HostRepair:
        """After the step: the new values where `ok`, the old ones elsewhere, on the device;
        what is not on `ok`'s device is left to the host (the returned repair)."""
        repair = HostRepair()
        for p, old in self.saved_params:
            if p.device == ok.device:
                p.copy_(torch.where(ok, p, old))
            else:
                repair.tensors.append((p, old))
        for st, key, old in self.saved_state:
            new = st.get(key)
            on_device = isinstance(new, torch.Tensor) and new.device == ok.device
            if on_device and isinstance(old, torch.Tensor) and new.shape == old.shape:
                new.copy_(torch.where(ok, new, old))  # in place, even if the step replaced it
            else:
                repair.state.append((st, key, old))
        repair.created = [
            (self.state, p) for p in self.params if id(p) not in self.had_state and p in self.state
        ]
        return repair
