"""Pre-flight results cached in the run dir (checks/preflight_cache.py): a resume re-runs only the
checks whose inputs changed; a damaged or forged cache file is set aside, never trusted; and a
restart imports neither Inductor nor scipy.stats on its way to the first step."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import yaml

from runhelpers import tiny_recipe_dict
from trainguard.checks.preflight_cache import CACHE_FILE, PreflightCache
from trainguard.config.load import validate_recipe
from trainguard.findings import Finding
from trainguard.util.hashing import bytes_checksum, stable_json_hash


class Counted:
    """A check that returns fixed findings and counts how often it really ran."""

    def __init__(self, findings: list[Finding], info: dict | None = None) -> None:
        self.findings = findings
        self.info = info or {}
        self.calls = 0

    def __call__(self) -> tuple[list[Finding], dict]:
        self.calls += 1
        return list(self.findings), dict(self.info)


def _checks() -> dict[str, Counted]:
    return {
        "model": Counted([]),
        "tokenizer": Counted(
            [Finding.of("T101", "12 tokens never seen", data={"ids": [1, 2]})], {"docs": 200}
        ),
        "evals": Counted([Finding("E111", "error", "trailing space", fix="strip it")]),
    }


def _run(run_dir: Path, checks: dict[str, Counted], inputs: dict[str, dict | None]):
    cache = PreflightCache.load(run_dir)
    found, details = cache.run({n: (c, inputs[n]) for n, c in checks.items()})
    cache.save()
    return found, details


INPUTS: dict[str, dict | None] = {
    "model": {"recipe": {"model.d_model": 64}},
    "tokenizer": {"data": "abc"},
    "evals": {"specs": ["x"]},
}


def test_second_run_reads_every_result_back_and_runs_nothing(tmp_path: Path) -> None:
    checks = _checks()
    first, d1 = _run(tmp_path, checks, INPUTS)
    assert [c.calls for c in checks.values()] == [1, 1, 1]
    assert not any(d["cached"] for d in d1.values())
    assert (tmp_path / CACHE_FILE).exists()

    second, d2 = _run(tmp_path, checks, INPUTS)
    assert [c.calls for c in checks.values()] == [1, 1, 1]  # nothing ran again
    assert all(d["cached"] for d in d2.values())
    assert [f.to_dict() for f in second] == [f.to_dict() for f in first]
    assert d2["tokenizer"]["docs"] == 200 and d2["tokenizer"]["findings"] == 1


def test_only_the_check_whose_inputs_changed_runs_again(tmp_path: Path) -> None:
    checks = _checks()
    _run(tmp_path, checks, INPUTS)
    changed = {**INPUTS, "tokenizer": {"data": "abd"}}
    _, details = _run(tmp_path, checks, changed)
    assert {n: c.calls for n, c in checks.items()} == {"model": 1, "tokenizer": 2, "evals": 1}
    assert {n: d["cached"] for n, d in details.items()} == {
        "model": True,
        "tokenizer": False,
        "evals": True,
    }
    _run(tmp_path, checks, changed)  # the new result replaced the old one
    assert checks["tokenizer"].calls == 2


def test_inputs_none_always_run(tmp_path: Path) -> None:
    checks = _checks()
    inputs = {**INPUTS, "evals": None}
    _run(tmp_path, checks, inputs)
    _, details = _run(tmp_path, checks, inputs)
    assert checks["evals"].calls == 2 and details["evals"]["cached"] is False
    assert "evals" not in json.loads((tmp_path / CACHE_FILE).read_text())["entries"]


def _rewrite(path: Path, edit) -> None:
    """Change the cache file's entries and give it a valid checksum, as anyone could."""
    body = json.loads(path.read_text())
    edit(body["entries"])
    canonical = json.dumps(body["entries"], sort_keys=True, separators=(",", ":"), default=str)
    body["checksum"] = bytes_checksum(canonical.encode())
    path.write_text(json.dumps(body))


def test_another_code_version_runs_the_check_again(tmp_path: Path) -> None:
    checks = _checks()
    _run(tmp_path, checks, INPUTS)

    def older_code(entries: dict) -> None:  # the key the same check had under other code
        key = stable_json_hash({"check": "model", "inputs": INPUTS["model"], "code": "older"})
        entries["model"]["key"] = key

    _rewrite(tmp_path / CACHE_FILE, older_code)
    _, details = _run(tmp_path, checks, INPUTS)
    assert checks["model"].calls == 2 and details["model"]["cached"] is False
    assert checks["tokenizer"].calls == 1


