"""Running fire drills: real `trainguard run` subprocesses with a fault plan, and the launcher
that relaunches them after a crash or a hang, as a cluster scheduler would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import BadInputError
from trainguard.faults import ENV_VAR
from trainguard.metrics.jsonl import read_metrics
from trainguard.util.processes import child_env

# The default recipe at drill size: a run takes seconds, yet is long enough for the spike
# detector (20 steps of history) to act. lr 1e-3 with a 20-step warm-up, because at the
# recipe's 3e-3 this small model has real gradient-norm spikes around step 20-35 that the
# guard rightly skips; the clean run must be quiet, and we do not loosen the detector for it.
# (With the default recipe's Muon, lr is AdamW's share: embeddings, norms, biases; the hidden
# matrices keep the recipe's muon_lr, and the clean drill run stays quiet with it.)
# Pre-flight is off: the drills test the in-run guards (pre-flight has its own commands and
# reports tokenizer warnings on the stdlib corpus that are not faults of the run).
DRILL_SETTINGS: tuple[str, ...] = (
    "model.n_layers=2",
    "model.d_model=64",
    "model.n_heads=2",
    "data.seq_len=64",
    "train.batch_size=8",
    "train.lr=1e-3",
    "train.warmup_steps=20",
    "train.eval_batches=8",
    "train.threads=1",
    "preflight.enabled=false",
    # Spikes are scored from step 20 on: a drill run is 60 steps, not the recipe's 300 (whose
    # 100-step detector warm-up would outlast the whole drill). With the gentler lr above the
    # clean run is quiet at this setting.
    "guards.spike_min_history=20",
    # A hang is declared after 5 s without a heartbeat (20 s in the first step and around
    # checkpoints and evaluations), instead of the recipe's 5 minutes: a drill step takes tens
    # of milliseconds, so this is still 100x a step on a loaded machine.
    "guards.hang_floor_s=5",
)


@dataclass
class DrillPlan:
    """Steps of a drill run and where faults land; derived from the number of steps."""

    max_steps: int = 60

    def __post_init__(self) -> None:
        if self.max_steps < 30:
            raise BadInputError(
                f"drill runs of {self.max_steps} steps are too short",
                "use --steps 30 or more: the spike detector needs 20 steps of history",
            )

    @property
    def interval(self) -> int:
        """Checkpoint interval: six checkpoints per run."""
        return self.max_steps // 6

    @property
    def fault_step(self) -> int:
        """Where a fault lands (a 0-based step index, as fault specs count): the step after
        which a checkpoint is saved, past the spike detector's warm-up."""
        return 4 * self.interval - 1

    def overrides(self) -> list[str]:
        return [
            f"train.max_steps={self.max_steps}",
            f"checkpoint.interval={self.interval}",
            f"train.eval_interval={self.max_steps}",
        ]


@dataclass
class RunOutcome:
    """One `trainguard run` process: exit status, its JSON summary, its run dir."""

    returncode: int
    payload: dict[str, Any] | None
    run_dir: Path
    stderr: str = ""

    @property
    def findings(self) -> list[dict[str, Any]]:
        return list((self.payload or {}).get("findings", []))

    def codes(self) -> list[str]:
        return [f["code"] for f in self.findings]

    def first_step(self, codes: tuple[str, ...]) -> int | None:
        steps = [f["step"] for f in self.findings if f["code"] in codes and f["step"] is not None]
        return min(steps) if steps else None

    @property
    def final_step(self) -> int | None:
        return (self.payload or {}).get("final_step")

    @property
    def final_loss(self) -> float | None:
        return (self.payload or {}).get("final_val_loss")

    def rows(self, kind: str) -> list[dict[str, Any]]:
        # The one bounded reader: a line cut by a SIGKILL (or damaged) is left out.
        return [r for r in read_metrics(self.run_dir) if r.get("kind") == kind]

    def weights_checksum(self) -> str | None:
        """`weights_checksum` of the run's checkpoints."""
        return weights_checksum(self.run_dir / "checkpoints")

    def last_logged_step(self) -> int:
        """The 0-based index of the last step row (-1: none)."""
        return max((r["step"] for r in self.rows("step")), default=-1)

    def tail(self) -> str:
        return self.stderr.strip()[-400:]


def weights_checksum(root: Path, key: str = "model") -> str | None:
    """A checksum of the weights (`key` in the saved state) in the newest checkpoint under
    `root` (verified first, read through `checkpoint.read.read_module_state`): equal checksums
    mean bitwise equal weights. None when there is none, or it does not verify or read."""
    import torch

    from trainguard.checkpoint.folder import verify_local_folder
    from trainguard.checkpoint.manifest import parse_step_dirname
    from trainguard.checkpoint.read import read_module_state
    from trainguard.errors import TrainguardError
    from trainguard.findings import has_errors
    from trainguard.util.hashing import bytes_checksum

    steps = [
        (step, p)
        for p in (root.iterdir() if root.is_dir() else ())
        if (step := parse_step_dirname(p.name)) is not None
    ]
    if not steps:
        return None
    step, folder = max(steps)
    if has_errors(verify_local_folder(folder, step)):
        return None
    try:
        state = read_module_state(folder, key)
    except TrainguardError:
        return None
    data = b"".join(
        name.encode()
        + b"\0"
        + state[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        for name in sorted(state)
    )
    return bytes_checksum(data)


@dataclass
class DrillContext:
    """What a scenario needs: how to launch a run, where, at which settings."""

    recipe: str = "default"
    overrides: list[str] = field(default_factory=list)
    plan: DrillPlan = field(default_factory=DrillPlan)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tg-drill-")))
    timeout_s: float = 600.0
    run_args: tuple[str, ...] = ("--no-evals",)
    """Extra `trainguard run` flags. Use-case evals are not what the drills test, and they
    would dominate a 60-step run's time."""

    def settings(self) -> list[str]:
        # The user's overrides come last so they win over the drill defaults.
        return [*DRILL_SETTINGS, *self.plan.overrides(), *self.overrides]

    def run_dir(self, name: str) -> Path:
        return self.workdir / name

    def launch(
        self,
        name: str,
        inject: str | None = None,
        extra: tuple[str, ...] = (),
        planted: str | None = None,
    ) -> RunOutcome:
        """One `trainguard run` process in run dir `name` (an existing one resumes); `planted`
        runs it with a subtle software change (`drills/planted.py`, through `cli/_planted.py`)."""
        run_dir = self.run_dir(name)
        # child_env: the run (and the workers of a --nproc run) end with this process.
        env = child_env({k: v for k, v in os.environ.items() if k != ENV_VAR})
        if inject:
            env[ENV_VAR] = inject
        module = ["trainguard.cli._planted", planted] if planted else ["trainguard"]
        args = [sys.executable, "-m", *module, "run", self.recipe, "--run-dir", str(run_dir)]
        args += ["--json", "-q", *self.run_args]
        for s in [*self.settings(), *extra]:
            args += ["--set", s]
        try:
            proc = subprocess.run(
                args, env=env, capture_output=True, text=True, timeout=self.timeout_s
            )
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            return RunOutcome(
                124, None, run_dir, f"timed out after {self.timeout_s:.0f}s\n{stderr}"
            )
        payload = None
        if proc.stdout.strip():
            try:
                payload = json.loads(proc.stdout)
            except ValueError:
                payload = None
        return RunOutcome(proc.returncode, payload, run_dir, proc.stderr)


def cleanup(ctx: DrillContext) -> None:
    shutil.rmtree(ctx.workdir, ignore_errors=True)
