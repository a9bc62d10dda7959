"""The recipe's `evals` section: which evals run before, during and after training.

Pure pydantic (the config floor): `evals/` reads it, it imports nothing of `evals/`."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from trainguard.util.strict import StrictModel


class _Section(StrictModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class CanaryConfig(_Section):
    prompt: str
    """Text the model completes greedily."""
    expect: str
    """Substring the completion must contain (case-sensitive)."""
    max_new_tokens: int = Field(32, ge=1, le=512)
    """Tokens decoded at most."""


class EvalsConfig(_Section):
    specs: list[str] = Field(default_factory=lambda: ["python_next_line"])
    """Eval specs: shipped names (`trainguard.recipes.evals`) or paths to spec YAML files. At
    least one must be marked `use_case: true` unless the run starts with `--no-evals`."""
    interval: int | None = Field(None, ge=1)
    """Run the evals every this many steps (also before the first step and at the end).
    Default: `train.eval_interval`."""
    canaries: list[CanaryConfig] = Field(default_factory=list)
    """Prompt -> expected-substring checks run with the evals."""
    max_examples: int | None = Field(200, ge=1)
    """Examples per task at most (the first ones, in the data's order); null: all."""
    drop_alpha: float = Field(0.01, gt=0.0, lt=0.5)
    """Significance level of the one-sided test that flags an eval metric dropping below its
    best earlier value (E121)."""
    lint: bool = True
    """Lint the specs against the run's tokenizer in pre-flight."""
