"""lm-evaluation-harness adapter: runs a local task on a trainguard checkpoint (skips without
lm_eval), and says how to install it when it is missing."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

HAVE_LM_EVAL = importlib.util.find_spec("lm_eval") is not None


@pytest.mark.skipif(HAVE_LM_EVAL, reason="lm_eval is installed")
def test_missing_lm_eval_is_bad_input():
    from trainguard.errors import BadInputError
    from trainguard.integrations.lm_eval import make_lm

    with pytest.raises(BadInputError, match="not installed") as e:
        make_lm("anything")
    assert "pip install lm-eval" in e.value.fix


def test_local_task_runs_on_a_checkpoint(tmp_path):
    pytest.importorskip("lm_eval")
    from test_evals import FACTS, _fake_run_dir, _model
    from trainguard.data.tokenizer import train_tokenizer
    from trainguard.integrations.lm_eval import run_lm_eval

    tok = train_tokenizer([FACTS] * 50, vocab_size=300, min_frequency=2)
    run, _ = _fake_run_dir(tmp_path, tok, _model(tok))
    rows = [{"context": "bob likes", "choices": [" apples.", " bananas."], "gold": 1}]
    data = tmp_path / "facts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    task = {
        "task": "tg_facts",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{context}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{gold}}",
        "metric_list": [{"metric": "acc"}],
    }
    (tasks / "tg_facts.yaml").write_text(yaml.safe_dump(task))
    out = run_lm_eval(run, ["tg_facts"], include_path=tasks)
    assert out["results"]["tg_facts"]["acc,none"] in (0.0, 1.0)
