"""Train/serve consistency (M104): teacher-forced logits must equal prefix-only logits.

Generation computes position t from the prefix x[:t+1] alone; training computes it inside the
full sequence. A forward on prefixes of a few lengths (1 and T-1 included) must reproduce the
full forward's logits there. Shapes differ, so kernels may block differently: the allowed
difference is `rtol` of the largest logit (1e-4 by default, far below any real leak).
"""

from __future__ import annotations

import torch

from trainguard.checks._model_runner import (
    ModelRunner,
    finite_abs_max,
    logit_change,
    position_ranges,
)
from trainguard.findings import Finding

RTOL = 1e-4


def prefix_lengths(seq_len: int) -> list[int]:
    """Prefix lengths to serve: 1, about a third, about two thirds, T-1."""
    if seq_len < 2:
        return []
    return sorted({1, max(1, seq_len // 3), max(1, (2 * seq_len) // 3 + 1), seq_len - 1})


def check_train_serve(
    runner: ModelRunner,
    x: torch.Tensor,
    base: torch.Tensor,
    mode: str,
    rtol: float = RTOL,
    atol: float = 0.0,
) -> list[Finding]:
    """M104 if a prefix forward's logits differ from the full forward's at the same positions."""
    scale = finite_abs_max(base)  # deliberate host sync, once
    tol = atol + rtol * max(scale, 1e-30)
    bad: dict[int, dict] = {}
    with runner.timed("train_serve") as stats:
        for length in prefix_lengths(x.shape[1]):
            logits, _ = runner.forward(x[:, :length].contiguous(), stats)
            delta = logit_change(logits, base[:, :length], dim=(0, 2))
            positions = (delta > tol).nonzero().flatten().tolist()
            if positions:
                bad[length] = {"positions": positions, "max_change": float(delta.max())}
    if not bad:
        return []
    biggest = max(v["max_change"] for v in bad.values())
    return [
        Finding.of(
            "M104",
            f"train/serve mismatch in {mode} mode: logits of a forward on the prefix alone "
            f"differ from the teacher-forced forward for prefix lengths {sorted(bad)} "
            f"(max |delta logit| {biggest:.3g}, allowed {tol:.3g})",
            where=f"{mode} mode",
            data={
                "mode": mode,
                "prefix_lengths_tested": prefix_lengths(x.shape[1]),
                "mismatched": {
                    str(n): {
                        "positions": position_ranges(v["positions"]),
                        "max_change": v["max_change"],
                    }
                    for n, v in sorted(bad.items())
                },
                "allowed": tol,
            },
        )
    ]
