"""Elastic deterministic data order: sample = f(seed, epoch, position), nothing else.

The sample at global position p is `permutation(p // N)[p % N]`, where each epoch's
permutation is a keyed Feistel network (Luby & Rackoff 1988) on the smallest domain of an
even number of bits >= N, with cycle-walking (Black & Rogaway 2002) to stay inside [0, N).
No table is stored, so memory is O(1) at any N, and since the order is a pure function of
(seed, epoch, position) it cannot depend on the process count, the worker count or restarts:
a resumed run with a different world size reads exactly the same global batches, each rank
taking its contiguous slice (`rank_slice`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import xxhash

from trainguard.errors import BadInputError
from trainguard.findings import Finding

ROUNDS = 8  # 4 suffice for a pseudo-random permutation; more mix small domains better
_M64 = (1 << 64) - 1
_C1, _C2, _GOLDEN = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15
_U1, _U2 = np.uint64(_C1), np.uint64(_C2)
_S27, _S30, _S31 = np.uint64(27), np.uint64(30), np.uint64(31)


def _splitmix64(x: int) -> int:
    """The splitmix64 finaliser (Steele et al. 2014) on a Python int, mod 2**64."""
    x &= _M64
    x = ((x ^ (x >> 30)) * _C1) & _M64
    x = ((x ^ (x >> 27)) * _C2) & _M64
    return x ^ (x >> 31)


def round_keys(seed: int, epoch: int) -> list[int]:
    """ROUNDS 64-bit keys from (seed, epoch): xxh64 of both, expanded with splitmix64."""
    base = xxhash.xxh64_intdigest(f"trainguard-order:{seed}:{epoch}".encode())
    return [_splitmix64(base + (r + 1) * _GOLDEN) for r in range(ROUNDS)]


class ElasticOrder:
    """A keyed bijection of [0, num_samples) per epoch, evaluated one position at a time."""

    def __init__(self, num_samples: int, seed: int) -> None:
        if num_samples < 1:
            raise BadInputError(
                f"the data order needs at least one sample, got num_samples={num_samples}",
                "add data or lower data.seq_len so that the split holds at least one sample",
            )
        self.num_samples = int(num_samples)
        self.seed = int(seed)
        bits = max(2, (self.num_samples - 1).bit_length())
        self.half_bits = (bits + 1) // 2  # domain 2**(2*half_bits) >= N, < 4N: few walks
        self._mask = (1 << self.half_bits) - 1
        self._keys: dict[int, list[int]] = {}

    def _epoch_keys(self, epoch: int) -> list[int]:
        keys = self._keys.get(epoch)
        if keys is None:
            if len(self._keys) > 64:  # a handful of live epochs; O(1) memory
                self._keys.clear()
            keys = self._keys[epoch] = round_keys(self.seed, epoch)
        return keys

    # -- scalar path ---------------------------------------------------------------------
    def _feistel(self, x: int, keys: list[int]) -> int:
        h, mask = self.half_bits, self._mask
        left, right = x >> h, x & mask
        for k in keys:
            left, right = right, left ^ (_splitmix64(right ^ k) & mask)
        return (left << h) | right

    def index(self, epoch: int, i: int) -> int:
        """The sample at within-epoch index i of `epoch` (scalar reference path)."""
        if not 0 <= i < self.num_samples:
            raise IndexError(f"index {i} outside [0, {self.num_samples})")
        keys = self._epoch_keys(epoch)
        y = self._feistel(i, keys)
        while y >= self.num_samples:  # cycle-walking: stays a bijection of [0, N)
            y = self._feistel(y, keys)
        return y

    def sample_id(self, position: int) -> int:
        """The sample at global position `position` (scalar path)."""
        epoch, i = divmod(int(position), self.num_samples)
        return self.index(epoch, i)

    # -- vectorised path -----------------------------------------------------------------
    def _feistel_np(self, x: np.ndarray, keys: list[int]) -> np.ndarray:
        # The same rounds as _feistel, on uint64 arrays: multiplication wraps mod 2**64 exactly
        # like the masked Python ints. In-place ufuncs: no temporaries per operation.
        h, mask = np.uint64(self.half_bits), np.uint64(self._mask)
        left, right = x >> h, x & mask
        t, u = np.empty_like(x), np.empty_like(x)
        for k in keys:
            np.bitwise_xor(right, np.uint64(k), out=t)  # splitmix64(right ^ k) & mask ...
            np.right_shift(t, _S30, out=u)
            t ^= u
            t *= _U1
            np.right_shift(t, _S27, out=u)
            t ^= u
            t *= _U2
            np.right_shift(t, _S31, out=u)
            t ^= u
            t &= mask
            t ^= left  # ... ^ left
            left, right, t = right, t, left
        return (left << h) | right

    def permute(self, epoch: int, idx: np.ndarray) -> np.ndarray:
        """Within-epoch indices -> sample ids for one epoch, vectorised (uint64 arithmetic)."""
        keys = self._epoch_keys(epoch)
        n = np.uint64(self.num_samples)
        y = self._feistel_np(np.asarray(idx, dtype=np.uint64), keys)
        out = y >= n
        while out.any():  # each pass walks only the elements still outside [0, N)
            y[out] = self._feistel_np(y[out], keys)
            out[out] = y[out] >= n
        return y.astype(np.int64)

    def sample_ids(self, start: int, count: int) -> np.ndarray:
        """Sample ids (int64) at global positions start .. start+count-1, epochs included."""
        if start < 0 or count < 0:
            raise BadInputError(f"positions must be >= 0, got start={start}, count={count}")
        pos = np.arange(count, dtype=np.uint64) + np.uint64(start)
        n = np.uint64(self.num_samples)
        epochs, idx = pos // n, pos % n
        out = np.empty(count, dtype=np.int64)
        first, last = start // self.num_samples, (start + count - 1) // self.num_samples
        for e in range(first, last + 1) if count else ():
            sel = epochs == np.uint64(e)
            out[sel] = self.permute(e, idx[sel])
        return out

    def permutation(self, epoch: int) -> np.ndarray:
        """The whole permutation of one epoch (materialised: N int64s)."""
        return self.permute(epoch, np.arange(self.num_samples, dtype=np.uint64))


def batch_hash(ids: np.ndarray) -> str:
    """xxh64 hex of the sample ids as little-endian int64, in order."""
    return xxhash.xxh64(np.ascontiguousarray(ids, dtype="<i8").tobytes()).hexdigest()


def rank_slice(ids: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank `rank`'s contiguous share of a global batch (same global batch for any world size)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise BadInputError(
            f"rank {rank} is outside world size {world_size}", "launch with 0 <= rank < world"
        )
    if len(ids) % world_size:
        raise BadInputError(
            f"a global batch of {len(ids)} samples does not split evenly over {world_size} "
            "processes",
            f"set train.batch_size to a multiple of the world size {world_size}",
        )
    per = len(ids) // world_size
    return ids[rank * per : (rank + 1) * per]


@dataclass(frozen=True)
class LoaderState:
    """Where the loader is, as checkpoints record it (`loader.json`).

    `global_position` = samples consumed since the start of training, over all epochs: what the
    elastic order is indexed by. `epoch` and `position` (within the epoch) derive from it and
    the epoch size; they are kept for humans and checked on load, so a checkpoint resumed on
    data of another size is refused instead of reading from the wrong place.
    """

    epoch: int = 0
    position: int = 0
    global_position: int = 0

    @classmethod
    def at(cls, global_position: int, num_samples: int) -> LoaderState:
        return cls(
            epoch=global_position // num_samples,
            position=global_position % num_samples,
            global_position=global_position,
        )

    def advanced(self, samples: int, num_samples: int) -> LoaderState:
        """The state after `samples` more samples of the order were consumed."""
        return LoaderState.at(self.global_position + samples, num_samples)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], num_samples: int | None = None) -> LoaderState:
        try:
            state = cls(
                epoch=int(d["epoch"]),
                position=int(d["position"]),
                global_position=int(d["global_position"]),
            )
        except (KeyError, TypeError, ValueError):
            raise BadInputError(
                f"loader state {d!r} is not "
                "{'epoch': int, 'position': int, 'global_position': int}",
                "resume from a checkpoint written by trainguard (loader.json)",
            ) from None
        if num_samples is not None and state != cls.at(state.global_position, num_samples):
            raise BadInputError(
                f"loader state (epoch {state.epoch}, position {state.position}) does not match "
                f"global position {state.global_position} with {num_samples} samples per epoch "
                "(the data changed?)",
                "resume with the data the run was started with",
            )
        return state


def compare_batch_hashes(expected: dict[int, str], actual: dict[int, str]) -> list[Finding]:
    """D110 for every step present in both whose batch hash differs (replay, skip, reorder)."""
    return [
        Finding.of(
            "D110",
            f"step {step} read a different batch after the restart "
            f"(hash {actual[step]}, recorded {expected[step]})",
            step=step,
            data={"expected": expected[step], "actual": actual[step]},
        )
        for step in sorted(set(expected) & set(actual))
        if expected[step] != actual[step]
    ]
