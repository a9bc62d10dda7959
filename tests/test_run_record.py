"""Issue 22, items 1 and 2: every loop leaves a run record, and every tool reads it.

The records of (a) examples/ddp_loop.py, (b) a GuardedTrainer, (c) a Lightning run and (d)
`trainguard run` are made once per session (`build_once`); each test copies what it writes
into. `report`, `batch`, `reference record`, `watch` and `eval` run on each of them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import build_once
from recordloops import STEPS, VOCAB, build_ddp, build_hf, build_lightning
from runhelpers import invoke_cli
from trainguard.data.order import batch_hash
from trainguard.data.sampler import ElasticSampler
from trainguard.metrics.record import RUN_FILE, SCHEMA_VERSION
from trainguard.metrics.record_read import read_record

pytest.importorskip("transformers")
pytest.importorskip("lightning")
pytestmark = pytest.mark.xdist_group("run_record")  # the records are built once, on one worker

LOOPS = ("ddp", "hf", "lightning", "run")
BUILDERS = {"ddp": build_ddp, "hf": build_hf, "lightning": build_lightning}
FACTORY = {
    "ddp": "recordloops.py:ddp_model",
    "hf": "recordloops.py:hf_model",
    "lightning": "recordloops.py:lightning_model",
}
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def records(shared_root: Path, finished_tiny_run: Path) -> dict[str, Path]:
    out = {name: build_once(shared_root, f"record-{name}", fn) for name, fn in BUILDERS.items()}
    return out | {"run": finished_tiny_run}


@pytest.fixture(params=LOOPS)
def record_copy(request, records: dict[str, Path], tmp_path: Path) -> tuple[str, Path]:
    """(loop, a copy of its record): the report writes into the run dir."""
    dst = tmp_path / request.param
    shutil.copytree(records[request.param], dst)
    return request.param, dst


def _json(res) -> dict:
    return json.loads(res.stdout)


# --- item 1: the record ---------------------------------------------------------------------
@pytest.mark.parametrize("loop", ("ddp", "hf", "lightning"))
def test_every_loop_writes_one_schema(records: dict[str, Path], loop: str) -> None:
    run = records[loop]
    info = json.loads((run / RUN_FILE).read_text())
    assert info["schema_version"] == SCHEMA_VERSION == 2
    assert {"python", "torch", "trainguard", "device"} <= set(info["environment"])
    assert info["sampler"]["seed"] == 0 and "skipped_positions" not in info["sampler"]
    # Inside the run dir: relative, so that a copied or moved run dir still finds them.
    assert info["checkpoints"]["root"] == ("." if loop == "hf" else "checkpoints")
    record = read_record(run)
    steps = record.last_by_step("step")
    assert sorted(steps) == list(range(STEPS))  # 0-based, one row per step
    sampler = ElasticSampler(
        info["sampler"]["num_samples"],
        global_batch_size=info["sampler"]["global_batch_size"],
        seed=0,
        rank=0,
        world_size=1,
    )
    for s, row in steps.items():
        assert {"loss", "grad_norm", "lr", "action", "position", "batch_hash"} <= set(row)
        assert row["position"] == sampler.position(s)
        assert row["batch_hash"] == sampler.batch_hash(s)
    if loop == "ddp":  # the user's config, the data phase, tokens, the skipped NaN step
        assert info["config"]["max_steps"] == STEPS
        assert steps[5]["action"] == "skip" and steps[4]["action"] == "apply"
        assert all(isinstance(r.get("data_time_s"), float) for r in steps.values())
        assert steps[0]["tokens"] == 8 * 16
        assert {"R101", "R201"} <= {r["code"] for r in record.kind("finding")}
    # The step time where the loop gives one (the data phase), else between rows.
    assert all(isinstance(steps[s].get("step_time_s"), float) for s in range(1, STEPS))
    if loop == "hf":
        assert info["config"]["max_steps"] == STEPS and info["loop"] == "hf trainer"


def test_the_previous_releases_run_dir_reads_0_based(tmp_path: Path) -> None:
    run = tmp_path / "old"
    run.mkdir()
    rows = [{"kind": "step", "step": s, "loss": 1.0} for s in (1, 2, 3)]
    rows += [{"kind": "finding", "code": "R101", "step": 2, "message": "m", "severity": "error"}]
    rows += [{"kind": "event", "event": "rollback", "step": 3, "bad_positions": {"2": 8}}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = read_record(run)
    assert [r["step"] for r in record.steps()] == [0, 1, 2]
    assert record.kind("finding")[0]["step"] == 1
    assert record.events("rollback")[0]["bad_positions"] == {"1": 8}


def test_a_torn_last_line_is_ignored(records: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "torn"
    shutil.copytree(records["ddp"], run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "step", "step": 8, "loss": 1.')  # SIGKILL mid-write
    assert sorted(read_record(run).last_by_step()) == list(range(STEPS))
    assert invoke_cli("report", str(run)).returncode == 0


# --- item 2: every tool on every record -----------------------------------------------------
def test_report(record_copy: tuple[str, Path]) -> None:
    loop, run = record_copy
    res = invoke_cli("report", str(run))
    assert res.returncode == 0, res.stdout + res.stderr
    page = (run / "report.html").read_text()
    md = (run / "report.md").read_text()
    assert "<img" in page and "data:image/png" in page  # the curves
    steps = 12 if loop == "run" else STEPS
    assert f"| steps | {steps} |" in md
    assert "verified" in page  # its checkpoints, verified: the copy's own
    assert f"<td>{run / ('.' if loop == 'hf' else 'checkpoints')}" in page
    assert "torch" in page  # the environment
    # Goodput from the timing rows every loop's record has (the Guard writes an own loop's):
    # the process's start-up is counted, so the bar is not the steps alone.
    assert '<img alt="goodput"' in page and "## Goodput" in md
    assert "| startup |" in md and "| startup | 0.0% |" not in md
    if loop == "ddp":  # the skip, linked to its batch view (item 4)
        assert f"trainguard batch {run} --step 5" in page


def test_batch_shows_the_sample_ids_of_the_global_batch(
    records: dict[str, Path], tmp_path: Path
) -> None:
    for loop in LOOPS:
        run = records[loop]
        res = invoke_cli("batch", str(run), "--step", "5", "--json")
        assert res.returncode in (0, 1), res.stderr  # 1: the data filters flag a document
        doc = _json(res)
        row = read_record(run).last_by_step("step")[5]
        assert doc["step"] == 5 and doc["position"] == row["position"]
        assert batch_hash(np.array(doc["sample_ids"])) == row["batch_hash"], loop
        texts = [s["text"] for s in doc["samples"]]
        if loop == "run":  # trainguard's prepared data: text and per-sample loss
            assert all(texts) and doc["loss_from_step"] == 4  # the state step 5 started from
            assert all(isinstance(s["loss"], float) for s in doc["samples"])
        else:  # says what it could not show, and why
            assert texts == [None] * len(texts)
            assert any("--describe" in line for line in doc["not_shown"])


def test_batch_describe_shows_text_and_loss(records: dict[str, Path], tmp_path: Path) -> None:
    module = tmp_path / "mine.py"
    module.write_text(
        "def describe(i):\n    return {'text': f'sample {i}', 'loss': i / 10}\n"
        "def text_only(i):\n    return f'sample {i}'\n"
    )
    res = invoke_cli(
        "batch", str(records["ddp"]), "--step", "5", "--describe", f"{module}:describe"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sample " in res.stdout and "not shown" not in res.stdout
    res = invoke_cli(
        "batch", str(records["ddp"]), "--step", "5", "--json", "--describe", f"{module}:text_only"
    )
    doc = _json(res)
    assert [s["text"] for s in doc["samples"]] == [f"sample {i}" for i in doc["sample_ids"]]
    assert [a["outcome"] for a in doc["attempts"]] == ["skip"]
    assert any("per-sample loss" in line for line in doc["not_shown"])


@pytest.mark.parametrize("loop", LOOPS)
def test_reference_record(records: dict[str, Path], loop: str, tmp_path: Path) -> None:
    out = tmp_path / "ref.json"
    res = invoke_cli("reference", "record", str(records[loop]), "--out", str(out), "--json")
    if loop == "ddp":  # its NaN step (0-based 5) makes it no known-good run: refused, named
        assert res.returncode == 2 and "non-finite loss at step 5" in res.stderr
        return
    assert res.returncode == 0, res.stdout + res.stderr
    ref = json.loads(out.read_text())
    n = 12 if loop == "run" else STEPS
    assert len(ref["loss"]) == n and ref["env"]["torch"]
    assert ref["steps"][0] == 0  # every loop's rows count steps from 0 (curve format 2)


@pytest.mark.parametrize("loop", ("hf", "lightning", "run"))
def test_comparison_with_a_reference(records: dict[str, Path], loop: str, tmp_path: Path) -> None:
    """A record compared with the reference recorded from it: equal; another loop's record
    against it: other batches (R504)."""
    ref = tmp_path / "ref.json"
    assert invoke_cli("reference", "record", str(records[loop]), "--out", str(ref)).returncode == 0
    res = invoke_cli("watch", str(records[loop]), "--reference", str(ref), "--json")
    doc = _json(res)
    assert res.returncode == 0 and doc["reference"]["bitwise_equal"], doc["reference"]
    assert "R506" in {f["code"] for f in doc["findings"]}
    other = _json(invoke_cli("watch", str(records["ddp"]), "--reference", str(ref), "--json"))
    assert other["reference"]["compared"] == 0 or "R504" in {f["code"] for f in other["findings"]}


@pytest.mark.parametrize("loop", LOOPS)
def test_watch(records: dict[str, Path], loop: str) -> None:
    res = invoke_cli("watch", str(records[loop]), "--json")
    doc = _json(res)
    assert doc["rows"] == (12 if loop == "run" else STEPS), doc
    codes = {f["code"] for f in doc["findings"]}
    if loop == "ddp":  # the NaN step, at its 0-based step
        assert res.returncode == 1 and "R101" in codes
        assert {f["step"] for f in doc["findings"] if f["code"] == "R101"} == {5}
    else:
        assert "R101" not in codes


def _tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


def _spec(folder: Path) -> Path:
    import yaml

    rows = [{"text": " ".join(f"t{(i * 7 + j) % VOCAB}" for j in range(10))} for i in range(3)]
    (folder / "ppl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"name": "mine", "tasks": [{"name": "ppl", "type": "perplexity", "data": "ppl.jsonl"}]}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))
    return folder / "spec.yaml"


@pytest.mark.parametrize("loop", ("ddp", "hf", "lightning"))
def test_eval_with_the_users_model_factory(
    records: dict[str, Path], loop: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(HERE)  # recordloops.py:FACTORY is a path relative to the tests
    spec, tok = _spec(tmp_path), _tokenizer(tmp_path / "tokenizer.json")
    res = invoke_cli(
        "eval", str(records[loop]), "--model", FACTORY[loop], "--tokenizer", str(tok),
        "--spec", str(spec), "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    doc = _json(res)
    root = records[loop] / ("." if loop == "hf" else "checkpoints")
    assert Path(doc["checkpoint"]).parent == root
    assert doc["metrics"]["ppl/n"] == 3 and doc["metrics"]["ppl/bpb"] > 0


def test_eval_of_trainguard_run(records: dict[str, Path]) -> None:
    res = invoke_cli("eval", str(records["run"]), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert _json(res)["checkpoint"].endswith("step-12")


def test_eval_of_a_record_names_what_it_needs(records: dict[str, Path]) -> None:
    res = invoke_cli("eval", str(records["ddp"]))
    assert res.returncode == 2
    for flag in ("--model", "--tokenizer", "--spec"):
        assert flag in (res.stdout + res.stderr)


def _host_reads(run_dir: Path | None, monkeypatch: pytest.MonkeyPatch, device_path: bool) -> int:
    """Device-to-host reads (`item`, `tolist`, `cpu`, `numpy`, `__float__`, `__bool__`) over 12
    guarded steps."""
    import torch

    from trainguard import Guard

    counted = {"n": 0}
    for name in ("item", "tolist", "cpu", "numpy", "__float__", "__bool__"):
        original = getattr(torch.Tensor, name)

        def counting(self, *a, __original=original, **k):  # noqa: ANN001, ANN202
            counted["n"] += 1
            return __original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counting)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1))  # a tensor lr: not read
    guard = Guard(run_dir=run_dir)
    if guard.record is not None:
        sampler = ElasticSampler(64, global_batch_size=8, seed=0)
        guard.record.attach(sampler=sampler, optimizer=opt, tokens_per_sample=4)
    for step in range(12):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        loss = model(torch.randn(8, 4)).pow(2).mean().detach()
        if device_path:
            guard.step_async(step, loss=loss, model=model).optimizer_step(opt)
        else:
            guard.step(step, loss=loss, model=model, optimizer=opt)
        opt.zero_grad()
    guard.flush()
    monkeypatch.undo()
    guard.close()
    return counted["n"]


@pytest.mark.parametrize("device_path", (False, True))
def test_writing_the_record_reads_nothing_more_from_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device_path: bool
) -> None:
    plain = _host_reads(None, monkeypatch, device_path)
    recorded = _host_reads(tmp_path, monkeypatch, device_path)
    assert plain > 0 and recorded == plain
    assert len(read_record(tmp_path).steps()) == 12


# --- item 4: the report of your own loop, in a real headless browser -------------------------
def _browser():  # noqa: ANN202
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("no chromium and chromedriver on this machine")
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    return webdriver.Chrome(options=options, service=service)


def test_own_loop_report_renders_in_a_browser(records: dict[str, Path], tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    run = tmp_path / "ddp"
    shutil.copytree(records["ddp"], run)
    assert invoke_cli("report", str(run)).returncode == 0
    driver = _browser()
    try:
        driver.get((run / "report.html").as_uri())
        images = driver.find_elements(By.TAG_NAME, "img")
        alts = {i.get_attribute("alt") for i in images}
        assert {"loss", "grad"} <= alts  # the curves, with the findings marked on them
        drawn = driver.execute_script(
            "return Array.from(document.images).map(i => i.complete && i.naturalWidth > 0)"
        )
        assert drawn and all(drawn)
        decisions = driver.find_element(By.ID, "decisions").text
        assert "skip" in decisions and "5" in decisions
        assert "verified" in driver.find_element(By.TAG_NAME, "body").text  # checkpoints
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
        driver.find_element(By.CSS_SELECTOR, "#decisions a.batch").click()  # the skip's batch
        assert driver.title == "trainguard batch: step 5"
        rows = driver.find_elements(By.CSS_SELECTOR, "table tr")
        assert len(rows) >= 8 and "not shown" in driver.find_element(By.TAG_NAME, "body").text
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        driver.quit()


def test_watch_replays_the_router_and_loader_codes_from_a_record(tmp_path: Path) -> None:
    """A loop passing `router_stats` and its data time: the record keeps what R601-R605 need,
    and `watch` on the record finds what the guard found, at the same steps."""
    from trainguard import Guard

    guard = Guard(run_dir=tmp_path)
    collapsed = {"tokens_routed": 400, "tokens_dropped": 0, "expert_counts": [400, 0, 0, 0]}
    for step in range(30):
        guard.step(
            step, loss=3.0 - step / 100, grad_norm=1.0, data_time_s=0.6, step_time_s=1.0,
            router_stats={"layer0": {**collapsed, "top_k": 1}},
        )  # fmt: skip
    guard.close()
    by_guard = {(r["code"], r["step"]) for r in read_record(tmp_path).kind("finding")}
    assert {"R602", "R603", "R605"} <= {code for code, _ in by_guard}
    res = invoke_cli("watch", str(tmp_path), "--json")
    found = {(f["code"], f["step"]) for f in _json(res)["findings"]}
    replayed = {(c, s) for c, s in by_guard if c.startswith("R60")}
    assert replayed and replayed <= found
