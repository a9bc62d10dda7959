"""Eval specs: YAML files that declare tasks over JSONL data (paths relative to the spec).

    name: my_evals
    use_case: true            # this spec measures what the model is for
    bos: "<|endoftext|>"      # document-start token prefixed to every sequence (null: none)
    tasks:
      - name: capitals
        type: multiple_choice # JSONL rows {"context": str, "choices": [str], "gold": int}
        data: capitals.jsonl
      - name: arithmetic
        type: generation      # rows {"prompt": str, "answer": str}
        data: arith.jsonl
        match: exact          # exact | regex | contains
        max_new_tokens: 8
        stop: ["\\n"]
      - name: heldout
        type: perplexity      # rows {"text": str}
        data: texts.jsonl
      - name: python_next_line
        type: multiple_choice
        builtin: python_next_line   # generated from the recipe's validation split

A shipped spec is named by its file stem in `trainguard/recipes/evals/`.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, model_validator

from trainguard.config.evals import EvalsConfig
from trainguard.errors import BadInputError
from trainguard.util.inputs import read_text, require_file
from trainguard.util.strict import StrictModel, int_arg


class EvalSpecError(BadInputError):
    """An eval spec or its data is missing or malformed."""


class _Model(StrictModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class TaskSpec(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Task name; metrics are logged as `<name>/<metric>`."""
    type: Literal["multiple_choice", "generation", "perplexity"]
    """multiple_choice: log-likelihood of each choice; generation: greedy decoding matched
    against the answer; perplexity: bits per byte of held-out texts."""
    data: str | None = None
    """JSONL file, relative to the spec file, inside its folder (`..`, absolute paths and
    links out of the folder are refused)."""
    builtin: str | None = None
    """Name of a generated task instead of `data` (see `trainguard.evals.builtin`)."""
    match: Literal["exact", "regex", "contains"] = "exact"
    """generation: how the output is compared with `answer` (after stripping whitespace)."""
    max_new_tokens: int = Field(32, ge=1, le=1024)
    """generation: tokens decoded at most."""
    stop: list[str] = Field(default_factory=lambda: ["\n"])
    """generation: decoding stops at the first of these strings."""
    options: dict[str, Any] = Field(default_factory=dict)
    """builtin: its parameters (e.g. n_examples, n_choices, seed)."""

    @model_validator(mode="after")
    def _one_source(self) -> TaskSpec:
        if (self.data is None) == (self.builtin is None):
            raise ValueError(f"task {self.name!r} needs exactly one of `data` or `builtin`")
        return self


class EvalSpec(_Model):
    name: str
    """Spec name."""
    description: str = ""
    """What it measures."""
    use_case: bool = False
    """True when this spec measures the task the model is trained for (evaluation first)."""
    bos: str | None = "<|endoftext|>"
    """Document-start token prefixed to every scored sequence; trainguard trains with
    documents separated by `<|endoftext|>`, so that is what a document start looks like."""
    tasks: list[TaskSpec] = Field(min_length=1)
    """The tasks."""
    path: str | None = Field(None, exclude=True)
    """Where the spec was read from (set by the loader)."""


def shipped_specs() -> list[str]:
    folder = resources.files("trainguard") / "recipes" / "evals"
    if not folder.is_dir():
        return []
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _spec_path(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        fix = f"give a spec file or one of the shipped specs {shipped_specs()}"
        return require_file(p, "eval spec", fix, EvalSpecError)
    res = resources.files("trainguard") / "recipes" / "evals" / f"{name_or_path}.yaml"
    if not res.is_file():
        raise EvalSpecError(
            f"unknown eval spec {name_or_path!r}",
            f"use a spec file path or one of the shipped specs {shipped_specs()}",
        )
    return Path(str(res))


def load_spec(name_or_path: str | Path | EvalSpec) -> EvalSpec:
    """A validated spec by shipped name or path; EvalSpec objects pass through."""
    if isinstance(name_or_path, EvalSpec):
        return name_or_path
    path = _spec_path(name_or_path)
    text = read_text(path, "eval spec", "give a YAML eval spec", EvalSpecError)
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise EvalSpecError(f"eval spec {path} is not valid YAML: {e}", "fix the YAML") from e
    if not isinstance(raw, dict):
        raise EvalSpecError(f"eval spec {path} must be a mapping", "see trainguard.evals.spec")
    try:
        spec = EvalSpec.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc'])) or '(spec)'}: {err['msg']}" for err in e.errors()
        )
        raise EvalSpecError(
            f"invalid eval spec {path}: {problems}",
            "fields: name, description, use_case, bos, tasks[name, type, data|builtin, match, "
            "max_new_tokens, stop, options]",
        ) from None
    spec.path = str(path.resolve())
    return spec


