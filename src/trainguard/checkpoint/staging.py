"""The copy of the state that a background checkpoint write reads (`async_save=True`).

An asynchronous save must copy the state before the loop changes it. `Staging` makes that copy
of the modules and optimizers for `FlatLayout` (layout.py): in the Checkpointer's writer thread
while the loop runs its next forward and backward (`FlatLayout.stage`, with
`background_copy=True`), or in the loop's thread (`FlatLayout.snapshot`). `one_thread` serves
every copy made in the loop's thread (FlatLayout's, the sharded one). `copy.deepcopy` of
the model and of the optimizer's state dict walks every Python object of the module and
allocates every tensor afresh at each save: about 25 ms of CPU on the default model, where
copying the tensors into buffers kept from the previous save takes about 1 ms, and on a shared
machine every millisecond of CPU in the loop can become ten of waiting for a core. So `Staging`
copies tensors only: the first save of a run allocates its buffers (clones), every later one
refills them with one `torch._foreach_copy_` and rebuilds only the small containers around them.

On the loop's thread the copies run on one intra-op thread (`one_thread`, around the calls).
torch splits a copy of more than 32768 elements over its intra-op threads, and each split ends
at a barrier that waits for every thread of the team: on a machine whose other cores are busy
(other processes, the previous write, a data loader) each barrier is a wait for a core. The
default run's state is 176 tensors (12.9 MB, 27 of them split); on the shared 2-core machine
its deepcopy took 106-1110 ms on two threads (the waiting thread spinning: 15-210 ms of CPU)
and 26-96 ms on one, same code, side by side. Copying memory is bound by memory bandwidth, so
one core loses little even on an idle machine, and the save it replaces writes the same bytes
to disk. In any other thread (the Checkpointer's writer, `FlatLayout.stage`) `one_thread` must
not be used: `torch.set_num_threads` also sets MKL's thread count, for the whole process, under
the loop's matrix products; there the copy runs beside the loop's forward and backward, and the
loop waits for it (`Checkpointer.wait_copied`) only if the forward and backward end first.

Refilling is safe because nothing reads the buffers while they are refilled: the layout keeps
one `Staging` per snapshot the Checkpointer may hold (`Checkpointer(queue=N)`, save_queue.py),
and the Checkpointer names for each save one whose previous write has ended (`use_slot`).
Tensors that share a storage stay shared in the copy (tied weights are stored once); state
whose tensors are views into a larger storage, or share one in another shape, is deep-copied
(a module's state dict, never the module: its other attributes may be changing in a forward
beside the writer thread), so the files are byte for byte those a save in the loop writes.
Buffers whose shapes, dtypes or devices no longer match are allocated afresh."""

from __future__ import annotations

import contextlib
import copy
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

# Containers walked into; anything else (a namedtuple, a custom class) is a leaf, deep-copied.
MAPPINGS, SEQUENCES = (dict, OrderedDict), (list, tuple)


class StagedModel:
    """A module's weights, copied: all that `safetensors.torch.save_model` reads of a module is
    its `state_dict()`, in which tied weights share one tensor (stored once, as from the
    module)."""

    def __init__(self, state: OrderedDict[str, torch.Tensor]) -> None:
        self._state = state

    def state_dict(self) -> OrderedDict[str, torch.Tensor]:
        return OrderedDict(self._state)  # a new dict: save_model deletes the tied names from it


