"""Eval template lint: each planted trap raises exactly its code; a clean spec raises nothing."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
import yaml
from tokenizers import processors
from typer.testing import CliRunner

from trainguard.cli import app
from trainguard.config.schema import DataConfig
from trainguard.data.tokenizer import EOT, save_tokenizer, train_tokenizer
from trainguard.evals.builtin import build_next_line_examples, python_next_line
from trainguard.evals.lint import lint_spec

CORPUS = "x = foobar(1)\ny = foobar(2)\nthe answer is paris. the answer is rome.\n" * 30


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([CORPUS], vocab_size=320, min_frequency=2)


def _spec(tmp_path: Path, rows, type_="multiple_choice", name="spec", **top) -> Path:
    (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"name": name, "tasks": [{"name": "t", "type": type_, "data": f"{name}.jsonl"}], **top}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


CLEAN_MC = [{"context": "the answer is", "choices": [" paris.", " rome."], "gold": 0}]
CLEAN_GEN = [{"prompt": "the answer is", "answer": "paris"}]


def _codes(findings):
    return sorted(f.code for f in findings)


def test_clean_specs_raise_nothing(tmp_path, tok):
    assert lint_spec(_spec(tmp_path, CLEAN_MC), tok) == []
    assert lint_spec(_spec(tmp_path, CLEAN_GEN, "generation", name="g"), tok) == []
    ppl = _spec(tmp_path, [{"text": "x = foobar(1)"}], "perplexity", name="p")
    assert lint_spec(ppl, tok) == []


@pytest.mark.parametrize(
    ("rows", "type_", "code"),
    [
        # the trailing-space trap: both sides carry the space
        (
            [{"context": "the answer is ", "choices": [" paris.", " rome."], "gold": 0}],
            "multiple_choice",
            "E111",
        ),
        ([{"prompt": "the answer is ", "answer": "paris"}], "generation", "E111"),
        # boundary mismatch: "foobar" is one token joined, two tokens split
        (
            [{"context": "x = foo", "choices": ["bar(1)", "bar(2)"], "gold": 0}],
            "multiple_choice",
            "E112",
        ),
        (
            [{"context": "the answer is", "choices": [" paris.", ""], "gold": 0}],
            "multiple_choice",
            "E115",
        ),
        ([{"prompt": "the answer is", "answer": "  "}], "generation", "E115"),
        ([{"text": ""}], "perplexity", "E115"),
        (
            [{"context": "the answer is", "choices": [" paris.", " paris."], "gold": 0}],
            "multiple_choice",
            "E116",
        ),
        (
            [{"context": "the answer is", "choices": [" paris.", " rome."], "gold": 2}],
            "multiple_choice",
            "E117",
        ),
        (
            [{"context": "the answer is", "choices": [" paris.", " rome."], "gold": -1}],
            "multiple_choice",
            "E117",
        ),
        # BOS doubled: the text starts with the token the spec already adds
        (
            [{"context": EOT + "the answer is", "choices": [" paris.", " rome."], "gold": 0}],
            "multiple_choice",
            "E114",
        ),
    ],
)
def test_planted_trap_raises_exactly_its_code(tmp_path, tok, rows, type_, code):
    findings = lint_spec(_spec(tmp_path, rows, type_), tok)
    assert _codes(findings) == [code], findings
    assert findings[0].data["examples"] == 1


def test_bos_missing(tmp_path, tok):
    findings = lint_spec(_spec(tmp_path, CLEAN_MC, bos=None), tok)
    assert _codes(findings) == ["E113"]


def test_bos_not_in_vocabulary_is_missing(tmp_path, tok):
    findings = lint_spec(_spec(tmp_path, CLEAN_MC, bos="<s>"), tok)
    assert _codes(findings) == ["E113"] and "<s>" in findings[0].message


def test_bos_doubled_by_post_processor(tmp_path, tok):
    doubled = train_tokenizer([CORPUS], vocab_size=320, min_frequency=2)
    doubled.post_processor = processors.TemplateProcessing(
        single=f"{EOT} $A", special_tokens=[(EOT, doubled.token_to_id(EOT))]
    )
    assert _codes(lint_spec(_spec(tmp_path, CLEAN_MC), doubled)) == ["E114"]
    # ...and the fix named by the code works: stop adding it in the spec.
    assert lint_spec(_spec(tmp_path, CLEAN_MC, bos=None), doubled) == []


def test_one_finding_per_task_and_code(tmp_path, tok):
    rows = [{"context": "the answer is ", "choices": [" paris.", " rome."], "gold": 0}] * 5
    (finding,) = lint_spec(_spec(tmp_path, rows), tok)
    assert finding.code == "E111" and finding.data["examples"] == 5


def _python_docs():
    lib = Path(sysconfig.get_paths()["stdlib"])
    return [(p.name, p.read_text(encoding="utf-8")) for p in sorted(lib.glob("[a-c]*.py"))[:12]]


def test_builtin_next_line_is_deterministic_and_well_formed():
    docs = _python_docs()
    rows = build_next_line_examples(docs, n_examples=30, seed=3)
    assert rows == build_next_line_examples(list(reversed(docs)), n_examples=30, seed=3)
    assert rows != build_next_line_examples(docs, n_examples=30, seed=4)
    assert len(rows) == 30
    texts = dict(docs)
    for row in rows:
        assert len(row["choices"]) == 4 and len(set(row["choices"])) == 4
        true = row["choices"][row["gold"]]
        # the gold choice is the line that really follows the context in its document
        assert row["context"] + true in texts[row["doc"]].replace(" \n", "\n") or (
            true.lstrip("\n") in texts[row["doc"]]
        )
        indent = true[1 : len(true) - len(true.lstrip())]
        assert all(c.startswith("\n" + indent) for c in row["choices"])
    golds = {r["gold"] for r in rows}
    assert golds == {0, 1, 2, 3}  # the gold slot is not a giveaway


def test_builtin_task_passes_its_own_lint(tmp_path, tok):
    folder = tmp_path / "code"
    folder.mkdir()
    for name, text in _python_docs():
        (folder / name).write_text(text)
    code_tok = train_tokenizer([t for _, t in _python_docs()], vocab_size=600)
    data = DataConfig(source=str(folder), val_fraction=0.45)
    rows = python_next_line(data, n_examples=40)
    assert len(rows) > 10
    spec = Path(__file__).parents[1] / "src/trainguard/recipes/evals/python_next_line.yaml"
    assert lint_spec(str(spec), code_tok, data=data, max_examples=40) == []


def test_cli_eval_lint(tmp_path, tok):
    tok_path = tmp_path / "tokenizer.json"
    save_tokenizer(tok, tok_path)
    runner = CliRunner()
    clean = _spec(tmp_path, CLEAN_MC)
    res = runner.invoke(app, ["eval", "lint", str(clean), "--tokenizer", str(tok_path), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"ok": True, "findings": [], "spec": str(clean)}
    trap = _spec(tmp_path, [{"context": "a ", "choices": [" b", " c"], "gold": 0}], name="trap")
    res = runner.invoke(app, ["eval", "lint", str(trap), "--tokenizer", str(tok_path), "--json"])
    assert res.exit_code == 1
    assert [f["code"] for f in json.loads(res.stdout)["findings"]] == ["E111"]
    res = runner.invoke(app, ["eval", "lint", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2
    shutil.rmtree(tmp_path / "unused", ignore_errors=True)


def test_invalid_regex_answer_is_a_lint_error_and_refused_by_eval(tmp_path, tok):
    rows = [
        {"prompt": "the answer is", "answer": "par(is"},
        {"prompt": "the answer is", "answer": "r[o"},
        {"prompt": "the answer is", "answer": "paris|rome"},  # valid
    ]
    path = _spec(tmp_path, rows, "generation")
    spec = yaml.safe_load(path.read_text())
    spec["tasks"][0]["match"] = "regex"
    path.write_text(yaml.safe_dump(spec))
    findings = lint_spec(path, tok)
    assert _codes(findings) == ["E118"], findings
    assert findings[0].severity == "error" and findings[0].data["examples"] == 2
    assert "'par(is' is not a valid regular expression" in findings[0].message
    # `eval` refuses the spec before it loads a model (exit 2, no traceback)
    res = CliRunner().invoke(app, ["eval", str(tmp_path), "--spec", str(path)])
    assert res.exit_code == 2 and "example 0" in res.output, res.output
    assert "not a valid regular expression" in " ".join(res.output.split())


def _space_token_tokenizer():
    """A tokenizer that keeps every space a token of its own (digits-and-spaces tokenizers such
    as Falcon's do this for some text): there a prompt *needs* its trailing space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(" ", behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    t.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=[EOT], initial_alphabet=alphabet, show_progress=False
    )
    t.train_from_iterator([CORPUS], trainer)
    return t