_REQUIRED = {
    "multiple_choice": {"context": str, "choices": list, "gold": int},
    "generation": {"prompt": str, "answer": str},
    "perplexity": {"text": str},
}


def task_data_path(spec: EvalSpec, task: TaskSpec) -> Path:
    """Where the task's `data` is: resolved under the spec's folder, which it must not leave.

    A spec file is often someone else's: `data: ../x.jsonl`, an absolute path or a link out of
    the folder would let it read (and `data contamination` quote) any file the user can read,
    so each is refused (EvalSpecError, exit 2) before anything is opened. An `EvalSpec` built
    in code (no `path`) is the caller's own: its data is resolved from the current folder and
    may be anywhere.
    """
    assert task.data is not None
    if not spec.path:
        return (Path.cwd() / task.data).resolve()
    root = Path(spec.path).parent.resolve()
    path = (root / task.data).resolve()  # links followed: a link out of the folder is caught
    if Path(task.data).is_absolute() or not path.is_relative_to(root):
        raise EvalSpecError(
            f"eval spec {spec.path or spec.name}, task {task.name!r}: data {task.data!r} is "
            f"outside the spec's folder {root}",
            "put the data file in the spec's folder (or a folder below it) and give its path "
            "relative to the spec",
        )
    return path


def read_task_data(spec: EvalSpec, task: TaskSpec) -> list[dict[str, Any]]:
    """The task's JSONL rows, checked for the fields its type needs."""
    path = task_data_path(spec, task)
    text = read_text(
        path,
        f"task {task.name!r}: data file",
        "give `data` relative to the spec file",
        EvalSpecError,
    )
    rows = []
    for i, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise EvalSpecError(
                f"{path} line {i} is not JSON: {e}", "one JSON object per line"
            ) from None
        need = _REQUIRED[task.type]
        shape = json.dumps({k: t.__name__ for k, t in need.items()})
        for key, typ in need.items():
            value = row.get(key) if isinstance(row, dict) else None
            # bool is an int to Python, not a choice index to anyone
            if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
                raise EvalSpecError(
                    f"{path} line {i}: {task.type} rows need {key!r} of type {typ.__name__}",
                    f"rows look like {shape}",
                )
        problem = choices_error(task, row)
        if problem:
            raise EvalSpecError(f"{path} line {i}: {problem}", f"rows look like {shape}")
        rows.append(row)
    if not rows:
        raise EvalSpecError(f"{path} holds no examples", "add at least one JSONL row")
    return rows


def choices_error(task: TaskSpec, row: dict[str, Any]) -> str | None:
    """Why a multiple-choice row's `choices` cannot be scored (not a non-empty list of
    strings), else None: a row the scorer would crash on is bad input, not a finding."""
    if task.type != "multiple_choice":
        return None
    choices = row["choices"]
    if not choices:
        return "`choices` is empty: there is nothing to choose from"
    bad = [c for c in choices if not isinstance(c, str)]
    if bad:
        return f"`choices` must all be strings, got {bad[0]!r} ({type(bad[0]).__name__})"
    return None


def gold_error(task: TaskSpec, row: dict[str, Any]) -> str | None:
    """Why a multiple-choice row's `gold` names no choice (E117), else None. Python would
    read -1 as the last choice; the gold index counts from 0, so -1 is out of range."""
    if task.type != "multiple_choice":
        return None
    gold, n = row["gold"], len(row["choices"])
    return None if 0 <= gold < n else f"gold={gold} with {n} choices"


def answer_error(task: TaskSpec, row: dict[str, Any]) -> str | None:
    """Why a generation row's answer cannot be matched (an invalid regex), else None."""
    if task.type != "generation" or task.match != "regex":
        return None
    try:
        re.compile(row["answer"])
    except re.error as e:
        return f"answer {row['answer']!r} is not a valid regular expression ({e})"
    return None