class Staging:
    """The copies an asynchronous save writes from, kept from one save to the next."""

    def __init__(self) -> None:
        self._buffers: dict[str, list[torch.Tensor]] = {}
        self.refills = 0
        """How many copies were refilled in place rather than allocated (tests read it)."""

    def model(self, live: nn.Module, name: str = "model") -> StagedModel:
        """`live`'s weights now, where `live`'s later updates do not reach them (`name`: the
        buffers' name in this Staging, one per module)."""
        state = live.state_dict()
        shared = _distinct(list(state.values()), by_object=False)
        if shared is None:  # the tensors only: a module's other attributes may be changing
            return StagedModel(copy.deepcopy(state))  # (a forward beside the writer thread)
        unique, index = shared
        buffers = self._fill(f"model:{name}", unique)
        return StagedModel(OrderedDict((k, buffers[i]) for k, i in zip(state, index, strict=True)))

    def tree(self, live: Any, name: str = "tree") -> Any:
        """`live` (dicts, lists and tuples of tensors and plain values: an optimizer's state
        dict) copied, its tensors into the buffers of the previous call of the same `name`
        when they fit."""
        shared = _distinct(list(_tensors(live, set())), by_object=True)
        if shared is None:
            return copy.deepcopy(live)
        unique, index = shared
        buffers = self._fill(f"tree:{name}", unique)
        return _rebuild(live, (buffers[i] for i in index), {})

    def _fill(self, slot: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        buffers = self._buffers.get(slot)
        if buffers is not None and _same_layout(buffers, tensors):
            if buffers:
                with torch.no_grad():
                    torch._foreach_copy_(buffers, [t.detach() for t in tensors])
            self.refills += 1
            return buffers
        buffers = self._buffers[slot] = [t.detach().clone() for t in tensors]
        return buffers


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads limited to one in this thread for the block (see the module
    docstring); the count is restored after, so the loop's kernels see the same one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _distinct(
    tensors: list[torch.Tensor], by_object: bool
) -> tuple[list[torch.Tensor], list[int]] | None:
    """The distinct tensors, and for each input its index among them. `by_object`: the same
    tensor object twice is one (a pickled tree); else tensors on one storage are one (tied
    weights in a state_dict). None unless every tensor is contiguous and covers its whole
    storage, and no storage holds two distinct ones: a clone of each distinct tensor then
    serialises exactly like a deepcopy of them all."""
    unique: list[torch.Tensor] = []
    index: list[int] = []
    at_key: dict[int, int] = {}
    storages: set[int] = set()
    for t in tensors:
        storage = t.untyped_storage()
        if (
            not t.is_contiguous()
            or t.storage_offset() != 0
            or storage.nbytes() != t.numel() * t.element_size()
        ):
            return None
        ptr = storage.data_ptr() if t.numel() else None
        key = id(t) if by_object else ptr
        at = None if key is None else at_key.get(key)
        if at is None:
            if ptr is not None and ptr in storages:
                return None  # another tensor on a storage already seen
            at = len(unique)
            unique.append(t)
            if key is not None:
                at_key[key] = at
            if ptr is not None:
                storages.add(ptr)
        elif unique[at].shape != t.shape or unique[at].dtype != t.dtype:
            return None
        index.append(at)
    return unique, index


def _tensors(tree: Any, seen: set[int]) -> Iterator[torch.Tensor]:
    """The tensors of `tree` in order; a container met twice is walked once (as pickle and
    deepcopy see it: one object)."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif type(tree) in MAPPINGS + SEQUENCES and id(tree) not in seen:
        seen.add(id(tree))
        for value in tree.values() if type(tree) in MAPPINGS else tree:
            yield from _tensors(value, seen)


def _rebuild(tree: Any, copies: Iterator[torch.Tensor], memo: dict[int, Any]) -> Any:
    """`tree` with each tensor replaced by the next copy, in `_tensors`' order. An object met
    twice is rebuilt once and shared, as in `tree` (pickle writes it once): `memo` is
    deepcopy's, which copies the plain values."""
    if isinstance(tree, torch.Tensor):
        return next(copies)
    if id(tree) in memo:
        return memo[id(tree)]
    if type(tree) in MAPPINGS:
        rebuilt = type(tree)((k, _rebuild(v, copies, memo)) for k, v in tree.items())
    elif type(tree) in SEQUENCES:
        rebuilt = type(tree)(_rebuild(v, copies, memo) for v in tree)
    else:
        return copy.deepcopy(tree, memo)  # numbers, strings, None: returned as they are
    memo[id(tree)] = rebuilt
    return rebuilt


def _same_layout(buffers: list[torch.Tensor], tensors: list[torch.Tensor]) -> bool:
    return len(buffers) == len(tensors) and all(
        b.shape == t.shape and b.dtype == t.dtype and b.device == t.device
        for b, t in zip(buffers, tensors, strict=True)
    )
