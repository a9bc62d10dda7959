"""Shared fixtures: a small real corpus (a slice of the standard library), a tiny recipe,
and a shared prepared-data cache so that expensive preparation happens once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# A fixed slice of real Python source: deterministic, small enough for a quick tokenizer.
CORPUS_MODULES = ("json", "email", "html", "http", "urllib", "logging", "xml/dom")


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    for module in CORPUS_MODULES:
        for path in sorted((STDLIB / module).glob("*.py")):
            rel = path.relative_to(STDLIB)
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out / rel)
    return out


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def tiny_recipe_dict(corpus: Path, cache: Path) -> dict:
    return {
        "name": "tiny",
        "data": {"source": str(corpus), "seq_len": 32, "val_fraction": 0.1, "cache_dir": str(cache)},
        "tokenizer": {"vocab_size": 512},
        "model": {"n_layers": 2, "d_model": 64, "n_heads": 2},
        "train": {
            "max_steps": 12,
            "batch_size": 8,
            "lr": 3e-3,
            "warmup_steps": 2,
            "eval_interval": 6,
            "eval_batches": 2,
            "threads": 1,
        },
        "checkpoint": {"interval": 4, "keep": 3},
        "preflight": {"enabled": False},
    }


@pytest.fixture
def tiny_recipe(tmp_path: Path, small_corpus: Path, cache_dir: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe_dict(small_corpus, cache_dir)))
    return path


def run_cli(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run `python -m trainguard ARGS` in a fresh process, as a user would."""
    full_env = {**os.environ, "CI": "1", **(env or {})}
    full_env.pop("TRAINGUARD_INJECT", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "trainguard", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
