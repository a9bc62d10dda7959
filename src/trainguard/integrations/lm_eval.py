"""lm-evaluation-harness adapter (optional extra): a trainguard checkpoint as an `lm_eval` LM.

    from trainguard.integrations.lm_eval import run_lm_eval
    results = run_lm_eval("runs/default", tasks=["my_task"], include_path="my_tasks/")

Standard tasks defined in local YAML files (`include_path`) then run on the checkpoint. The
three request types map onto trainguard's own scoring, so the harness and `trainguard eval`
score the same tokens: the document-start token `<|endoftext|>` is prefixed to every context,
as trainguard trains with documents separated by it.

`lm_eval` is imported only when the adapter is used; without it, importing this module works
and using it raises a BadInputError that says how to install it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.errors import BadInputError
from trainguard.evals.scoring import (
    bos_ids,
    encode_context,
    encode_continuation,
    greedy_generate,
    loglikelihoods,
    sum_nll_bits,
)

DOC_START = "<|endoftext|>"


def _require_lm_eval() -> Any:
    try:
        import lm_eval
        from lm_eval.api.model import LM
    except ImportError:
        raise BadInputError(
            "lm-evaluation-harness is not installed",
            "pip install lm-eval (the optional extra); trainguard's own `trainguard eval` works "
            "without it",
        ) from None
    return lm_eval, LM


def make_lm(checkpoint: str | Path, device: str = "cpu", batch_size: int = 32) -> Any:
    """An `lm_eval.api.model.LM` wrapping the newest checkpoint of a run dir, or a checkpoint."""
    _, LM = _require_lm_eval()
    from trainguard.evals.load import load_model_for_eval

    model, tokenizer, _ = load_model_for_eval(checkpoint, device=device)

    class TrainguardLM(LM):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.model, self.tokenizer = model, tokenizer
            self.device_name, self.batch_size = device, batch_size

        def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
            pairs = [
                (
                    encode_context(self.tokenizer, DOC_START, ctx),
                    encode_continuation(self.tokenizer, cont),
                )
                for ctx, cont in (r.args for r in requests)
            ]
            return loglikelihoods(
                self.model, pairs, device=self.device_name, batch_size=self.batch_size
            )

        def loglikelihood_rolling(self, requests: list[Any]) -> list[float]:
            # Rolling log-likelihood of the whole text in natural log (the harness converts).
            out = []
            for (text,) in (r.args for r in requests):
                ids = encode_context(self.tokenizer, DOC_START, text)
                bits, _ = sum_nll_bits(self.model, ids, device=self.device_name)
                out.append(-bits * 0.6931471805599453)
            return out

        def generate_until(self, requests: list[Any]) -> list[str]:
            outs = []
            for ctx, kwargs in (r.args for r in requests):
                until = kwargs.get("until", [])
                until = [until] if isinstance(until, str) else list(until)
                (text,) = greedy_generate(
                    self.model,
                    self.tokenizer,
                    [encode_context(self.tokenizer, DOC_START, ctx)],
                    max_new_tokens=int(kwargs.get("max_gen_toks", 64)),
                    stop=until,
                    stop_ids=bos_ids(self.tokenizer, DOC_START),
                    device=self.device_name,
                )
                outs.append(text)
            return outs

    return TrainguardLM()


def run_lm_eval(
    checkpoint: str | Path,
    tasks: list[str],
    *,
    include_path: str | Path | None = None,
    limit: int | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """`lm_eval.simple_evaluate` on the checkpoint; tasks may come from local YAML files."""
    lm_eval, _ = _require_lm_eval()
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(include_path) if include_path else None)
    return lm_eval.simple_evaluate(
        model=make_lm(checkpoint, device=device), tasks=tasks, task_manager=manager, limit=limit
    )
