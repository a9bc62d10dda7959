"""What a Checkpointer's state is made of, and how a non-sharded checkpoint lays it out in files.

`classify` sorts the values of the caller's state dict into modules, optimizers, other objects
with `state_dict()/load_state_dict()`, tensors and plain data, refusing anything else before a
byte is written. A `Layout` turns such a state into the payload files of one checkpoint folder
and back. `FlatLayout`, the default, writes

    state.json + state.safetensors   every value's state (codec.py: JSON skeleton + tensors)
                                     and every rank's generator states (rng.py), by rank

Every loop gets this format, `trainguard run` included (its counters, schedule, guard and
callbacks are ordinary state entries); eval, report and the drills read a step's weights
through `checkpoint/read.py`. The Checkpointer keeps the rest (async, manifest, verification,
fallback, retention).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from trainguard.checkpoint import codec
from trainguard.checkpoint.fit import is_optimizer_like
from trainguard.checkpoint.inventory import unloadable
from trainguard.checkpoint.read import state_problem
from trainguard.checkpoint.staging import Staging, one_thread
from trainguard.errors import BadInputError
from trainguard.findings import Finding

KIND_ORDER = ("module", "optimizer", "stateful", "tensor", "plain")  # restore order


@dataclass
class Part:
    """One value of the caller's state dict and what it is."""

    key: str
    kind: str  # one of KIND_ORDER
    value: Any

    @property
    def where(self) -> str:
        suffix = ".state_dict()" if self.kind in ("module", "optimizer", "stateful") else ""
        return f"state[{self.key!r}]{suffix}"

    def state(self) -> Any:
        """What is stored for this value: its state_dict, or the value itself."""
        if self.kind in ("module", "optimizer", "stateful"):
            return self.value.state_dict()
        return self.value


def classify(state: Any) -> list[Part]:
    """The parts of `state`, or BadInputError naming the first value that cannot be stored."""
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise BadInputError(
            f"the checkpoint state must be a dict with string keys, got {type(state).__name__}",
            'pass a dict such as {"model": model, "optimizer": optimizer, "sampler": sampler}',
        )
    parts = []
    for key, value in state.items():
        if isinstance(value, torch.nn.Module):
            kind = "module"
        elif isinstance(value, torch.optim.Optimizer):
            kind = "optimizer"
        elif callable(getattr(value, "state_dict", None)):
            if not callable(getattr(value, "load_state_dict", None)):
                raise BadInputError(
                    f"state[{key!r}] ({type(value).__name__}) has state_dict() but no "
                    "load_state_dict(), so it could be saved but never restored",
                    "add a load_state_dict(state) method to it, or store its plain data",
                )
            kind = "stateful"
        elif isinstance(value, torch.Tensor):
            kind = "tensor"
        else:
            codec.encode(value, f"state[{key!r}]")  # raises BadInputError naming the value
            kind = "plain"
        parts.append(Part(key, kind, value))
    return parts


def restore(part: Part, value: Any, state: dict[str, Any], step: int) -> None:
    """Put a loaded value back: in place for objects and tensors, into `state` for plain data."""
    try:
        if part.kind in ("module", "optimizer", "stateful"):
            part.value.load_state_dict(value)
        elif part.kind == "tensor":
            if tuple(part.value.shape) != tuple(value.shape):
                raise ValueError(f"shape {tuple(value.shape)} != {tuple(part.value.shape)}")
            with torch.no_grad():
                part.value.copy_(value)
        else:
            state[part.key] = value
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise BadInputError(
            f"checkpoint step {step} does not fit state[{part.key!r}]: {type(e).__name__}: {e}",
            "resume with the same model, optimizer and state keys the checkpoint was saved "
            "with (or start a fresh checkpoint folder)",
        ) from e


def check_keys(saved: dict[str, str], parts: list[Part], step: int) -> None:
    """The caller's state must hold exactly the keys (and kinds) the checkpoint holds."""
    mine = {p.key: p.kind for p in parts}
    if mine == saved:
        return
    missing = sorted(set(mine) - set(saved))
    extra = sorted(set(saved) - set(mine))
    changed = sorted(k for k in set(mine) & set(saved) if mine[k] != saved[k])
    raise BadInputError(
        f"checkpoint step {step} holds state keys {sorted(saved)}; the state passed holds "
        f"{sorted(mine)} (not in the checkpoint: {missing}; only in the checkpoint: {extra}; "
        f"different kind: {changed})",
        "pass the same state keys the checkpoint was saved with",
    )


class Layout(Protocol):
    """How a non-sharded checkpoint's payload files look.

    `snapshot` runs in the caller's thread and must capture everything (with `copy=True` the
    caller mutates the state right after); `write` may run in a background thread and only
    sees the snapshot; `read` restores the caller's state in place and returns the saved
    per-rank RNG states (a list indexed by rank). `name` is recorded in the manifest.

    Optional: `files`, the names `read` opens: a step whose manifest lacks one is passed over
    (C111) before anything is read (`read` opens files through `checkpoint.folder.open_listed`,
    which refuses a name the manifest does not list); `check(folder, parts, step) ->
    list[Finding]` reads a verified step against the
    caller's objects without changing them, on rank 0 before the step is chosen (an error
    finding passes it over like a checksum mismatch: C111 when a file does not fit); a true
    `reads_unmarked` lets it read steps whose manifest predates the Checkpointer's entry;
    `stage(parts, rng) -> (snapshot, copy)` returns a snapshot whose tensors the callable
    `copy` fills later, in the writer thread (`Checkpointer(background_copy=True)`), or None
    for `copy` when the snapshot is already whole."""

    name: str

    def snapshot(self, parts: list[Part], rng: list[dict[str, Any]], copy: bool) -> Any: ...

    def write(self, folder: Path, snapshot: Any) -> None: ...

    def read(
        self, folder: Path, parts: list[Part], state: dict[str, Any], step: int
    ) -> list[dict[str, Any]]: ...