def check_examples(spec: EvalSpec) -> None:
    """EvalSpecError for the first example that cannot be scored: a regex answer that does not
    compile (E118), a gold index out of range (E117; `eval lint` reports both as findings).
    Checked before any scoring, so bad input fails the command at once rather than after the
    other tasks ran, and never scores a row whose right answer is no choice."""
    fixes = {
        "E117": "set `gold` to the 0-based index of the right choice (0 to the number of "
        "choices - 1)",
        "E118": "fix the pattern (escape literal characters with \\), or use `match: exact` "
        "or `match: contains` for literal answers",
    }
    for task in spec.tasks:
        if task.data is None or task.type == "perplexity":
            continue
        if task.type == "generation" and task.match != "regex":
            continue
        for i, row in enumerate(read_task_data(spec, task)):
            for code, problem in (
                ("E117", gold_error(task, row)),
                ("E118", answer_error(task, row)),
            ):
                if problem:
                    raise EvalSpecError(
                        f"{code}: eval spec {spec.path or spec.name}, task {task.name!r} "
                        f"example {i}: {problem}",
                        fixes[code],
                    )


def task_rows(
    spec: EvalSpec, task: TaskSpec, data: Any | None = None, max_examples: int | None = None
) -> list[dict[str, Any]]:
    """The task's examples: its JSONL rows, or the builtin's generated rows; the first
    `max_examples` of them (at least 1; None: all)."""
    from trainguard.evals.builtin import builtin_rows

    if max_examples is not None:
        # A negative slice would drop examples from the end, 0 would score none and report
        # an accuracy of 0.0: both are refused.
        int_arg("max_examples", max_examples, low=1, fix="pass max_examples >= 1, or None for all")

    if task.builtin is not None:
        rows = builtin_rows(task.builtin, data, task.options)
    else:
        rows = read_task_data(spec, task)
    return rows if max_examples is None else rows[:max_examples]


def example_text(task: TaskSpec, row: dict[str, Any]) -> str:
    """What an example puts in front of the model when it is right: the context followed by the
    gold choice, the prompt followed by the answer, or the text."""
    if task.type == "multiple_choice":
        gold = row["gold"]
        choices = row["choices"]
        return row["context"] + (choices[gold] if 0 <= gold < len(choices) else "")
    if task.type == "generation":
        return row["prompt"] + row["answer"]
    return row["text"]


def spec_fingerprint(specs: list[str]) -> list[dict[str, Any]]:
    """What the recipe's eval specs are made of, as checksums: each spec file and each task's
    data file (a builtin task's rows come from the recipe's data, fingerprinted elsewhere).
    Cached pre-flight results (`checks/preflight_cache.py`) are keyed by it. Raises
    EvalSpecError as `load_spec` and `read_task_data` do."""
    from trainguard.util.hashing import file_checksum

    out = []
    for name in specs:
        spec = load_spec(name)
        files = [spec.path] + [str(task_data_path(spec, t)) for t in spec.tasks if t.data]
        try:
            out.append({"spec": name, "files": {f: file_checksum(f) for f in files if f}})
        except OSError as e:
            raise EvalSpecError(
                f"eval spec {spec.path}: cannot read {e.filename}", "check the spec's data paths"
            ) from None
    return out


def require_use_case_eval(evals_cfg: EvalsConfig | None) -> None:
    """Evaluation first: refuse a recipe whose evals include no use-case eval (E101).

    Raises `BadInputError` (exit 2); `trainguard run --no-evals` skips this on purpose.
    """
    fix = (
        "add a use-case eval to the recipe, e.g. `evals: {specs: [python_next_line]}` or a spec "
        "file with `use_case: true`, or pass --no-evals to train without one on purpose"
    )
    if evals_cfg is None or not evals_cfg.specs:
        raise BadInputError("E101: the recipe declares no evals (evaluation first)", fix)
    if not any(load_spec(s).use_case for s in evals_cfg.specs):
        raise BadInputError(
            f"E101: none of the recipe's eval specs {evals_cfg.specs} is a use-case eval "
            "(`use_case: true`)",
            fix,
        )
