"""Subtle software changes for the reference drills: `python -m trainguard.cli._planted KIND
ARGS...` runs `trainguard ARGS...` with one change planted in this process only, the way a
library upgrade or a small code edit would make it. Nothing in trainguard reads these; they
exist so the drills (and tests) can prove the reference comparison catches them.

- `attention_scale`  attention logits scaled by 1/d instead of 1/sqrt(d) (a muP-style edit)
- `init_unscaled`    residual projections initialised at std 0.02, without GPT-2's
                     1/sqrt(2 n_layers) scaling
- `tokenizer_merge`  the tokenizer's last BPE merge dropped (use a fresh data.cache_dir: a
                     cached tokenizer would be reused)
- `lr_schedule_2x`   the learning-rate schedule advances two steps per step (a scheduler
                     stepped twice, a classic)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def attention_scale() -> None:
    import trainguard.model.gpt as gpt

    real = F.scaled_dot_product_attention

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        return real(q, k, v, scale=1.0 / q.size(-1), **kw)

    class Functional:  # torch.nn.functional with one function changed
        scaled_dot_product_attention = staticmethod(sdpa)

        def __getattr__(self, name: str) -> Any:
            return getattr(F, name)

    gpt.F = Functional()  # type: ignore[assignment]


def init_unscaled() -> None:
    import trainguard.model.gpt as gpt

    real_init = gpt.GPT.__init__

    def init(self: gpt.GPT, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02)

    gpt.GPT.__init__ = init  # type: ignore[method-assign]


def tokenizer_merge() -> None:
    from tokenizers import Tokenizer

    import trainguard.data.prepare as prepare
    from trainguard.data.tokenizer import prepare_for_encoding

    real_train = prepare.train_tokenizer

    def train(*args: Any, **kwargs: Any) -> Tokenizer:
        doc = json.loads(real_train(*args, **kwargs).to_str())
        merge = doc["model"]["merges"].pop()  # the last merge, and the token it made
        pair = merge.split(" ") if isinstance(merge, str) else merge
        del doc["model"]["vocab"]["".join(pair)]
        return prepare_for_encoding(Tokenizer.from_str(json.dumps(doc)))

    prepare.train_tokenizer = train  # type: ignore[assignment]


def lr_schedule_2x() -> None:
    import trainguard.train.schedule as schedule  # LrSchedule.factor calls its lr_at

    real = schedule.lr_at

    def lr_at(step: int, peak: float, warmup: int, total: int, min_ratio: float) -> float:
        return real(min(2 * step, total), peak, warmup, total, min_ratio)

    schedule.lr_at = lr_at  # type: ignore[assignment]


PLANTS: dict[str, Callable[[], None]] = {
    "attention_scale": attention_scale,
    "init_unscaled": init_unscaled,
    "tokenizer_merge": tokenizer_merge,
    "lr_schedule_2x": lr_schedule_2x,
}
