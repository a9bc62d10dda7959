"""Helpers shared by test modules: the tiny recipe, and running the CLI in a fresh process
(`run_cli`) or in this one (`invoke_cli`)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainguard import Guard


def tiny_recipe_dict(corpus: Path, cache: Path) -> dict:
    return {
        "name": "tiny",
        "data": {
            "source": str(corpus),
            "seq_len": 32,
            "val_fraction": 0.1,
            "cache_dir": str(cache),
        },
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
        # 20 examples of the use-case eval, not 200: each of a run's three eval rounds stays a
        # real one, at a tenth of the cost (1.4 CPU s less per tiny run).
        "evals": {"max_examples": 20},
    }


def run_cli(
    *args: str, env: dict | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
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


@contextlib.contextmanager
def process_state_restored() -> Iterator[None]:
    """A run sets process-wide state (torch threads, determinism, RNG, environment variables):
    whatever the block changes is put back, so that the next test in this worker starts clean."""
    import torch

    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    warn = torch.is_deterministic_algorithms_warn_only_enabled()
    rng = torch.get_rng_state()
    environ = dict(os.environ)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det, warn_only=warn)
        torch.set_rng_state(rng)
        os.environ.clear()
        os.environ.update(environ)


def invoke_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`trainguard ARGS` through the real command-line app in this process: the same parsing,
    checks, exit-status table and messages as `run_cli`, without a new interpreter (importing
    torch and trainguard costs about 2 s of CPU per process). For what does not depend on being
    a process of its own: exit statuses, messages, resume decisions, files written. Signals,
    kills, resource limits and hangs need `run_cli`."""
    from typer.testing import CliRunner

    from trainguard.cli import app

    full_env = {"CI": "1", "TRAINGUARD_INJECT": None, **(env or {})}  # None: unset
    with process_state_restored():
        res = CliRunner().invoke(app, list(args), env=full_env)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"trainguard {' '.join(args)} raised {res.exception!r}") from (
            res.exception
        )
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)


def torchrun_argv(nproc: int) -> list[str]:
    """`torchrun` as a user types it for `nproc` local processes, on the loopback interface
    with a port the launcher picks (port 0): safe under pytest-xdist. Append the script (or
    `-m module`) and its arguments."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:0",
        "--local-addr",
        "127.0.0.1",
    ]


def forge_manifest(step: int, files: dict[str, dict]) -> bytes:
    """A checkpoint manifest with a valid self-checksum, as anyone who can write the folder can
    make one: the self-checksum is integrity, not authenticity (docs/architecture.md)."""
    import json

    from trainguard.util.hashing import bytes_checksum

    body = {
        "format": "trainguard-checkpoint/1",
        "step": step,
        "created": "2024-01-01T00:00:00+00:00",
        "checksum_algo": "xxh3_128",
        "files": files,
        "meta": {},
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({**body, "manifest_checksum": bytes_checksum(text.encode())}).encode()


def judged_on_device(guard: Guard) -> tuple[Guard, list[int]]:
    """The guard, and the steps it will have judged through `step_async` (the adapters' device
    path: tests/test_guard_hf.py and tests/test_guard_lightning.py)."""
    calls: list[int] = []
    step_async = guard.step_async

    def recorded(step, *args, **kwargs):
        calls.append(step)
        return step_async(step, *args, **kwargs)

    guard.step_async = recorded  # type: ignore[method-assign]
    return guard, calls


def tree_snapshot(root: Path) -> dict[str, str]:
    """{relative path: sha256 of the bytes, the target of a symlink, or "dir"} of everything
    under `root`: equal before and after a refused command means it changed nothing there."""
    import hashlib

    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = "-> " + str(path.readlink())
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def random_token_dataset(samples: int, length: int, vocab: int = 64):
    """A map-style torch Dataset of `samples` random token rows (seed 0): `input_ids` and
    `labels` alike, what a tiny language model in a real Trainer trains on."""
    import torch

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            gen = torch.Generator().manual_seed(0)
            self.x = torch.randint(0, vocab, (samples, length), generator=gen)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.x[i], "labels": self.x[i]}

    return Tokens()
