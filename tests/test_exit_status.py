"""One exit table (`errors.ExitStatus`), one handler (`cli.common.exit_statuses`), `--traceback`.

In process (typer's CliRunner): real commands end with 0, 1 and 2; every exception class of
`errors.py` ends a command run by the app's group class with its status; `--traceback` raises
instead of printing the message. One subprocess checks the traceback a developer sees.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import trainguard
from trainguard import errors
from trainguard.cli import app
from trainguard.cli.common import TrainguardGroup
from trainguard.errors import ExitStatus

runner = CliRunner()
SRC = Path(trainguard.__file__).parent


def _log(path: Path, losses: list[float]) -> Path:
    rows = [{"step": i, "loss": v, "grad_norm": 0.5} for i, v in enumerate(losses)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_table():
    assert [int(s) for s in ExitStatus] == [0, 1, 2, 3, 130, 143]
    assert ExitStatus.INTERRUPTED == 128 + signal.SIGINT
    assert ExitStatus.TERMINATED == 128 + signal.SIGTERM
    assert errors.signal_status(signal.SIGTERM) is ExitStatus.TERMINATED
    assert errors.signal_status(signal.SIGKILL) == 137  # not ours, still reported as a shell does


def test_real_commands_end_with_0_1_2(tmp_path):
    clean = _log(tmp_path / "clean.jsonl", [3.0 - 0.01 * i for i in range(40)])
    nan = _log(tmp_path / "nan.jsonl", [3.0] * 20 + [math.nan] + [3.0] * 5)
    ok = runner.invoke(app, ["watch", str(clean), "--json"])
    assert ok.exit_code == ExitStatus.OK, ok.output
    found = runner.invoke(app, ["watch", str(nan), "--json"])
    assert found.exit_code == ExitStatus.FINDINGS, found.output
    assert "R101" in found.output
    missing = runner.invoke(app, ["watch", str(tmp_path / "missing.jsonl")])
    assert missing.exit_code == ExitStatus.BAD_INPUT
    assert "error:" in missing.output and "Traceback" not in missing.output
    usage = runner.invoke(app, ["watch", "--no-such-flag"])  # click's own usage error
    assert usage.exit_code == ExitStatus.BAD_INPUT


def _raising_app(exc: BaseException) -> typer.Typer:
    """An app built like `trainguard.cli.app` (its group class and `--traceback`) whose one
    command raises `exc`, so that every row of the table goes through the real handler."""
    test_app = typer.Typer(cls=TrainguardGroup, add_completion=False)

    @test_app.callback()
    def _options(traceback: bool = typer.Option(False, "--traceback")) -> None:
        pass

    @test_app.command("boom")
    def boom() -> None:
        raise exc

    return test_app


def _error_classes() -> list[type[BaseException]]:
    return [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.TrainguardError) and c.__module__ == errors.__name__
    ]


EXPECTED = {
    "TrainguardError": ExitStatus.BAD_INPUT,
    "BadInputError": ExitStatus.BAD_INPUT,
    "ConfigError": ExitStatus.BAD_INPUT,
    "DataError": ExitStatus.BAD_INPUT,
    "CorruptError": ExitStatus.BAD_INPUT,
    "StorageError": ExitStatus.BAD_INPUT,
    "ResumeMismatchError": ExitStatus.BAD_INPUT,
    "RunDirBusyError": ExitStatus.BAD_INPUT,
    "OutputWriteError": ExitStatus.FINDINGS,
    "NoUsableCheckpoint": ExitStatus.FINDINGS,
    "RunHalted": ExitStatus.FINDINGS,
    "PreflightFailed": ExitStatus.FINDINGS,
    "RunHung": ExitStatus.HANG,
}


def test_every_error_class_has_a_row():
    assert sorted(c.__name__ for c in _error_classes()) == sorted(EXPECTED)
    for cls in _error_classes():
        assert isinstance(cls.exit_status, ExitStatus), cls


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_handler_maps_each_error(name):
    exc = getattr(errors, name)(f"{name} happened", fix="do the other thing")
    result = runner.invoke(_raising_app(exc), ["boom"])
    assert result.exit_code == EXPECTED[name]
    assert f"{name} happened" in result.output and "do the other thing" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    "exc,status",
    [
        (errors.Interrupted(signal.SIGINT), ExitStatus.INTERRUPTED),
        (errors.Interrupted(signal.SIGTERM), ExitStatus.TERMINATED),
        (KeyboardInterrupt(), ExitStatus.INTERRUPTED),
    ],
)
def test_the_handler_maps_interrupts(exc, status):
    result = runner.invoke(_raising_app(exc), ["boom"])
    assert result.exit_code == status
    assert "interrupted" in result.output


def test_a_bug_keeps_its_traceback():
    result = runner.invoke(_raising_app(ZeroDivisionError("a bug")), ["boom"])
    assert isinstance(result.exception, ZeroDivisionError) and result.exit_code == 1


def test_traceback_flag_raises_instead(tmp_path):
    missing = str(tmp_path / "missing.jsonl")
    plain = runner.invoke(app, ["watch", missing])
    assert plain.exit_code == ExitStatus.BAD_INPUT and plain.exception is not None
    assert isinstance(plain.exception, SystemExit)
    raised = runner.invoke(app, ["--traceback", "watch", missing])
    assert isinstance(raised.exception, errors.BadInputError), raised.output
    assert raised.exit_code == 1
    # What a developer sees on the terminal: the traceback, not the one-line message.
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard", "--traceback", "watch", missing],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert "trainguard.errors" in proc.stderr and missing in proc.stderr


def _bare_statuses(path: Path) -> list[str]:
    """Exit calls and `exit_status=` given an int literal instead of an `ExitStatus`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        args = list(node.args) if name in ("Exit", "_exit", "exit", "SystemExit") else []
        args += [k.value for k in node.keywords if k.arg in ("exit_status", "code")]
        for a in args:
            if isinstance(a, ast.Constant) and isinstance(a.value, int):
                out.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_bare_exit_statuses():
    """Every status in the code is a member of the one table, never a number of its own."""
    bare = [b for p in sorted(SRC.rglob("*.py")) for b in _bare_statuses(p)]
    assert bare == []