TRAILING = [{"prompt": "the answer is ", "answer": "paris"}]


def test_trailing_space_prompt_follows_the_tokenizer(tmp_path, tok):
    spec = _spec(tmp_path, TRAILING, "generation", name="g")
    # GPT-2 style byte-level BPE: running text has " paris" as one token, so the prompt's space
    # is a trap; the finding says which form the model saw.
    (trap,) = lint_spec(spec, tok)
    assert (trap.code, trap.severity) == ("E111", "error")
    assert trap.data["seen_in_training"] == " paris"
    assert "' paris'" in trap.message
    # A tokenizer that keeps the space as its own token saw "is", " ", "paris": the prompt
    # needs the space, and the lint stays quiet (the Falcon case).
    space_tok = _space_token_tokenizer()
    prompt_tokens = space_tok.encode("the answer is ").tokens
    assert prompt_tokens[-1] == "Ġ"
    assert space_tok.encode("the answer is paris").tokens[: len(prompt_tokens)] == prompt_tokens
    assert lint_spec(spec, space_tok) == []
    # A double space stays a trap for every tokenizer.
    double = _spec(tmp_path, [{"context": "is ", "choices": [" a", " b"], "gold": 0}], name="d")
    assert [(f.code, f.severity) for f in lint_spec(double, space_tok)] == [("E111", "error")]


def test_trailing_space_without_tokenizer_is_a_warning(tmp_path):
    spec = _spec(tmp_path, TRAILING, "generation", name="g")
    (finding,) = lint_spec(spec, None)
    assert (finding.code, finding.severity) == ("E111", "warning")
    assert "--tokenizer" in finding.message
    assert lint_spec(_spec(tmp_path, CLEAN_GEN, "generation", name="c"), None) == []
    res = CliRunner().invoke(app, ["eval", "lint", str(spec), "--json"])
    assert res.exit_code == 0, res.output  # a warning: exit 0
    assert [f["severity"] for f in json.loads(res.stdout)["findings"]] == ["warning"]
