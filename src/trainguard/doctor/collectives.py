"""Collectives against known answers, on the job's own process group (gloo on CPU, nccl on GPU).

Every rank contributes a known tensor whose values are small integers, chosen so that every
partial sum is exact in the dtype: the results are checked for equality, not closeness, on
every rank. Rank r's tensor is ((i + 7 r) mod m) + 1, with m * world_size <= 2^p (p = 24 for
fp32, 8 for bf16, 11 for fp16); when the world is too large for the dtype, fp32 is used and
the result says so.

- all-reduce (sum): each rank keeps what it contributed; the contributions are then gathered,
  so a wrong sum is blamed on the rank whose contribution differs from its known tensor;
- all-gather, broadcast (from the first and the last rank), reduce-scatter (native where the
  backend has it, else all-to-all plus a local sum, and the result says so);
- ring links: each rank sends a known tensor to both neighbours and checks what arrives, so a
  single bad link is named;
- bandwidth per operation and size (nccl-tests' algorithm and bus bandwidth conventions);
- the wall clock right after a common collective (clock skew between hosts).

Every wait has the recipe's `distributed.collective_timeout_s`; after the first error the
remaining collectives are skipped (the group may be broken) and the error is reported.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch
import torch.distributed as dist

from trainguard.doctor.report import RankContext
from trainguard.doctor.team import Team

_PRECISION_BITS = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11}
BUS_FACTOR = {  # nccl-tests: bus bandwidth = algorithm bandwidth x factor(n)
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


class CollectiveError(RuntimeError):
    """A collective raised or timed out; the message names which."""


def exact_dtype(dtype: torch.dtype, world: int) -> tuple[torch.dtype, int]:
    """(dtype, m): the tested dtype and the value range that keeps every sum exact."""
    m = min(16, 2 ** _PRECISION_BITS[dtype] // world)
    if m >= 1:
        return dtype, m
    return torch.float32, min(16, 2**24 // world)


def known(rank: int, n: int, m: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return ((torch.arange(n, device=device) + 7 * rank) % m + 1).to(dtype)


def expected_sum(world: int, n: int, m: int, device: torch.device) -> torch.Tensor:
    """The exact sum of every rank's `known` tensor, in float64: ranks whose shift 7q mod m is
    the same contribute the same tensor, so O(m n) work whatever the world size."""
    shifts = torch.bincount(torch.arange(world) * 7 % m, minlength=m).tolist()
    i = torch.arange(n, device=device)
    total = torch.zeros(n, dtype=torch.float64, device=device)
    for shift, count in enumerate(shifts):
        if count:
            total += count * ((i + shift) % m + 1).double()
    return total


def link_tensor(src: int, dst: int, n: int, dtype: torch.dtype, device: torch.device):
    """What `src` sends to its neighbour `dst`: small integers, exact in any dtype."""
    return ((torch.arange(n, device=device) * 3 + 11 * src + 5 * dst) % 200 + 1).to(dtype)


class Collectives:
    """One rank's collective checks; `run()` returns plain data for rank 0's analysis."""

    def __init__(self, team: Team, ctx: RankContext) -> None:
        self.team, self.ctx = team, ctx
        self.rank, self.world, self.device = team.rank, team.size, ctx.device
        self.dtype, self.m = exact_dtype(ctx.dtype, team.size)
        self.timeout = datetime.timedelta(seconds=ctx.plan.collective_timeout_s)
        self.n = 4096

    def _wait(self, what: str, work: Any) -> None:
        try:
            for w in work if isinstance(work, list) else [work]:
                w.wait(timeout=self.timeout)
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise CollectiveError(f"{what}: {first}") from e
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _known(self, rank: int, n: int | None = None) -> torch.Tensor:
        return known(rank, n or self.n, self.m, self.dtype, self.device)

    def _wrong_blocks(self, blocks: torch.Tensor, ranks: list[int]) -> dict[str, int]:
        """{rank: wrong elements} for each block (row) that differs from that rank's tensor."""
        out = {}
        for q, block in zip(ranks, blocks, strict=True):
            wrong = int((block != self._known(q, block.numel())).sum())
            if wrong:
                out[str(q)] = wrong
        return out

    # -- correctness -----------------------------------------------------------------------------
    def all_reduce(self) -> dict[str, Any]:
        x = self._known(self.rank)
        if self.ctx.planted("bad-allreduce"):
            x[self.n // 2] += 1  # still exact: a wrong value, not a rounding
        contribution = x.clone()
        self._wait("all_reduce", dist.all_reduce(x, async_op=True))
        wrong = int((x.double() != expected_sum(self.world, self.n, self.m, self.device)).sum())
        gathered = torch.empty(self.world * self.n, dtype=self.dtype, device=self.device)
        self._wait("all_gather of contributions", _all_gather(gathered, contribution))
        bad = self._wrong_blocks(gathered.view(self.world, self.n), list(range(self.world)))
        return {"ok": not wrong and not bad, "wrong_elements": wrong, "bad_contributors": bad}

    def all_gather(self) -> dict[str, Any]:
        out = torch.empty(self.world * self.n, dtype=self.dtype, device=self.device)
        self._wait("all_gather", _all_gather(out, self._known(self.rank)))
        bad = self._wrong_blocks(out.view(self.world, self.n), list(range(self.world)))
        return {"ok": not bad, "bad_sources": bad}

    def broadcast(self) -> dict[str, Any]:
        bad: dict[str, int] = {}
        for src in sorted({0, self.world - 1}):
            t = self._known(src) if self.rank == src else torch.zeros_like(self._known(src))
            self._wait(f"broadcast from rank {src}", dist.broadcast(t, src, async_op=True))
            bad |= self._wrong_blocks(t.view(1, -1), [src])
        return {"ok": not bad, "bad_sources": bad}

    def reduce_scatter(self) -> dict[str, Any]:
        inp = self._known(self.rank, self.n * self.world)
        out = torch.empty(self.n, dtype=self.dtype, device=self.device)
        emulated = self._reduce_scatter(out, inp)
        want = expected_sum(self.world, self.n * self.world, self.m, self.device)
        want = want[self.rank * self.n : (self.rank + 1) * self.n]
        wrong = int((out.double() != want).sum())
        return {"ok": not wrong, "wrong_elements": wrong, "emulated": emulated}

    def _reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor) -> str | None:
        """Native reduce-scatter; where the backend lacks it, all-to-all and a local sum
        (the same data movement). Returns how it was emulated, or None."""
        native = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        try:
            work = native(out, inp, async_op=True)
        except (RuntimeError, NotImplementedError) as e:
            if "support" not in str(e).lower():
                raise
        else:
            self._wait("reduce_scatter", work)
            return None
        parts = torch.empty_like(inp)
        self._wait("all_to_all", dist.all_to_all_single(parts, inp, async_op=True))
        out.copy_(parts.view(self.world, -1).sum(0))
        return f"all_to_all_single + local sum ({self.team.backend} has no reduce_scatter)"

    def ring_links(self) -> list[dict[str, Any]]:
        """Send a known tensor to both ring neighbours; what arrived from each, checked."""
        nxt, prv = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        n = max(1, self.ctx.sizes.link_bytes // _itemsize(self.dtype))
        sends = [link_tensor(self.rank, p, n, self.dtype, self.device) for p in (nxt, prv)]
        bufs = [torch.empty(n, dtype=self.dtype, device=self.device) for _ in range(2)]
        ops = [
            dist.P2POp(dist.isend, sends[0], nxt, tag=1),
            dist.P2POp(dist.isend, sends[1], prv, tag=2),
            dist.P2POp(dist.irecv, bufs[0], prv, tag=1),
            dist.P2POp(dist.irecv, bufs[1], nxt, tag=2),
        ]
        t0 = time.perf_counter()
        self._wait(f"ring exchange with ranks {prv} and {nxt}", dist.batch_isend_irecv(ops))
        seconds = time.perf_counter() - t0
        links = []
        for src, buf in ((prv, bufs[0]), (nxt, bufs[1])):
            wrong = int((buf != link_tensor(src, self.rank, n, self.dtype, self.device)).sum())
            links.append(
                {
                    "src": src,
                    "dst": self.rank,
                    "wrong": wrong,
                    "bytes": buf.numel() * buf.element_size(),
                    "seconds": seconds,
                }
            )
        return links

    # -- speed and clocks ------------------------------------------------------------------------
    def bandwidth(self) -> list[dict[str, Any]]:
        """Seconds per operation at each size. `bytes` follows nccl-tests: the whole buffer
        (all ranks' parts) for all-gather and reduce-scatter, the tensor for the others."""
        out = []
        for size in self.ctx.sizes.collective_bytes:
            n = max(1, size // _itemsize(self.dtype) // self.world)
            for op in ("all_reduce", "all_gather", "broadcast", "reduce_scatter"):
                out.append(self._time_op(op, n))
        return out

    def _time_op(self, op: str, n: int) -> dict[str, Any]:
        part = torch.ones(n, dtype=self.dtype, device=self.device)
        whole = torch.ones(n * self.world, dtype=self.dtype, device=self.device)

        def once() -> None:
            if op == "reduce_scatter":
                self._reduce_scatter(part, whole)
            elif op == "all_gather":
                self._wait(op, _all_gather(whole, part))
            elif op == "broadcast":
                self._wait(op, dist.broadcast(whole, 0, async_op=True))
            else:
                self._wait(op, dist.all_reduce(whole, async_op=True))

        once()  # warm-up: connections, buffers
        self.sync()
        iters = self.ctx.sizes.collective_iters
        t0 = time.perf_counter()
        for _ in range(iters):
            once()
        seconds = (time.perf_counter() - t0) / iters
        return {"op": op, "bytes": whole.numel() * whole.element_size(), "seconds": seconds}

    def sync(self) -> None:
        self._wait("sync", dist.all_reduce(torch.zeros(1, device=self.device), async_op=True))

    def clock(self, samples: int = 3) -> list[float]:
        """time.time() right after each of a few common all-reduces: rank 0 compares them
        sample by sample (clock skew, to within the all-reduce's exit spread)."""
        seen = []
        for _ in range(samples):
            self.sync()
            seen.append(time.time())
        return seen

    def run(self) -> dict[str, Any]:
        result: dict[str, Any] = {"dtype": str(self.dtype).removeprefix("torch."), "ops": {}}
        steps = (
            ("all_reduce", self.all_reduce),
            ("all_gather", self.all_gather),
            ("broadcast", self.broadcast),
            ("reduce_scatter", self.reduce_scatter),
        )
        try:
            for name, fn in steps:
                result["ops"][name] = fn()
            result["links"] = self.ring_links()
            result["bandwidth"] = self.bandwidth()
            result["clock"] = self.clock()
        except CollectiveError as e:
            result["error"] = str(e)
        return result


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _all_gather(out: torch.Tensor, inp: torch.Tensor) -> Any:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(out, inp, async_op=True)
