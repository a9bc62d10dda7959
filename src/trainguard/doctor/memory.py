"""Memory holds what was written: fill a buffer with patterns, read it back (host memory on
every rank, device memory too on CUDA).

Patterns: all 0101.. and all 1010.. (every bit both ways), then each 64-bit word's own index
XOR a key (an address-dependent pattern: a stuck or swapped address line shows up as words in
the wrong place).
"""

from __future__ import annotations

import torch

from trainguard.doctor.report import LocalResult, RankContext, Stopwatch

_FIVES = 0x5555555555555555
_PATTERNS = (_FIVES, ~_FIVES)  # 0x5555.. and 0xAAAA.. as signed 64-bit values
_KEY = 0x3C3C3C3C3C3C3C3C
_CHUNK = 1 << 24  # words compared per address-pattern chunk (128 MiB)


def verify_buffer(buf: torch.Tensor) -> int:
    """Fill `buf` (int64) with each pattern and read it back; the number of wrong words."""
    wrong = 0
    for pattern in _PATTERNS:
        buf.fill_(pattern)
        wrong += int((buf != pattern).sum())
    torch.arange(buf.numel(), out=buf).bitwise_xor_(_KEY)
    for start in range(0, buf.numel(), _CHUNK):
        part = buf[start : start + _CHUNK]
        expected = torch.arange(start, start + part.numel(), device=buf.device) ^ _KEY
        wrong += int((part != expected).sum())
    return wrong


def _probe(ctx: RankContext, where: str, words: int) -> LocalResult:
    device = ctx.device if where == "device" else torch.device("cpu")
    buf = torch.empty(words, dtype=torch.int64, device=device)
    watch = Stopwatch(device)
    wrong = 0

    def run() -> None:
        nonlocal wrong  # the worst pass: the timing repeats the pass, the count must not grow
        wrong = max(wrong, verify_buffer(buf))

    # Four times: an intermittent fault gets four chances, and the fastest of four is the
    # memory's speed (the fastest of two was once 1.51x the other healthy rank's: a false H403).
    seconds = watch.fastest(run, reps=4)
    gib = words * 8 / (1 << 30)
    out = LocalResult()
    out.figures[f"{where}_memory_gib"] = gib
    out.figures[f"{where}_memory_gbps"] = gib * (1 << 30) * 6 / seconds / 1e9  # 3 fills, 3 reads
    if where == "host":
        out.timings["memory"] = seconds / gib  # seconds per GiB verified
    if wrong:
        out.findings.append(
            ctx.who.finding(
                "H405",
                f"{where} memory: {wrong} of {words} 64-bit words read back wrong "
                f"({gib:.2f} GiB tested)",
                memory=where,
                wrong_words=wrong,
                gib=gib,
            )
        )
    return out


def check_memory(ctx: RankContext) -> LocalResult:
    out = _probe(ctx, "host", ctx.sizes.host_mib << 17)  # MiB -> 64-bit words
    if ctx.device.type == "cuda" and ctx.sizes.device_fraction > 0:
        free, _ = torch.cuda.mem_get_info(ctx.device)
        out.merge(_probe(ctx, "device", int(free * ctx.sizes.device_fraction) // 8))
        torch.cuda.empty_cache()
    return out