@pytest.mark.parametrize(
    "damage",
    ["truncated", "not-json", "a-list", "findings-edited", "bad-severity", "other-version"],
)
def test_a_damaged_cache_is_set_aside_and_every_check_runs(tmp_path: Path, damage: str) -> None:
    checks = _checks()
    _run(tmp_path, checks, INPUTS)
    path = tmp_path / CACHE_FILE
    text = path.read_text()
    if damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "not-json":
        path.write_bytes(b"\xff\xfe garbage")
    elif damage == "a-list":
        path.write_text("[]")
    elif damage == "findings-edited":  # an error finding removed, the checksum left as it was
        body = json.loads(text)
        body["entries"]["evals"]["findings"] = []
        path.write_text(json.dumps(body))
    elif damage == "bad-severity":  # well-formed and checksummed, but not a valid finding
        _rewrite(path, lambda e: e["evals"]["findings"][0].update(severity="fatal"))
    else:
        body = json.loads(text)
        body["version"] = 99
        path.write_text(json.dumps(body))
    damaged = path.read_bytes()

    found, details = _run(tmp_path, checks, INPUTS)
    if damage == "bad-severity":  # the file verifies: only the entry that cannot be read runs
        assert {n: c.calls for n, c in checks.items()} == {"model": 1, "tokenizer": 1, "evals": 2}
    else:
        assert [c.calls for c in checks.values()] == [2, 2, 2]
        kept = list(tmp_path.glob(f"{CACHE_FILE}.damaged-*"))
        assert [p.read_bytes() for p in kept] == [damaged]  # set aside, not deleted
    assert [f.code for f in found] == ["T101", "E111"]
    assert json.loads(path.read_text())["version"] == 1  # a good cache was written again


def _tiny(corpus: Path, cache: Path, spec: Path, max_steps: int):
    raw = tiny_recipe_dict(corpus, cache)
    raw["train"]["max_steps"] = max_steps
    raw["preflight"] = {"enabled": True}
    raw["evals"] = {"specs": [str(spec)], "max_examples": 8}
    return validate_recipe(raw)


def _preflight_event(run_dir: Path) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("event") == "preflight"][-1]["checks"]


def _stable(details: dict) -> dict:
    return {
        n: {k: v for k, v in d.items() if k not in ("seconds", "cached")}
        for n, d in details.items()
    }


def test_a_resume_reruns_only_the_checks_whose_inputs_changed(
    small_corpus: Path, cache_dir: Path, tmp_path: Path, torch_globals
) -> None:
    """A real run with pre-flight: resuming (train.max_steps raised, as a resume may) reads every
    result back, the same as the first run's; an edited eval spec file re-runs the two checks
    that read it (eval lint, contamination) and nothing else."""
    from trainguard.train.guarded_run import run_recipe

    spec = tmp_path / "next_line.yaml"
    shipped = resources.files("trainguard") / "recipes" / "evals" / "python_next_line.yaml"
    spec.write_text(shipped.read_text())
    run_dir = tmp_path / "run"

    run_recipe(_tiny(small_corpus, cache_dir, spec, 4), run_dir, progress=False, report=False)
    first = _preflight_event(run_dir)
    assert set(first) == {"model", "tokenizer", "shuffle", "evals", "contamination"}
    assert not any(d["cached"] for d in first.values())

    result = run_recipe(
        _tiny(small_corpus, cache_dir, spec, 5), run_dir, progress=False, report=False
    )
    assert result.resumed_from == 4
    second = _preflight_event(run_dir)
    assert all(d["cached"] for d in second.values())
    assert _stable(second) == _stable(first)

    raw = yaml.safe_load(spec.read_text())
    raw["tasks"][0]["options"]["seed"] = 1  # other examples: the eval checks must look again
    spec.write_text(yaml.safe_dump(raw))
    run_recipe(_tiny(small_corpus, cache_dir, spec, 6), run_dir, progress=False, report=False)
    third = _preflight_event(run_dir)
    assert {n: d["cached"] for n, d in third.items()} == {
        "model": True,
        "tokenizer": True,
        "shuffle": True,
        "evals": False,
        "contamination": False,
    }


def test_set_determinism_leaves_inductor_unimported_and_deterministic(tmp_path: Path) -> None:
    """The run's determinism switch imports neither Inductor nor dynamo (as long as `import
    torch` itself), and Inductor, imported later, is deterministic all the same."""
    code = """
import sys
from trainguard.config.load import load_recipe
from trainguard.train.guarded_run import set_determinism
import torch
set_determinism(load_recipe("default"))
assert torch.are_deterministic_algorithms_enabled()
assert torch.is_deterministic_algorithms_warn_only_enabled()
assert "torch._inductor" not in sys.modules and "torch._dynamo" not in sys.modules
import torch._inductor.config as inductor_config
assert inductor_config.deterministic is True
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_the_eval_schedule_imports_no_scipy_stats() -> None:
    code = "import sys, trainguard.evals.schedule; print('scipy.stats' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_drift_pvalues_still_computed_with_the_lazy_import() -> None:
    from trainguard.evals.drift import mean_rise_pvalue, proportion_drop_pvalue

    assert proportion_drop_pvalue(150, 200, 100, 200) < 1e-6
    assert proportion_drop_pvalue(2, 10, 1, 10) > 0.05  # Fisher's exact test (small counts)
    assert mean_rise_pvalue(1.0, 0.01, 1.1, 0.01) < 1e-6
