"""Eval specs, runner, canaries, drift and evaluation-first on a tiny GPT trained in the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from trainguard.config.evals import CanaryConfig, EvalsConfig
from trainguard.config.schema import ModelConfig
from trainguard.data.tokenizer import EOT, train_tokenizer
from trainguard.errors import BadInputError
from trainguard.evals.canaries import run_canaries
from trainguard.evals.drift import EvalDriftMonitor, proportion_drop_pvalue
from trainguard.evals.runner import run_evals
from trainguard.evals.scoring import loglikelihoods
from trainguard.evals.spec import EvalSpecError, load_spec, require_use_case_eval
from trainguard.model.gpt import GPT

# under pytest-xdist the module's tests run on one worker, so its module fixture is built once
pytestmark = pytest.mark.xdist_group("test_evals")

FACTS = "alice likes apples. bob likes bananas. carol likes cherries. dave likes dates."
SEQ = 32


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # Tiny models: one thread avoids oversubscription on a busy 2-core machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([FACTS] * 50, vocab_size=300, min_frequency=2)


def _model(tok, seed=0):
    torch.manual_seed(seed)
    return GPT(ModelConfig(n_layers=1, d_model=32, n_heads=2), tok.get_vocab_size(), SEQ)


@pytest.fixture(scope="module")
def trained(tok):
    """A tiny GPT that memorised FACTS, each sentence a document after an EOT."""
    model = _model(tok)
    eot = tok.token_to_id(EOT)
    docs = [s.strip() + "." for s in FACTS.split(".") if s.strip()]
    stream = [t for _ in range(40) for d in docs for t in [eot, *tok.encode(d).ids]]
    data = torch.tensor(stream)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        starts = torch.randint(0, len(data) - SEQ - 1, (16,), generator=g)
        x = torch.stack([data[s : s + SEQ] for s in starts])
        y = torch.stack([data[s + 1 : s + SEQ + 1] for s in starts])
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _write_spec(tmp_path, tasks, **top):
    files = {}
    for t in tasks:
        rows = t.pop("rows", None)
        if rows is not None:
            files[t["name"]] = rows
            t["data"] = f"{t['name']}.jsonl"
            (tmp_path / t["data"]).write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"name": "t", "tasks": tasks, **top}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


MC = [
    {"context": "bob likes", "choices": [" apples.", " bananas.", " cherries."], "gold": 1},
    {"context": "carol likes", "choices": [" dates.", " apples.", " cherries."], "gold": 2},
    {"context": "alice likes", "choices": [" apples.", " dates.", " bananas."], "gold": 0},
    {"context": "dave likes", "choices": [" cherries.", " dates.", " bananas."], "gold": 1},
]
GEN = [{"prompt": "carol likes", "answer": "cherries"}, {"prompt": "bob likes", "answer": "ban"}]
PPL = [{"text": "alice likes apples."}, {"text": "dave likes dates."}]


def _spec(tmp_path, match="contains"):
    return _write_spec(
        tmp_path,
        [
            {"name": "mc", "type": "multiple_choice", "rows": MC},
            {"name": "gen", "type": "generation", "rows": GEN, "match": match, "stop": ["."]},
            {"name": "ppl", "type": "perplexity", "rows": PPL},
        ],
        use_case=True,
    )


def test_runner_scores_trained_model_above_untrained(tmp_path, tok, trained):
    spec = _spec(tmp_path)
    good = run_evals(trained, tok, [str(spec)])
    bad = run_evals(_model(tok, seed=1), tok, [str(spec)])
    assert good.metrics["mc/acc"] == 1.0 and good.metrics["mc/acc_norm"] == 1.0
    assert good.metrics["gen/acc"] == 1.0
    assert good.metrics["mc/n"] == 4 and good.metrics["ppl/n"] == 2
    assert bad.metrics["gen/acc"] == 0.0
    assert good.metrics["ppl/bpb"] < 0.5 * bad.metrics["ppl/bpb"]
    assert good.examples == 4 + 2 + 2 and good.findings == []


def test_generation_match_modes(tmp_path, tok, trained):
    exact = run_evals(trained, tok, [str(_spec(tmp_path, "exact"))]).metrics["gen/acc"]
    assert exact == 0.5  # "cherries" matches exactly, "ban" is only a prefix of "bananas"
    spec = _write_spec(
        tmp_path,
        [
            {
                "name": "g",
                "type": "generation",
                "rows": [{"prompt": "bob likes", "answer": r"^ ?ban+anas$"}],
                "match": "regex",
                "stop": ["."],
            }
        ],
    )
    assert run_evals(trained, tok, [str(spec)]).metrics["g/acc"] == 1.0


def test_batched_loglikelihood_equals_one_at_a_time(tok, trained):
    reqs = [
        (tok.encode("alice likes").ids, tok.encode(" apples. bob").ids),
        (tok.encode("bob").ids, tok.encode(" likes").ids),
        ([0] + tok.encode("carol likes cherries. dave likes").ids, tok.encode(" dates.").ids),
    ]
    batched = loglikelihoods(trained, reqs, batch_size=8)
    for (ctx, cont), (ll, greedy) in zip(reqs, batched, strict=True):
        full = torch.tensor([ctx + cont])
        with torch.no_grad():
            logp = torch.log_softmax(trained(full[:, :-1]), -1)[0]
        ref = sum(logp[len(ctx) - 1 + j, t].item() for j, t in enumerate(cont))
        assert ll == pytest.approx(ref, abs=1e-4)
        assert greedy == all(
            logp[len(ctx) - 1 + j].argmax().item() == t for j, t in enumerate(cont)
        )


def test_runner_restores_training_mode(tmp_path, tok):
    model = _model(tok).train()
    run_evals(model, tok, [str(_spec(tmp_path))], max_examples=1)
    assert model.training


def test_canaries(tok, trained):
    ok = [CanaryConfig(prompt="alice likes", expect="apples", max_new_tokens=4)]
    metrics, findings = run_canaries(trained, tok, ok)
    assert metrics["canaries/pass_rate"] == 1.0 and findings == []
    bad = ok + [CanaryConfig(prompt="bob likes", expect="kiwis", max_new_tokens=4)]
    metrics, findings = run_canaries(trained, tok, bad, step=7)
    assert metrics["canaries/pass_rate"] == 0.5
    assert [f.code for f in findings] == ["E131"] and findings[0].step == 7


def test_spec_errors_name_the_problem(tmp_path):
    (tmp_path / "bad.yaml").write_text(
        "name: x\ntasks:\n  - {name: a, type: essay, data: a.jsonl}\n"
    )
    with pytest.raises(EvalSpecError, match="tasks.0.type"):
        load_spec(tmp_path / "bad.yaml")
    with pytest.raises(EvalSpecError, match="unknown eval spec"):
        load_spec("no_such_spec")
    spec = _write_spec(
        tmp_path, [{"name": "m", "type": "multiple_choice", "rows": [{"context": "a"}]}]
    )
    with pytest.raises(EvalSpecError, match="'choices'"):
        run_evals(torch.nn.Identity(), None, [str(spec)])


def test_require_use_case_eval(tmp_path):
    require_use_case_eval(EvalsConfig())  # the shipped python_next_line is a use-case eval
    assert load_spec("python_next_line").use_case
    with pytest.raises(BadInputError, match="E101"):
        require_use_case_eval(EvalsConfig(specs=[]))
    spec = _write_spec(tmp_path, [{"name": "p", "type": "perplexity", "rows": PPL}])
    with pytest.raises(BadInputError, match="use-case"):
        require_use_case_eval(EvalsConfig(specs=[str(spec)]))
    with pytest.raises(BadInputError, match="E101"):
        require_use_case_eval(None)


def test_evals_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="extra"):
        EvalsConfig.model_validate({"specz": []})


def test_drift_fires_on_a_real_drop_only():
    mon = EvalDriftMonitor(alpha=0.01)
    assert mon.update(0, {"t/acc": 0.60, "t/n": 200.0}) == []
    # Noise-sized wobbles around 0.6 on 200 examples: quiet.
    for step, acc in enumerate([0.58, 0.62, 0.57, 0.61, 0.59], start=1):
        assert mon.update(step, {"t/acc": acc, "t/n": 200.0}) == []
    state = json.loads(json.dumps(mon.state_dict()))
    fresh = EvalDriftMonitor()
    fresh.load_state_dict(state)
    found = fresh.update(9, {"t/acc": 0.45, "t/n": 200.0})
    assert [f.code for f in found] == ["E121"] and found[0].metric == "t/acc"
    assert found[0].data["best"] == 0.62


def test_drift_bits_per_byte_and_degenerate_input():
    mon = EvalDriftMonitor(alpha=0.01)
    assert mon.update(0, {"p/bpb": 2.0, "p/bpb_se": 0.05, "p/n": 50.0}) == []
    assert mon.update(1, {"p/bpb": 2.05, "p/bpb_se": 0.05, "p/n": 50.0}) == []
    assert [f.code for f in mon.update(2, {"p/bpb": 2.5, "p/bpb_se": 0.05, "p/n": 50.0})] == [
        "E121"
    ]
    assert mon.update(3, {"x/acc": float("nan"), "x/n": 10.0, "y/acc": 0.5}) == []
    # Small counts use Fisher's exact test: 3/4 -> 1/4 is not significant.
    assert proportion_drop_pvalue(3, 4, 1, 4) > 0.05


def _fake_run_dir(tmp_path, tok, model):
    """A run dir laid out as trainguard writes it: tokenizer, recipe, checkpoints/step-N/."""
    from trainguard import Checkpointer
    from trainguard.config.load import recipe_to_dict, validate_recipe
    from trainguard.data.tokenizer import save_tokenizer

    run = tmp_path / "run"
    run.mkdir()
    save_tokenizer(tok, run / "tokenizer.json")
    recipe = validate_recipe(
        {"model": {"n_layers": 1, "d_model": 32, "n_heads": 2}, "data": {"seq_len": SEQ}}
    )
    text = yaml.safe_dump(recipe_to_dict(recipe))
    (run / "recipe.yaml").write_text(text)

    ckpt = Path(Checkpointer(run / "checkpoints").save(200, {"model": model}))
    # An interrupted save (a temp folder, no manifest) at a later step must be ignored.
    (run / "checkpoints" / ".tmp-step-300-abc-999999").mkdir()
    return run, ckpt


def test_load_model_for_eval_and_cli(tmp_path, tok, trained):
    from typer.testing import CliRunner

    from trainguard.cli import app
    from trainguard.evals.load import load_model_for_eval

    run, ckpt = _fake_run_dir(tmp_path, tok, trained)
    model, tok2, recipe = load_model_for_eval(run)
    x = torch.tensor([tok.encode("alice likes apples.").ids])
    with torch.no_grad():
        assert torch.equal(model(x), trained(x))
    assert tok2.to_str() == tok.to_str() and recipe.data.seq_len == SEQ
    spec = _spec(tmp_path)
    cli = CliRunner()
    for target in (run, ckpt):
        res = cli.invoke(app, ["eval", str(target), "--spec", str(spec), "--json"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["ok"] and out["metrics"]["mc/acc"] == 1.0
        assert out["checkpoint"] == str(ckpt)
    res = cli.invoke(app, ["eval", str(tmp_path / "missing"), "--json"])
    assert res.exit_code == 2


def test_eval_schedule_baseline_interval_end_and_resume(tmp_path, tok, trained):
    from trainguard.evals.schedule import EvalSchedule

    cfg = EvalsConfig(
        specs=[str(_spec(tmp_path))],
        interval=5,
        canaries=[CanaryConfig(prompt="alice likes", expect="apples", max_new_tokens=3)],
    )
    sched = EvalSchedule(cfg, tok, default_interval=100)
    assert [s for s in range(12) if sched.due(s)] == [0, 5, 10]
    row, findings = sched.run(trained, 10)
    assert row["kind"] == "evals" and row["step"] == 10 and row["mc/acc"] == 1.0
    assert row["canaries/pass_rate"] == 1.0 and findings == []
    assert not sched.due(10, final=True)  # the end at an interval step: once
    assert sched.due(12, final=True)
    # A resumed schedule keeps the pre-interruption best values for the drift test.
    fresh = EvalSchedule(cfg, tok)
    fresh.load_state_dict(json.loads(json.dumps(sched.state_dict())))
    assert fresh.drift.best["mc/acc"]["value"] == 1.0 and not fresh.due(10)
    _, findings = fresh.run(_model(tok, seed=3), 15)  # an untrained model forgets the canary
    assert "E131" in {f.code for f in findings}
