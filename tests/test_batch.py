"""`trainguard batch RUN_DIR --step N`: the global batch behind a step (issue 14, item 5).

One real tiny run on a corpus of clean prose with planted junk documents (repeated lines, an
HTML payload): a NaN injected at the sixth step (0-based step 5, the fault spec's `nan@6` while
`trainguard run` logs completed steps) is rolled back, so step 5 has two batches and every
later step reads a batch other than the sampler's plain step N. Steps count from 0 as the run
record reader gives them (`metrics.record_read`).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from runhelpers import invoke_cli, tiny_recipe_dict
from trainguard.cli import app
from trainguard.data.order import batch_hash
from trainguard.data.sampler import ElasticSampler
from trainguard.metrics.jsonl import read_metrics
from trainguard.metrics.record_read import read_record
from trainguard.report.batch import decode_batch

_WORD_TEXT = (
    "river stone garden window morning silver quiet engine harbor letter bridge candle "
    "forest market winter summer valley meadow ladder pocket basket button castle doctor "
    "finger flower hammer island jacket kitchen lemon mirror needle orange pencil rabbit "
    "saddle tunnel wagon yellow anchor blanket carpet dinner feather gravel helmet insect "
    "jungle kettle lantern marble napkin oyster parrot quarry ribbon shadow thunder velvet "
    "walrus zephyr amber breeze cobalt desert ember fossil glacier horizon ivory jasmine "
    "kernel lagoon meteor nectar orchid pebble quiver rustic saffron timber umber vessel "
    "willow tender gentle rapid bright careful eager humble narrow patient simple steady "
    "walks builds carries follows gathers holds keeps lifts moves opens reads shapes turns"
)


# under pytest-xdist the module's tests run on one worker, so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_batch")
WORDS = tuple(_WORD_TEXT.split())
MARKER = "<script>alert('planted')</script>"


def _prose(rng: random.Random, n: int) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    sentences = [" ".join(words[i : i + 9]).capitalize() + "." for i in range(0, n, 9)]
    return " ".join(sentences) + "\n"


def _corpus(folder: Path) -> Path:
    folder.mkdir()
    rng = random.Random(7)
    for i in range(36):
        (folder / f"clean{i:02d}.txt").write_text(_prose(rng, 90))
    for i in range(4):  # junk: the same line over and over (D220), an HTML payload inside
        (folder / f"junk{i}.txt").write_text(f"buy cheap pills now {MARKER}\n" * 25)
    return folder


@pytest.fixture(scope="module")
def batch_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("batch")
    recipe = tiny_recipe_dict(_corpus(base / "corpus"), base / "cache")
    recipe["guards"] = {"actions": {"R101": "rollback"}}
    (base / "r.yaml").write_text(yaml.safe_dump(recipe))
    res = invoke_cli(
        "run", str(base / "r.yaml"), "--run-dir", str(base / "run"), "-q",
        env={"TRAINGUARD_INJECT": "nan@5"},  # steps count from 0
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return base / "run"


def _step_rows(run: Path) -> list[dict]:
    return read_record(run).steps()


def test_every_step_decodes_to_the_batch_it_logged(batch_run: Path) -> None:
    rows = _step_rows(batch_run)
    final = {r["step"]: r for r in rows}  # the last row of a step: what it trained on
    assert sorted(final) == list(range(12))
    for step, row in final.items():
        view = decode_batch(batch_run, step)
        if step == 5:
            continue  # the rolled-back batch: below
        assert view.position == row["position"]
        ids = np.array([s["sample_id"] for s in view.samples])
        assert batch_hash(ids) == row["batch_hash"], step
        assert "D141" not in {f.code for f in view.findings}
    # After the rollback every step reads one block further on than the plain sampler says.
    n = _num_samples(batch_run)
    sampler = ElasticSampler(n, global_batch_size=8, seed=0, rank=0, world_size=1)
    assert final[6]["position"] != sampler.position(6)
    sampler.skip([5])  # step 5's first batch was marked bad
    assert final[6]["position"] == sampler.position(6)


def _num_samples(run: Path) -> int:
    from trainguard.config.load import validate_recipe
    from trainguard.report.batch_prepared import prepared

    recipe = validate_recipe(yaml.safe_load((run / "recipe.yaml").read_text()))
    return prepared(run, recipe).train.num_samples(recipe.data.seq_len)


def test_a_rolled_back_step_shows_the_batch_the_guard_refused(batch_run: Path) -> None:
    view = decode_batch(batch_run, 5)
    assert [a["outcome"] for a in view.attempts] == ["rollback", "apply"]
    refused, retrained = (a["position"] for a in view.attempts)
    assert view.position == refused == 5 * 8  # the NaN came from block 5: step 5's
    assert retrained == 6 * 8  # the step was recomputed on the next block


def test_positions_missing_from_an_old_log_come_from_the_sampler(
    batch_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(batch_run, run)
    (run / "run.json").unlink()  # the previous release's run dir: no run record of its own,
    rows = read_metrics(run)  # its step and finding rows numbered by completed steps
    for r in rows:
        r.pop("position", None)
        r.pop("bad_positions", None)
        if r.get("kind") in ("step", "finding") and isinstance(r.get("step"), int):
            r["step"] += 1
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step, row in {r["step"]: r for r in _step_rows(batch_run)}.items():
        view = decode_batch(run, step)
        assert view.position == row["position"], step  # rollback skips replayed


def test_per_sample_loss_from_the_checkpoint_the_step_started_from(batch_run: Path) -> None:
    rows = {r["step"]: r for r in _step_rows(batch_run)}
    for step, ckpt in ((4, 4), (8, 8), (10, 8)):
        view = decode_batch(batch_run, step)
        assert view.loss_from_step == ckpt
        losses = [s["loss"] for s in view.samples]
        assert all(isinstance(x, float) for x in losses)
        if ckpt == step:  # exactly the state the step started from: the logged loss
            assert np.mean(losses) == pytest.approx(rows[step]["loss"], rel=1e-5)
    early = decode_batch(batch_run, 2)  # no checkpoint of at most 2 completed steps
    assert early.loss_from_step is None and all(s["loss"] is None for s in early.samples)


def test_filters_flag_exactly_the_samples_of_junk_documents(batch_run: Path) -> None:
    flagged = clean = 0
    for step in range(12):
        view = decode_batch(batch_run, step)
        d140 = {f.data["sample"] for f in view.findings if f.code == "D140"}
        for s in view.samples:
            junk = any(d["source"].startswith("junk") for d in s["documents"])
            assert (s["index"] in d140) == junk, (step, s["documents"])
            assert ("D220" in {f["code"] for f in s["flags"]}) == junk
            flagged += junk
            clean += not junk
    assert flagged and clean  # both sides seen


def test_cli_json_and_escaped_html(batch_run: Path, tmp_path: Path) -> None:
    step = next(
        s for s in range(12) if any(MARKER in x["text"] for x in decode_batch(batch_run, s).samples)
    )
    out = tmp_path / "batch.html"
    res = CliRunner().invoke(
        app, ["batch", str(batch_run), "--step", str(step), "--json", "--html", str(out)]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {"ok", "findings", "step", "samples"} <= set(doc) and doc["step"] == step
    assert len(doc["samples"]) == 8 and "D140" in {f["code"] for f in doc["findings"]}
    page = out.read_text()
    assert "&lt;script&gt;alert(" in page and "<script>alert(" not in page
    inside = CliRunner().invoke(
        app, ["batch", str(batch_run), "--step", "2", "--html", str(batch_run / "b.html")]
    )
    assert inside.exit_code == 2 and "inside the input folder" in inside.output


def test_report_links_guard_findings_to_their_batch(batch_run: Path, tmp_path: Path) -> None:
    from trainguard.report.build import write_report

    run = tmp_path / "run"
    shutil.copytree(batch_run, run)
    html, md = write_report(run)
    page, markdown = html.read_text(), md.read_text()
    assert f"trainguard batch {run} --step 5" in page  # the R101 of the injected NaN
    assert f"trainguard batch {run} --step 5" in markdown
    r101 = [line for line in page.splitlines() if "<td>R101</td>" in line]
    assert r101 and all("--step 5" in line for line in r101)
    assert not any("--step" in line for line in page.splitlines() if "<td>C150</td>" in line)
