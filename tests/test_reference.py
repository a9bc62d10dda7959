"""Reference curves without training: the noise estimate, the comparison (band, bitwise,
batches, data), its state across a resume, the reference file's validation, and the recipe
hash's operational keys. The comparison in real runs is in test_reference_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainguard.config.identity import OPERATIONAL_KEYS, curve_recipe, recipe_hash
from trainguard.config.load import load_recipe, recipe_to_dict
from trainguard.errors import BadInputError
from trainguard.findings import Finding
from trainguard.guard.detectors.reference import ReferenceMonitor
from trainguard.reference.curve import ReferenceCurve, load_reference
from trainguard.reference.noise import learn_noise

N = 200
SIGMA = 0.05


def curve_losses(seed: int = 0) -> np.ndarray:
    """A training curve: a steep early descent, then a slow one, plus batch noise."""
    t = np.arange(1, N + 1)
    trend = 3.0 + 5.0 * np.exp(-t / 15.0) + 1.0 / np.sqrt(t)
    return trend + np.random.default_rng(seed).normal(0.0, SIGMA, N)


def reference(loss: np.ndarray | None = None) -> ReferenceCurve:
    loss = curve_losses() if loss is None else loss
    return ReferenceCurve(
        recipe_name="synthetic",
        recipe_hash="0" * 16,
        recipe={"train.lr": 0.001},
        env={"python": "3.11.7"},
        steps=list(range(len(loss))),  # steps count from 0
        loss=[float(x) for x in loss],
        batch_hash=[f"batch-{i}" for i in range(len(loss))],
        data_identity={"tokenizer_hash": "t", "splits": {"train": {"n_tokens": 10}}},
    )


def feed(monitor: ReferenceMonitor, loss: np.ndarray, steps=None) -> list[Finding]:
    out: list[Finding] = []
    for step in range(len(loss)) if steps is None else steps:
        out += monitor.update(step, {"loss": float(loss[step]), "batch_hash": f"batch-{step}"})
    return out


def codes(findings: list[Finding]) -> list[str]:
    return [f.code for f in findings]


# -- the noise ----------------------------------------------------------------------------------
def test_noise_is_the_batch_scatter_not_the_trend() -> None:
    estimates = [learn_noise(curve_losses(seed)).sigma for seed in range(5)]
    assert all(0.8 * SIGMA < s < 1.2 * SIGMA for s in estimates), estimates
    # A steep monotone curve with little noise: a running median would call it noise-free,
    # and the step-to-step differences would call the descent noise.
    t = np.arange(1, 21)
    steep = 6.0 - 0.05 * t + np.random.default_rng(1).normal(0.0, 0.01, 20)
    assert 0.005 < learn_noise(steep).sigma < 0.02
    assert learn_noise(np.full(20, 3.0)).sigma == pytest.approx(3e-4)  # the relative floor


# -- the comparison -----------------------------------------------------------------------------
def test_paired_rerun_with_rounding_differences_stays_in_the_band() -> None:
    ref = reference()
    rounding = np.random.default_rng(2).normal(0.0, 1e-6, N)  # another thread count
    monitor = ReferenceMonitor(ref)
    found = feed(monitor, np.asarray(ref.loss) + rounding)
    assert codes(found) == ["R506"]
    assert found[0].step == N - 1 and "within the band" in found[0].message
    assert not found[0].data["bitwise_equal"]


def test_a_sustained_shift_of_one_noise_unit_is_caught_at_its_first_step() -> None:
    ref = reference()
    run = np.asarray(ref.loss).copy()
    run[99:] += SIGMA  # from step 99 on, the loss is one noise unit higher
    monitor = ReferenceMonitor(ref, interval=10)
    found = feed(monitor, run)
    band = [f for f in found if f.code == "R501"]
    assert len(band) == 1, codes(found)
    assert band[0].severity == "error"
    assert 99 <= band[0].data["first_step"] <= 102  # the CUSUM's onset
    # Verdicts after every 10 steps done: steps 9, 19, ...
    assert (band[0].data["verdict_step"] + 1) % 10 == 0 and band[0].data["direction"] == "above"
    assert band[0].data["mean_difference"] == pytest.approx(SIGMA, rel=0.35)
    # The same shift of half the allowance accumulates nothing.
    quiet = np.asarray(ref.loss).copy()
    quiet[99:] += 0.2 * SIGMA
    assert codes(feed(ReferenceMonitor(ref), quiet)) == ["R506"]


def test_bitwise_departure_names_its_step_and_the_drift_next_to_it() -> None:
    ref = reference()
    drift = Finding.of("H101", "software changed since the reference: git_revision a -> b")
    run = np.asarray(ref.loss).copy()
    run[16] = np.nextafter(run[16], np.inf)  # one ulp at step 16
    found = feed(ReferenceMonitor(ref, bitwise=True, drift=[drift]), run)
    assert codes(found) == ["R502", "H101", "R506"]
    assert found[0].step == 16 and found[0].data["first_step"] == 16
    assert found[1].step == 16  # the environment differences, at the departure
    # Without the bitwise expectation one ulp is nothing; with it and no change, all equal.
    assert codes(feed(ReferenceMonitor(ref), run)) == ["R506"]
    clean = feed(ReferenceMonitor(ref, bitwise=True), np.asarray(ref.loss))
    assert codes(clean) == ["R506"] and clean[0].data["bitwise_equal"]


def test_other_batches_stop_the_comparison() -> None:
    ref = reference()
    monitor = ReferenceMonitor(ref, bitwise=True)
    out = []
    for step in range(39):
        batch = f"batch-{step}" if step < 29 else f"other-{step}"
        out += monitor.update(step, {"loss": ref.loss[step] + 1.0, "batch_hash": batch})
    # Step 0 already departs bitwise; at step 29 the batches differ and nothing more is said.
    assert codes(out)[-1] == "R504" and out[-1].step == 29
    assert monitor.update(39, {"loss": 99.0}) == []


def test_other_data_is_not_compared() -> None:
    ref = reference()
    monitor = ReferenceMonitor(ref)
    other = {"tokenizer_hash": "x", "splits": {"train": {"n_tokens": 10}}}
    found = monitor.check_data(other)
    assert codes(found) == ["R503"] and "the tokenizer" in found[0].message
    assert feed(monitor, np.asarray(ref.loss) + 1.0) == []
    assert ReferenceMonitor(ref).check_data(dict(ref.data_identity)) == []


def test_state_resumes_the_comparison_and_replayed_steps_are_ignored() -> None:
    ref = reference()
    run = np.asarray(ref.loss).copy()
    run[99:] += SIGMA
    whole = feed(ReferenceMonitor(ref), run)
    first = ReferenceMonitor(ref)
    part = feed(first, run, range(105))
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    second = ReferenceMonitor(ref)
    second.load_state_dict(state)
    # A rollback or a resume replays steps the checkpoint had already compared.
    rest = feed(second, run, range(100, N))
    assert [(f.code, f.step, f.message) for f in part + rest] == [
        (f.code, f.step, f.message) for f in whole
    ]
    # A state saved against another reference is not applied.
    other = ReferenceMonitor(reference(curve_losses(seed=9)))
    other.load_state_dict(state)
    assert other.last_step == -1  # nothing compared yet


# -- the reference file -------------------------------------------------------------------------
def test_reference_file_round_trip_and_refusals(tmp_path: Path) -> None:
    ref = reference()
    path = ref.save(tmp_path / "ref.json")
    loaded = load_reference(path)
    assert loaded.checksum == ref.checksum and loaded.loss == ref.loss

    text = path.read_text()
    cases = {
        "truncated": (text[: len(text) // 2], "is truncated"),
        "not json": ("{" + text[1:].replace('"steps"', "steps", 1), "is not valid JSON"),
        "edited": (
            text.replace(json.dumps(ref.loss[5]), json.dumps(ref.loss[5] + 0.1)),
            "checksum",
        ),
        "another format": (text.replace("trainguard-reference/2", "other/2"), "not a trainguard"),
        "empty": ("", "is truncated"),
    }
    for what, (content, expected) in cases.items():
        bad = tmp_path / f"{what}.json"
        bad.write_text(content)
        with pytest.raises(BadInputError) as e:
            load_reference(bad)
        assert expected in e.value.message, (what, e.value.message)
        assert "trainguard reference record" in e.value.fix
    # Cut anywhere (inside a string, a number, between fields), it is named truncated.
    for cut in range(1, len(text) - 2, 97):
        (tmp_path / "cut.json").write_text(text[:cut])
        with pytest.raises(BadInputError, match="is truncated"):
            load_reference(tmp_path / "cut.json")
    short = reference(curve_losses()[:5])
    with pytest.raises(BadInputError, match="at least 8"):
        load_reference(short.save(tmp_path / "short.json"))
    with pytest.raises(BadInputError, match="does not exist"):
        load_reference(tmp_path / "missing.json")


def test_a_format_1_reference_is_read_with_its_steps_counted_from_0(tmp_path: Path) -> None:
    """The previous release recorded steps from 1 (`trainguard-reference/1`): such a file is
    verified as it was written and compared at the 0-based index the run logs now."""
    from trainguard.reference.curve import BODY_KEYS, _checksum

    ref = reference()
    body = {k: v for k, v in ref.to_dict().items() if k in BODY_KEYS}
    body |= {"format": "trainguard-reference/1", "steps": [s + 1 for s in ref.steps]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({**body, "checksum": _checksum(body)}))
    old = load_reference(path)
    assert old.steps == ref.steps and old.loss == ref.loss
    assert codes(feed(ReferenceMonitor(old, bitwise=True), np.asarray(ref.loss))) == ["R506"]
    body["steps"][0] = 0  # edited after it was recorded: the checksum says so
    path.write_text(json.dumps({**body, "checksum": _checksum({**body, "steps": ref.steps})}))
    with pytest.raises(BadInputError, match="checksum"):
        load_reference(path)


# -- the recipe hash ----------------------------------------------------------------------------
def test_operational_keys_do_not_make_another_recipe() -> None:
    base = recipe_to_dict(load_recipe("default"))
    operational = [
        "train.threads=3",
        "train.eval_interval=7",
        "train.log_interval=1",
        "checkpoint.interval=5",
        "checkpoint.dir=s3://bucket/x",
        "data.source=/elsewhere",
        "data.cache_dir=/tmp/c",
        "evals.interval=3",
        "guards.spike_min_history=5",
        "metrics.tb_dir=tb",
        "preflight.enabled=false",
        "reference.force=true",
        "distributed.collective_timeout_s=9",
        "name=renamed",
    ]
    assert recipe_hash(recipe_to_dict(load_recipe("default", operational))) == recipe_hash(base)
    for key in ("train.lr=0.001", "model.n_layers=3", "train.max_steps=301", "train.seed=1"):
        changed = recipe_to_dict(load_recipe("default", [key]))
        assert recipe_hash(changed) != recipe_hash(base), key
        assert key.split("=")[0] in curve_recipe(changed)
    # fp32_reduce changes how bf16 gradients are summed: not operational, unlike its section.
    assert "distributed.fp32_reduce" in curve_recipe(base)
    assert any(k.startswith("distributed.") for k in OPERATIONAL_KEYS)
