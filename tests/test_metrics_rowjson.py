"""The one bounded reader of JSON Lines metric logs (issue 26): damaged or hostile rows never
become a traceback in any reader (`read_metrics`, `watch`'s `jsonl_rows`, a resume's
`truncate_after`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainguard.errors import DataError
from trainguard.metrics.jsonl import MetricsLog, read_metrics
from trainguard.metrics.logfile import LogState, jsonl_rows, normalise, number
from trainguard.metrics.rowjson import MAX_DEPTH, MAX_LINE_CHARS, RowRejected, iter_rows, parse_row

DEEP = '{"step": 3, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
BIG = '{"kind": "step", "step": 3, "loss": ' + "9" * 400 + ', "batch_hash": "h3"}'
GOOD = [json.dumps({"kind": "step", "step": s, "loss": 3.0, "batch_hash": f"h{s}"}) for s in (1, 2)]


def test_a_400_digit_integer_is_infinite_not_an_overflow() -> None:
    row = parse_row(BIG)
    assert row["loss"] == math.inf
    assert parse_row('{"x": -' + "9" * 400 + "}")["x"] == -math.inf
    assert parse_row('{"x": ' + "9" * 5000 + "}")["x"] == math.inf  # past int's digit limit
    assert parse_row('{"x": ' + "9" * 300 + "}")["x"] == int("9" * 300)  # fits a float: kept
    assert number(10**400) == math.inf  # a parsed int from elsewhere (trainer_state.json)


@pytest.mark.parametrize(
    "line,why",
    [
        pytest.param(DEEP, "nest deeper", id="100000-deep"),
        pytest.param(
            '{"x": ' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}",
            "nest deeper",
            id="just-past-the-limit",
        ),
        pytest.param('{"x": "' + "a" * MAX_LINE_CHARS + '"}', "longer than", id="too-long"),
        pytest.param("[1, 2]", "not a JSON object", id="a-list"),
        pytest.param('{"step": 1', "not valid JSON", id="cut"),
    ],
)
def test_unusable_lines_are_rejected_with_the_reason(line: str, why: str) -> None:
    with pytest.raises(RowRejected, match=why):
        parse_row(line)


def test_brackets_inside_strings_and_shallow_nesting_are_fine() -> None:
    text = "[" * 500
    row = parse_row(json.dumps({"message": text, "data": {"a": [[{"b": [1]}]]}}))
    assert row["message"] == text


def test_iter_rows_names_each_rejected_line_and_tolerates_a_torn_last_line() -> None:
    text = "\n".join([GOOD[0], DEEP, "", "[1]", GOOD[1], '{"step": 9, "lo']) + ""
    got = list(iter_rows(text))
    assert [(n, r is not None) for n, r, _ in got] == [(1, True), (2, False), (4, False), (5, True)]
    assert "nest deeper" in got[1][2] and "not a JSON object" in got[2][2]
    # the same cut line is damage once a newline follows it
    assert [n for n, r, _ in iter_rows(text + "\n") if r is None] == [2, 4, 6]


def test_read_metrics_skips_bad_rows_and_names_them(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("\n".join([GOOD[0], DEEP, BIG, GOOD[1]]) + "\n")
    skipped: list[str] = []
    rows = read_metrics(tmp_path, skipped)
    assert [r["step"] for r in rows] == [1, 3, 2] and rows[1]["loss"] == math.inf
    assert len(skipped) == 1 and "metrics.jsonl:2: values nest deeper" in skipped[0]


def test_truncate_after_survives_deep_and_hashless_rows(tmp_path: Path) -> None:
    nohash = json.dumps({"kind": "step", "step": 4, "loss": 1.0})
    lines = [GOOD[0], GOOD[1], DEEP, nohash, BIG]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    # A resume from 3 completed steps: the rows of steps 3 on (counted from 0) are dropped.
    dropped = MetricsLog(tmp_path).truncate_after(3)
    assert [r["step"] for r in dropped] == [4, 3]
    kept = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert kept == [*GOOD, DEEP]  # a line no reader can use is still the log's: never dropped


def test_truncate_after_a_checkpoint_drops_the_steps_it_recomputes(tmp_path: Path) -> None:
    """Step and finding rows count steps from 0; evaluations and events the completed steps
    they follow. A resume from checkpoint 3 recomputes step 3: its rows go, the evaluation
    and the checkpoint event of 3 completed steps stay."""
    rows = [
        {"kind": "step", "step": 2, "loss": 1.0},
        {"kind": "eval", "step": 3, "val_loss": 1.0},
        {"kind": "event", "step": 3, "event": "checkpoint"},
        {"kind": "step", "step": 3, "loss": 1.0},
        {"kind": "finding", "step": 3, "code": "R101"},
        {"kind": "eval", "step": 4, "val_loss": 1.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dropped = MetricsLog(tmp_path).truncate_after(3)
    assert dropped == rows[3:]
    assert read_metrics(tmp_path) == rows[:3]


def test_a_checkpoint_finding_of_the_resumed_step_stays(tmp_path: Path) -> None:
    """A checkpoint finding carries the checkpoint's step (completed steps): C101 for a damaged
    step-3 that a resume passed over stays when a later resume starts from a new step-3 (a chaos
    soak lost the evidence of a corrupt checkpoint this way); a detector's finding of step 3
    goes with the step."""
    rows = [
        {"kind": "finding", "step": 3, "code": "C101"},
        {"kind": "step", "step": 3, "loss": 1.0},
        {"kind": "finding", "step": 3, "code": "R101"},
        {"kind": "finding", "step": 4, "code": "C124"},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dropped = MetricsLog(tmp_path).truncate_after(3)
    assert dropped == rows[1:]
    assert read_metrics(tmp_path) == rows[:1]


def test_truncate_after_drops_only_a_torn_last_line(tmp_path: Path) -> None:
    torn = '{"kind": "step", "step": 2, "lo'
    (tmp_path / "metrics.jsonl").write_text(f"{GOOD[0]}\n{torn}")
    assert MetricsLog(tmp_path).truncate_after(5) == []
    assert (tmp_path / "metrics.jsonl").read_text() == f"{GOOD[0]}\n"
    (tmp_path / "metrics.jsonl").write_text(f"{GOOD[0]}\n{GOOD[1]}")  # whole, newline missing
    MetricsLog(tmp_path).truncate_after(5)
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == GOOD


def test_watch_reader_names_the_line_of_a_deep_row(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    with pytest.raises(DataError, match=r"m.jsonl:2: values nest deeper"):
        list(jsonl_rows(path, "\n".join([GOOD[0], DEEP, GOOD[1]]) + "\n"))
    rows = list(jsonl_rows(path, "\n".join([GOOD[0], BIG]) + "\n"))
    step, values = normalise(rows[1], LogState())
    assert step == 3 and values["loss"] == math.inf  # R101 sees a non-finite loss


def test_a_raw_line_separator_inside_a_string_does_not_cut_the_row(tmp_path: Path) -> None:
    line = '{"step": 1, "note": "a\u2028b", "loss": 2.0}'
    assert [r["note"] for r in jsonl_rows(tmp_path / "m.jsonl", line + "\n")] == ["a\u2028b"]
    assert [r["note"] for _, r, _ in iter_rows(line + "\n")] == ["a\u2028b"]


def test_follow_never_buffers_a_line_without_end(tmp_path: Path) -> None:
    from trainguard.metrics.formats import follow_rows

    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n' + "a" * (MAX_LINE_CHARS + 10))
    with pytest.raises(DataError, match=r"m.jsonl:2: the line is longer than"):
        list(follow_rows(path, poll_s=0.01, idle_timeout_s=5))


def test_a_trainer_state_nested_too_deep_is_bad_input(tmp_path: Path) -> None:
    from trainguard.metrics.formats import trainer_state_rows

    path = tmp_path / "trainer_state.json"
    path.write_text('{"log_history": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(DataError, match="too deep"):
        list(trainer_state_rows(path))


def test_a_lone_surrogate_is_rejected_and_a_valid_pair_kept() -> None:
    """json.loads decodes `\\ud800` to a string no UTF-8 file can hold: `report` then raised
    UnicodeEncodeError writing report.md (found in review)."""
    for line in ('{"message": "\\ud800"}', '{"\\udfff": 1}', '{"x": [{"y": "a\\uDBFFb"}]}'):
        with pytest.raises(RowRejected, match="surrogate"):
            parse_row(line)
    assert parse_row('{"message": "\\ud83d\\ude00"}') == {"message": "\U0001f600"}


def test_report_skips_a_row_with_a_lone_surrogate(finished_tiny_run, tmp_path: Path) -> None:
    import shutil

    from runhelpers import invoke_cli

    run = tmp_path / "run"
    shutil.copytree(finished_tiny_run, run)
    with (run / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"kind": "finding", "code": "R101", "severity": "error", "message": "\\ud800"}\n')
    proc = invoke_cli("report", str(run))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "surrogate" in proc.stderr + proc.stdout
    (run / "report.md").read_text(encoding="utf-8")  # written, valid UTF-8
