"""`trainguard drill`: every drill is a real run (or a real pre-flight check) with one fault,
run once per module on the tiny corpus; each row is asserted on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runhelpers import run_cli
from trainguard.drills.matrix import DrillRow, verdict
from trainguard.drills.multiproc_scenarios import MULTIPROC_DRILLS
from trainguard.drills.scenarios import DRILLS

# under pytest-xdist the module's tests run on one worker, so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_drill")

# Checkpoints every 6 steps; faults land at step 23 (0-based: the 24th step, after which
# checkpoint 24 is saved; spike history: 23 steps).
STEPS = 36
INTERVAL, FAULT = STEPS // 6, 4 * (STEPS // 6) - 1
# The multi-process drills have their own module (tests/test_drill_multiproc.py).
SINGLE_PROCESS = [n for n in DRILLS if n not in MULTIPROC_DRILLS and n != "clean"]


def tiny_sets(corpus: Path, cache: Path) -> list[str]:
    sets = [
        f"data.source={corpus}",
        f"data.cache_dir={cache}",
        "tokenizer.vocab_size=512",
        "data.seq_len=32",
    ]
    return [a for s in sets for a in ("--set", s)]


SINGLE_PROCESS = (
    "nan",
    "spike",
    "kill_step",
    "kill_checkpoint",
    "corrupt_checkpoint",
    "hang",
    "bitflip",
    "bitflip_exponent",
    "shuffle",
    "precision",
)
# The default test run drills one fault of each kind (guard, relaunch, silent corruption and
# its loud form, pre-flight); the full single-process set runs with `-m slow`.
FAST = ("nan", "kill_checkpoint", "bitflip", "bitflip_exponent", "shuffle", "precision")


def run_drills(names: tuple[str, ...], corpus: Path, cache: Path, workdir: Path) -> dict:
    only = [a for n in names for a in ("--only", n)]
    res = run_cli(
        "drill",
        "--json",
        "--workdir",
        str(workdir),
        "--steps",
        str(STEPS),
        "--jobs",
        "2",
        *only,
        *tiny_sets(corpus, cache),
        timeout=900,
    )
    payload = json.loads(res.stdout)
    payload["returncode"] = res.returncode
    payload["stderr"] = res.stderr
    return payload


@pytest.fixture(scope="module")
def drill_result(small_corpus: Path, cache_dir: Path, tmp_path_factory) -> dict:
    return run_drills(FAST, small_corpus, cache_dir, tmp_path_factory.mktemp("drills"))


@pytest.fixture(scope="module")
def full_drill_result(small_corpus: Path, cache_dir: Path, tmp_path_factory) -> dict:
    return run_drills(SINGLE_PROCESS, small_corpus, cache_dir, tmp_path_factory.mktemp("all"))


def row(result: dict, name: str) -> dict:
    return next(r for r in result["rows"] if r["name"] == name)


def test_fast_drills_detected_and_recovered_clean_quiet(drill_result: dict) -> None:
    assert [r["name"] for r in drill_result["rows"]] == ["clean", *FAST]
    bad = [(r["name"], r["note"]) for r in drill_result["rows"] if not r["ok"]]
    assert not bad, bad
    assert drill_result["ok"] and drill_result["findings"] == []
    assert drill_result["returncode"] == 0, drill_result["stderr"][-2000:]


@pytest.mark.slow
def test_every_fault_detected_and_recovered_clean_quiet(full_drill_result: dict) -> None:
    names = [r["name"] for r in full_drill_result["rows"]]
    assert names[0] == "clean" and set(names) >= set(SINGLE_PROCESS)
    bad = [(r["name"], r["note"]) for r in full_drill_result["rows"] if not r["ok"]]
    assert not bad, bad
    assert full_drill_result["ok"] and full_drill_result["findings"] == []
    assert full_drill_result["returncode"] == 0, full_drill_result["stderr"][-2000:]


def test_clean_run_raises_no_alarm(drill_result: dict) -> None:
    r = row(drill_result, "clean")
    assert r["alarms"] == [] and r["finished"] and r["steps_lost"] == 0
    assert r["final_loss"] is not None and r["loss_ratio"] == 1.0


def test_bad_batch_is_caught_before_the_update_and_skipped(drill_result: dict) -> None:
    r = row(drill_result, "nan")
    assert r["detected"][0] == "R101"
    assert r["steps_to_detect"] == 0  # the same step: the update was never applied
    assert "skipped 1 update" in r["action"] and "rerun: data/software" in r["action"]
    assert r["steps_lost"] == 1 and r["recovered"]


@pytest.mark.slow
def test_spike_batch_is_caught_before_the_update_and_skipped(full_drill_result: dict) -> None:
    r, code = row(full_drill_result, "spike"), "R102"
    assert r["detected"][0] == code
    assert r["steps_to_detect"] == 0  # the same step: the update was never applied
    assert "skipped 1 update" in r["action"] and "rerun: data/software" in r["action"]
    assert r["steps_lost"] == 1 and r["recovered"]


def test_kill_mid_checkpoint_relaunch_resumes_bitwise(drill_result: dict) -> None:
    r = row(drill_result, "kill_checkpoint")
    assert r["detected_ok"] and r["recovered"], r["note"]
    assert r["steps_lost"] == INTERVAL  # checkpoint F+1 never committed: back to F+1-6
    # Auto-resume is deterministic: the relaunched run ends on the clean run's exact loss.
    assert r["final_loss"] == row(drill_result, "clean")["final_loss"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,lost",
    [
        ("kill_step", INTERVAL // 2 - 1),  # killed in step FAULT+3's backward: 2 steps redone
        ("kill_checkpoint", INTERVAL),  # checkpoint F+1 never committed: back to F+1-6
        ("corrupt_checkpoint", INTERVAL),  # checkpoint F+1 corrupt: back to F+1-6
        ("hang", INTERVAL // 2 - 1),
    ],
)
def test_crash_relaunch_resumes_bitwise(full_drill_result: dict, name: str, lost: int) -> None:
    r = row(full_drill_result, name)
    assert r["detected_ok"] and r["recovered"], r["note"]
    assert r["steps_lost"] == lost
    assert r["final_loss"] == row(full_drill_result, "clean")["final_loss"]


@pytest.mark.slow
def test_corrupt_checkpoint_is_named_and_skipped(full_drill_result: dict) -> None:
    r = row(full_drill_result, "corrupt_checkpoint")
    assert "C101" in r["detected"]
    assert f"auto-resume from step {FAULT + 1 - INTERVAL}" in r["action"]


@pytest.mark.slow
def test_hang_is_dumped_with_its_phase_and_exits_3(full_drill_result: dict) -> None:
    r = row(full_drill_result, "hang")
    assert r["detected"][0] == "R210"
    assert "exit 3 (forward" in r["action"]


def test_exponent_bitflip_is_classified_as_hardware(drill_result: dict) -> None:
    r = row(drill_result, "bitflip_exponent")
    assert r["inject"] == f"bitflip@{FAULT}:exponent"
    assert "R205" in r["detected"] and "rerun: hardware" in r["action"]
    assert r["steps_to_detect"] == 0 and r["recovered"]


def test_mantissa_bitflip_is_the_documented_blind_spot_of_one_process(drill_result: dict) -> None:
    """A low mantissa bit flipped for one step: nothing in one process sees it (no NaN, no
    spike, so no rerun; no replica), and it did change the model. The row says so."""
    r = row(drill_result, "bitflip")
    assert r["inject"] == f"bitflip@{FAULT}"
    assert r["detected"] == [] and r["finished"]
    assert r["landed"] is True  # the final weights differ bitwise from the clean run's
    assert r["weights"] != row(drill_result, "clean")["weights"]
    assert r["ok"] and not r["recovered"]
    cells = r["columns"]
    assert cells["detected"] == "none: one process cannot see it"
    assert cells["recovered"].startswith("no: the final weights differ bitwise")
    assert "rerun check (R205, run only after a NaN or spike)" in cells["action taken"]
    assert "H201 needs 2+" in cells["action taken"]


def test_preflight_drills(drill_result: dict) -> None:
    shuffle, precision = row(drill_result, "shuffle"), row(drill_result, "precision")
    assert "D301" in shuffle["detected"] and shuffle["finished"]
    assert precision["detected"][0] == "N101" and precision["finished"]


@pytest.mark.slow
def test_guards_off_fails_the_drill(small_corpus: Path, cache_dir: Path, tmp_path: Path) -> None:
    """With the guards disabled the NaN batch goes through: the drill must say so (exit 1)."""
    res = run_cli(
        "drill",
        "--json",
        "--only",
        "nan",
        "--workdir",
        str(tmp_path),
        "--steps",
        "30",
        *tiny_sets(small_corpus, cache_dir),
        "--set",
        "guards.enabled=false",
        timeout=600,
    )
    payload = json.loads(res.stdout)
    assert res.returncode == 1 and not payload["ok"]
    codes = sorted(f["code"] for f in payload["findings"])
    assert codes == ["R401", "R402"], payload["findings"]
    assert row(payload, "clean")["ok"]  # the clean run itself is fine with guards off


def test_verdict_codes() -> None:
    quiet = DrillRow("clean", "none", [], finished=True, final_loss=2.0, loss_ratio=1.0)
    noisy = DrillRow(
        "clean", "none", [], finished=True, final_loss=2, loss_ratio=1, alarms=["R103"]
    )
    missed = DrillRow("nan", "NaN", ["R101"], finished=True, final_loss=2.0, loss_ratio=1.0)
    far = DrillRow("nan", "NaN", ["R101"], ["R101"], finished=True, final_loss=3, loss_ratio=1.5)
    caught = DrillRow("nan", "NaN", ["R101"], ["R101"], finished=True, final_loss=2, loss_ratio=1)
    assert verdict([quiet, caught]) == []
    assert [f.code for f in verdict([noisy])] == ["R403"]
    assert [f.code for f in verdict([missed])] == ["R401"]
    assert [f.code for f in verdict([far])] == ["R402"]
    # A quiet row (clean reruns against a reference) passes like the clean run, by silence.
    rerun = DrillRow("reference_rerun", "reruns", [], finished=True, quiet=True, trains=False)
    assert verdict([rerun]) == []
    rerun.alarms = ["R502"]
    (noisy_rerun,) = verdict([rerun])
    assert noisy_rerun.code == "R403" and "reference_rerun" in noisy_rerun.message
    blind = {"blind": "why", "finished": True, "final_loss": 2.0, "loss_ratio": 1.0}
    landed = DrillRow("bitflip", "flip", [], landed=True, **blind)
    missed_nothing = DrillRow("bitflip", "flip", [], landed=False, **blind)
    seen = DrillRow("bitflip", "flip", [], ["R205"], landed=True, **blind)
    assert verdict([landed]) == [] and landed.ok and not landed.recovered
    assert [f.code for f in verdict([missed_nothing])] == ["R619"]
    assert [f.code for f in verdict([seen])] == ["R619"]
    assert "not blind any more" in verdict([seen])[0].message


@pytest.mark.slow
def test_reference_drills_catch_planted_changes_and_stay_quiet_on_reruns(
    small_corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """A clean tiny run recorded as the reference; reruns quiet (bitwise; 2 threads in the
    band), each planted change caught by its code."""
    from trainguard.drills.reference_scenarios import REFERENCE_DRILLS

    result = run_drills(tuple(REFERENCE_DRILLS), small_corpus, cache_dir, tmp_path)
    bad = [(r["name"], r["detected"], r["note"]) for r in result["rows"] if not r["ok"]]
    assert not bad, bad
    assert row(result, "reference_attention")["detected"][0] == "R502"
    assert row(result, "reference_init")["detected"][0] == "R502"
    assert row(result, "reference_tokenizer")["detected"] == ["R503"]
    assert "R501" in row(result, "reference_schedule")["detected"]
    assert "bitwise equal" in row(result, "reference_rerun")["action"]
    assert result["returncode"] == 0, result["stderr"][-2000:]


def test_unknown_drill_is_bad_input(tmp_path: Path) -> None:
    res = run_cli("drill", "--only", "nosuch", "--workdir", str(tmp_path))
    assert res.returncode == 2
    assert "nosuch" in res.stderr


@pytest.mark.slow
def test_default_recipe_drill_matrix(tmp_path: Path) -> None:
    """The full matrix on the default recipe (stdlib data) at drill settings, and docs/drills.md's
    copy of it (host names and timings normalised; the fast part is in tests/test_docs.py)."""
    from trainguard.drills.readme import normalise, table_in

    matrix = tmp_path / "matrix.md"
    res = run_cli(
        "drill", "--json", "--jobs", "2", "--oversubscribe", "--workdir", str(tmp_path / "runs"),
        "--markdown", str(matrix), timeout=3600,
    )  # fmt: skip
    payload = json.loads(res.stdout)
    assert res.returncode == 0, [(r["name"], r["note"]) for r in payload["rows"] if not r["ok"]]
    page = (Path(__file__).resolve().parent.parent / "docs" / "drills.md").read_text()
    assert normalise(table_in(page)) == normalise(matrix.read_text()), (
        "docs/drills.md's matrix is stale: run `python -m trainguard.drills.readme docs/drills.md`"
    )