class FlatLayout:
    """The default layout: state.json (skeleton) and state.safetensors (tensors).

    An asynchronous save copies modules and optimizers into buffers kept from one save to the
    next (staging.py), one set per snapshot the Checkpointer may hold (`use_slot`); with
    `stage` that copy is the writer thread's (`Checkpointer(background_copy=True)`)."""

    name = "flat/1"
    files = codec.state_files("state")

    def __init__(self) -> None:
        self.stagings = [Staging()]
        self.slot = 0

    def use_slot(self, slot: int) -> None:
        """Fill slot `slot`'s buffers at the next snapshot: the Checkpointer names one that no
        queued or running write reads (`SaveQueue.free_slot`)."""
        while len(self.stagings) <= slot:
            self.stagings.append(Staging())
        self.slot = slot

    def snapshot(self, parts: list[Part], rng: list[dict[str, Any]], copy: bool) -> Any:
        if not copy:
            return self._capture(parts, rng, copy=False, staged=())
        with one_thread():  # staging.py says why
            snap, fill = self.stage(parts, rng, now=True)
            if fill is not None:
                fill()
        return snap

    def stage(
        self, parts: list[Part], rng: list[dict[str, Any]], now: bool = False
    ) -> tuple[Any, Callable[[], None] | None]:
        """The snapshot but for the modules' and optimizers' tensors, and the callable that
        copies those (in the writer thread, beside the caller's next forward and backward,
        which change neither; the caller waits for it before its update). A module with
        buffers is copied at once (a forward may change them: BatchNorm's running statistics),
        and so is everything with `now`."""
        staged = [p for p in parts if _staged(p)]
        if not now and any(
            next(p.value.buffers(), None) is not None for p in staged if p.kind == "module"
        ):
            return self.snapshot(parts, rng, True), None
        snap = self._capture(parts, rng, copy=True, staged=staged)
        staging = self.stagings[self.slot]  # this save's slot, whenever the copy runs
        if not staged:
            return snap, None
        return snap, lambda: self._copy_into(snap, staged, staging)

    def _copy_into(self, snapshot: Any, staged: list[Part], staging: Staging) -> None:
        """Copy the staged parts' tensors into `staging`'s buffers, into the snapshot."""
        doc, tensors = snapshot
        for p in staged:
            if p.kind == "module":
                value = staging.model(p.value, p.key).state_dict()
            else:
                value = staging.tree(p.value.state_dict(), p.key)
            doc["values"][p.key], tensors[p.key] = codec.encode(value, p.where)

    def _capture(
        self, parts: list[Part], rng: list[dict[str, Any]], copy: bool, staged: Any
    ) -> tuple[dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
        """(skeleton, tensors by part) of every part not in `staged` (those are filled
        later, into the places kept for them so the files do not depend on when)."""
        values: dict[str, Any] = {}
        tensors: dict[str, dict[str, torch.Tensor]] = {}
        skip = {p.key for p in staged}
        for p in parts:
            values[p.key], tensors[p.key] = (
                (None, {}) if p.key in skip else codec.encode(p.state(), p.where, copy=copy)
            )
        rng_doc, tensors[RNG] = codec.encode(rng, "rng", copy=copy)  # keys "rng[r]...": distinct
        doc = {"values": values, "kinds": {p.key: p.kind for p in parts}, "rng": rng_doc}
        return doc, tensors

    def add_rng(self, snapshot: Any, rng: list[dict[str, Any]]) -> Any:
        """The snapshot with these generator states instead of the ones it was taken with."""
        doc, tensors = snapshot
        rng_doc, rng_tensors = codec.encode(rng, "rng")
        return {**doc, "rng": rng_doc}, {**tensors, RNG: rng_tensors}

    def write(self, folder: Path, snapshot: Any) -> None:
        doc, by_part = snapshot
        tensors: dict[str, torch.Tensor] = {}
        for part in by_part.values():
            tensors.update(part)
        codec.write_state(folder, "state", doc, tensors)

    def check(self, folder: Path, parts: list[Part], step: int) -> list[Finding]:
        """C111 when step `step` does not fit the caller's state (keys and kinds, module and
        optimizer shapes, a stateful object's own check, the generator states), read from
        state.json and the header of state.safetensors; nothing changes."""
        problem = state_problem(folder, parts, step)
        if problem is None:
            return []
        file, why = problem
        return [unloadable(step, folder, file, why)]

    def read(
        self, folder: Path, parts: list[Part], state: dict[str, Any], step: int
    ) -> list[dict[str, Any]]:
        doc = codec.read_state(folder, "state")
        check_keys(doc["kinds"], parts, step)
        for kind in KIND_ORDER:  # modules before the optimizers that point into them
            for p in parts:
                if p.kind == kind:
                    restore(p, doc["values"][p.key], state, step)
        return doc["rng"]


RNG = "\0rng"  # the generator states' tensors, apart from every part's (keys are str)


def _staged(part: Part) -> bool:
    """Copied into kept buffers: modules and optimizers (most of the bytes of a save)."""
    return part.kind == "module" or (
        part.kind in ("optimizer", "stateful") and is_optimizer_like(part.value)
    )
