"""`trainguard data check-chat` and `check_chat_dataset`: each fault planted in a small dataset
made here, with a tokenizer trained here (no downloads); a clean dataset raises nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers")

from trainguard.checks.chat_data import check_chat_dataset  # noqa: E402
from trainguard.cli import app  # noqa: E402

SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<pad>"]
NL = "{{ '\\n' }}"
ROLE_CHECK = (
    "{% if m['role'] not in ['system', 'user', 'assistant', 'tool', 'human'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
)


def chatml(assistant: str = "{{ m['content'] }}<|im_end|>", header: str = "<|im_start|>") -> str:
    """A ChatML template with BOS; `assistant` renders the assistant's turn."""
    return (
        "{{ bos_token }}{% for m in messages %}" + ROLE_CHECK + header + "{{ m['role'] }}" + NL
        + "{% if m['role'] == 'assistant' %}" + assistant
        + "{% else %}{{ m['content'] }}<|im_end|>{% endif %}" + NL + "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant" + NL + "{% endif %}"
    )  # fmt: skip


TEMPLATE = chatml("{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}")
SYSTEM = "You are a careful assistant who answers briefly."
WORDS = "what is two plus two four the answer is hello how are you fine thank careful brief"


def conv(*turns: tuple[str, str | None]) -> dict:
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


CLEAN = [
    conv(("system", SYSTEM), ("user", "what is two plus two"), ("assistant", "four")),
    conv(
        ("user", "hello how are you"),
        ("assistant", "fine thank you"),
        ("user", "what is the answer"),
        ("assistant", "the answer is four"),
    ),  # fmt: skip
    {"prompt": "what is two plus two", "response": "the answer is four"},
]


def _build_tokenizer(folder: Path, template: str | None, add_bos: bool = False) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([WORDS, SYSTEM, "system user assistant"] * 4, trainer)
    if add_bos:  # as Llama's tokenizers do: BOS added to every text tokenized
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "<|im_end|>", "pad_token": "<pad>"}
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def toks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat-tok")
    return {
        "plain": _build_tokenizer(root / "plain", TEMPLATE),
        "bos": _build_tokenizer(root / "bos", TEMPLATE, add_bos=True),
    }


@pytest.fixture(scope="module")
def hf_tok(toks):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(toks["plain"]), local_files_only=True)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def check(tmp_path: Path, toks, rows: list[dict], *args: str, tok: str = "plain", template=None):
    """The CLI's exit code and JSON payload on `rows`."""
    data = _jsonl(tmp_path / "data.jsonl", rows)
    argv = ["data", "check-chat", str(data), "--tokenizer", str(toks[tok]), "--json", *args]
    if template is not None:
        argv += ["--template", str(_write(tmp_path / "train.jinja", template))]
    res = CliRunner().invoke(app, argv)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res.exit_code, json.loads(res.output)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def codes(payload: dict, info: bool = False) -> dict[str, dict]:
    """Findings by code; info ones (D402: a check that could not run) only with `info`."""
    return {f["code"]: f for f in payload["findings"] if info or f["severity"] != "info"}


def test_clean_dataset_has_no_finding(tmp_path, toks):
    status, out = check(tmp_path, toks, CLEAN, "--max-length", "64", template=TEMPLATE)
    assert (status, out["findings"]) == (0, [])
    assert out["ok"] and out["stats"]["compared"] == 3 and out["stats"]["labeled"] == 3


def test_no_training_rendering_is_said_not_compared(tmp_path, toks):
    status, out = check(tmp_path, toks, CLEAN)
    found = codes(out, info=True)
    assert status == 0 and set(found) == {"D402"}, found
    assert found["D402"]["severity"] == "info"


# --- the rendering, token by token ------------------------------------------------------------
def test_training_template_that_differs_is_shown_at_its_first_token(tmp_path, toks):
    other = chatml(
        "{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}", header="<|im_start|> "
    )
    status, out = check(tmp_path, toks, CLEAN, template=other)
    d401 = codes(out)["D401"]
    assert status == 1 and set(codes(out)) == {"D401"}
    assert d401["data"]["example_ids"] == [0, 1, 2] and d401["data"]["count"] == 3
    first = d401["data"]["examples"][0]
    # <s> then <|im_start|>: the third token is the space the training template adds
    assert first["position"] == 2 and first["training"] == "' '"
    assert first["template"].startswith("'s")  # "system", as the tokenizer's template goes on


def test_text_column_with_other_format_differs(tmp_path, toks):
    rows = [{**CLEAN[2], "text": "what is two plus two\nthe answer is four<|im_end|>"}, CLEAN[0]]
    status, out = check(tmp_path, toks, rows)
    d401 = codes(out)["D401"]
    assert status == 1 and d401["data"]["example_ids"] == [0]
    assert d401["data"]["examples"][0]["position"] == 0
    assert d401["data"]["examples"][0]["training_source"] == "text column"


def test_input_ids_equal_to_the_template_pass(tmp_path, toks, hf_tok):
    rows = []
    for r in CLEAN:
        msgs = r.get("messages") or [
            {"role": "user", "content": r["prompt"]},
            {"role": "assistant", "content": r["response"]},
        ]
        out = hf_tok.apply_chat_template(
            msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        labels = [t if m else -100 for t, m in zip(ids, mask, strict=True)]
        rows.append({**r, "input_ids": ids, "labels": labels})
    status, out = check(tmp_path, toks, rows, "--max-length", "64")
    assert (status, out["findings"]) == (0, [])
    # the same rows with the prompt in the loss
    rows[0]["labels"] = list(rows[0]["input_ids"])
    status, out = check(tmp_path, toks, rows)
    d403 = codes(out)["D403"]
    assert status == 1 and d403["data"]["example_ids"] == [0]
    assert "message 0 (system)" in d403["message"]
    # ... and the end-of-turn token left out: both faults, each said
    ids = rows[0]["input_ids"]
    last_eot = max(t for t, x in enumerate(ids) if x == hf_tok.eos_token_id)
    rows[0]["labels"][last_eot] = -100
    found = codes(check(tmp_path, toks, rows)[1])
    assert set(found) == {"D403", "D404"} and found["D404"]["data"]["example_ids"] == [0]


# --- the loss mask ----------------------------------------------------------------------------
def test_generation_block_over_every_turn_puts_the_prompt_in_the_loss(tmp_path, toks):
    everything = (
        "{{ bos_token }}{% for m in messages %}" + ROLE_CHECK + "{% generation %}<|im_start|>"
        "{{ m['role'] }}" + NL + "{{ m['content'] }}<|im_end|>{% endgeneration %}" + NL
        + "{% endfor %}"
    )  # fmt: skip
    status, out = check(tmp_path, toks, CLEAN, template=everything)
    d403 = codes(out)["D403"]
    assert status == 1 and set(codes(out)) == {"D403"}
    assert d403["data"]["example_ids"] == [0, 1, 2]


def test_end_of_turn_outside_the_generation_block_is_found(tmp_path, toks):
    no_eot = chatml("{% generation %}{{ m['content'] }}{% endgeneration %}<|im_end|>")
    status, out = check(tmp_path, toks, CLEAN, template=no_eot)
    d404 = codes(out)["D404"]
    assert status == 1 and set(codes(out)) == {"D404"}
    assert d404["data"]["count"] == 3 and "'<|im_end|>'" in d404["message"]


def test_response_with_nothing_after_it_never_learns_to_stop(tmp_path, toks):
    # prompt + response concatenated, as a naive pipeline does: no end-of-turn token
    rows = [{**CLEAN[2], "text": "<s><|im_start|>user\nwhat is two plus two<|im_end|>\n"
             "<|im_start|>assistant\nthe answer is four"}, CLEAN[0]]  # fmt: skip
    status, out = check(tmp_path, toks, rows)
    found = codes(out)
    assert status == 1 and found["D404"]["data"]["example_ids"] == [0]
    assert "no end-of-turn token follows" in found["D404"]["message"]
    assert found["D401"]["data"]["examples"][0]["training"] == "(end)"


def test_labels_on_every_token_of_a_token_only_row(tmp_path, toks, hf_tok):
    ids = hf_tok.apply_chat_template(CLEAN[0]["messages"], tokenize=False)
    ids = hf_tok(ids, add_special_tokens=False)["input_ids"]
    status, out = check(tmp_path, toks, [{"input_ids": ids, "labels": ids}])
    assert status == 1 and set(codes(out)) == {"D403"}


# --- truncation -------------------------------------------------------------------------------
LONG = conv(("user", "what is two plus two"), ("assistant", " ".join(["the answer is four"] * 8)))
LONG_PROMPT = conv(("user", " ".join(["what is two plus two"] * 12)), ("assistant", "four"))


def test_responses_cut_and_lost_at_max_length(tmp_path, toks):
    rows = [CLEAN[0], LONG, LONG_PROMPT, CLEAN[1]]
    status, out = check(tmp_path, toks, rows, "--max-length", "60", template=TEMPLATE)
    found = codes(out)
    assert status == 1 and set(found) == {"D405", "D406"}
    assert found["D405"]["data"]["example_ids"] == [1]
    assert found["D406"]["data"]["example_ids"] == [2]
    assert found["D405"]["data"]["share"] == 0.25
    assert out["stats"]["cut"] == 1 and out["stats"]["no_response"] == 1
    # long enough for all: nothing
    status, out = check(tmp_path, toks, rows, "--max-length", "200", template=TEMPLATE)
    assert (status, out["findings"]) == (0, [])


def test_input_ids_cut_before_training_count_as_truncation(tmp_path, toks, hf_tok):
    text = hf_tok.apply_chat_template(LONG["messages"], tokenize=False)
    ids = hf_tok(text, add_special_tokens=False)["input_ids"]
    status, out = check(tmp_path, toks, [{**LONG, "input_ids": ids[:20]}])
    found = codes(out)
    assert status == 0 and set(found) == {"D405"}, found
    assert "input_ids end at 20" in found["D405"]["message"]


# --- structure --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("row", "code", "says"),
    [
        (conv(("assistant", "four"), ("user", "what is two plus two"), ("assistant", "four")),
         "D407", "starts with a assistant turn"),
        (conv(("user", "hello"), ("user", "how are you"), ("assistant", "fine")),
         "D407", "a user turn follows a user turn"),
        (conv(("user", "hello"), ("assistant", "fine"), ("user", "how are you")),
         "D407", "ends with a user turn"),
        (conv(("user", "hello"), ("assistant", "   ")), "D408", "message 1 (assistant) is empty"),
        (conv(("system", SYSTEM), ("system", SYSTEM), ("user", "hello"), ("assistant", "fine")),
         "D409", "2 system messages"),
        (conv(("system", SYSTEM), ("user", SYSTEM + " hello"), ("assistant", "fine")),
         "D409", "repeated inside message 1 (user)"),
        (conv(("human", "hello"), ("assistant", "fine")), "D411", "'human'"),
    ],
)  # fmt: skip
def test_structure_faults(tmp_path, toks, row, code, says):
    status, out = check(tmp_path, toks, [CLEAN[0], row], template=TEMPLATE)
    found = codes(out)
    assert code in found, found
    assert found[code]["data"]["example_ids"] == [1]
    assert says in found[code]["message"]
    assert status == (1 if found[code]["severity"] == "error" else 0)
    if code == "D411":  # the order of unknown roles is unknowable: said once, by D411
        assert "D407" not in found


def test_doubled_bos_from_a_text_column_tokenized_with_special_tokens(tmp_path, toks, hf_tok):
    text = hf_tok.apply_chat_template(CLEAN[0]["messages"], tokenize=False)
    rows = [{**CLEAN[0], "text": text}]
    status, out = check(tmp_path, toks, rows, tok="bos")  # this tokenizer adds BOS itself
    found = codes(out)
    assert status == 1 and "D410" in found
    assert "BOS twice at tokens 0 and 1" in found["D410"]["message"]
    status, out = check(tmp_path, toks, rows, tok="plain")  # the same text, no BOS added
    assert (status, out["findings"]) == (0, [])


def test_doubled_eos_in_input_ids(tmp_path, toks, hf_tok):
    text = hf_tok.apply_chat_template(CLEAN[0]["messages"], tokenize=False)
    ids = hf_tok(text, add_special_tokens=False)["input_ids"] + [hf_tok.eos_token_id]
    status, out = check(tmp_path, toks, [{"input_ids": ids}])
    found = codes(out)
    assert status == 1 and set(found) == {"D410"} and "EOS twice" in found["D410"]["message"]


def test_training_template_that_fails_on_an_example(tmp_path, toks):
    """A template error that is not raise_exception (a TypeError in the user's Jinja) is a
    finding on that example, not a traceback."""
    adds = TEMPLATE.replace(
        "{{ m['content'] }}<|im_end|>{% endif %}",
        "{{ m['content'] + m.get('n', '') }}<|im_end|>{% endif %}",
    )
    rows = [
        CLEAN[0],
        {
            "messages": [
                {"role": "user", "content": "hi", "n": 2},
                {"role": "assistant", "content": "four"},
            ]
        },
    ]
    status, out = check(tmp_path, toks, rows, template=adds)
    d414 = codes(out)["D414"]
    assert status == 1 and d414["data"]["example_ids"] == [1]
    assert "TypeError" in d414["message"] and "--template" in d414["message"]


def test_template_that_refuses_an_example(tmp_path, toks):
    status, out = check(tmp_path, toks, [CLEAN[0], conv(("bot", "hi"), ("user", "hello"))])
    found = codes(out)
    assert status == 1 and found["D414"]["data"]["example_ids"] == [1]
    assert "unknown role bot" in found["D414"]["message"]
    assert found["D411"]["data"]["example_ids"] == [1]


# --- packing ----------------------------------------------------------------------------------
@pytest.fixture()
def two_docs(hf_tok) -> tuple[list[int], int]:
    """Two rendered examples packed into one row, and where the second starts."""
    docs = [
        hf_tok(hf_tok.apply_chat_template(r["messages"], tokenize=False), add_special_tokens=False)[
            "input_ids"
        ]
        for r in CLEAN[:2]
    ]
    return docs[0] + docs[1], len(docs[0])


def test_packed_row_without_mask_or_position_reset(tmp_path, toks, two_docs):
    ids, start = two_docs
    status, out = check(tmp_path, toks, [{"input_ids": ids}])
    found = codes(out)
    assert status == 1 and set(found) == {"D412"}
    assert f"documents start at tokens [{start}]" in found["D412"]["message"]
    positions = list(range(len(ids)))
    status, out = check(tmp_path, toks, [{"input_ids": ids, "position_ids": positions}])
    assert f"position {start} at token {start}" in codes(out)["D412"]["message"]


def test_packed_row_with_position_reset_passes(tmp_path, toks, two_docs):
    ids, start = two_docs
    positions = list(range(start)) + list(range(len(ids) - start))
    status, out = check(tmp_path, toks, [{"input_ids": ids, "position_ids": positions}])
    assert (status, codes(out)) == (0, {})
    assert out["stats"]["packed"] == 1
    # declared lengths (TRL's padding-free packing) separate the documents too
    row = {"input_ids": ids, "seq_lengths": [start, len(ids) - start]}
    assert codes(check(tmp_path, toks, [row])[1]) == {}


def test_packed_row_masked_but_positions_running_on(tmp_path, toks, two_docs):
    ids, start = two_docs
    segments = [1] * start + [2] * (len(ids) - start)
    row = {"input_ids": ids, "attention_mask": segments, "position_ids": list(range(len(ids)))}
    status, out = check(tmp_path, toks, [row])
    found = codes(out)
    assert status == 0 and set(found) == {"D413"}


def test_declared_packed_row_with_nothing_separating(tmp_path, toks, hf_tok):
    ids = hf_tok("what is two plus two four", add_special_tokens=False)["input_ids"]
    status, out = check(tmp_path, toks, [{"input_ids": ids * 2, "packed": True}])
    assert status == 1 and set(codes(out)) == {"D412"}


# --- a Trainer's dataset and collator ---------------------------------------------------------
def _tokenized(hf_tok, rows=CLEAN[:2]) -> list[dict]:
    """Rows as an SFT pipeline leaves them: ids and labels on the assistant's tokens only."""
    out = []
    for r in rows:
        enc = hf_tok.apply_chat_template(
            r["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ids = list(enc["input_ids"])
        labels = [t if m else -100 for t, m in zip(ids, enc["assistant_masks"], strict=True)]
        out.append({"messages": r["messages"], "input_ids": ids, "labels": labels})
    return out


def test_dataset_preflight_with_the_collators_labels(hf_tok):
    from transformers import DataCollatorForLanguageModeling, DataCollatorForSeq2Seq

    data = _tokenized(hf_tok) * 3
    assert check_chat_dataset(data, hf_tok, collator=DataCollatorForSeq2Seq(hf_tok)) == []
    # the language-modelling collator labels every token: the prompt is learned too
    unlabeled = [{k: r[k] for k in ("messages", "input_ids")} for r in data]
    lm = DataCollatorForLanguageModeling(hf_tok, mlm=False)
    found = check_chat_dataset(unlabeled, hf_tok, collator=lm)
    assert [f.code for f in found] == ["D403"]
    assert found[0].data["example_ids"] == [0, 1, 2, 3, 4, 5]


def test_dataset_preflight_reads_an_iterable_dataset(hf_tok):
    data = _tokenized(hf_tok)
    data[1]["labels"] = list(data[1]["input_ids"])  # the prompt in the loss
    found = check_chat_dataset(iter(data), hf_tok)
    assert [(f.code, f.data["example_ids"]) for f in found] == [("D403", [1])]


def test_dataset_preflight_says_when_the_collator_cannot_be_checked(hf_tok):
    def broken(features):
        raise RuntimeError("needs a column this dataset lacks")

    found = check_chat_dataset(_tokenized(hf_tok), hf_tok, collator=broken)
    assert [f.code for f in found] == ["D402"] and "lacks" in found[0].message


def test_dataset_preflight_unpads_a_collator_without_attention_mask(hf_tok):
    import torch

    def left_pad(features):  # pads on the left and says nothing of it
        n = max(len(f["input_ids"]) for f in features)
        pad = [hf_tok.pad_token_id] * n
        ids = [pad[: n - len(f["input_ids"])] + f["input_ids"] for f in features]
        labels = [[-100] * (n - len(f["labels"])) + f["labels"] for f in features]
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels)}

    assert check_chat_dataset(_tokenized(hf_tok), hf_tok, collator=left_pad) == []


def test_dataset_preflight_sees_a_collators_packing(hf_tok):
    from transformers import DataCollatorWithFlattening

    data = _tokenized(hf_tok) * 2
    assert check_chat_dataset(data, hf_tok, collator=DataCollatorWithFlattening()) == []

    def concatenate(features):  # packs without position ids: examples see each other
        import torch

        ids = [t for f in features for t in f["input_ids"]]
        labels = [t for f in features for t in f["labels"]]
        return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels])}

    found = check_chat_dataset(data, hf_tok, collator=concatenate)
    assert [f.code for f in found] == ["D412"]


def test_guarded_trainer_runs_the_chat_preflight(tmp_path, hf_tok):
    import torch
    import transformers

    from trainguard.errors import PreflightFailed
    from trainguard.guard.core import Guard
    from trainguard.integrations.hf import GuardedTrainer

    def trainer(out: Path, data: list[dict], collator) -> GuardedTrainer:
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=320,
                                         n_positions=64)  # fmt: skip
        args = transformers.TrainingArguments(
            output_dir=str(out), max_steps=1, per_device_train_batch_size=2, report_to=[],
            use_cpu=True, disable_tqdm=True, save_strategy="no",
        )  # fmt: skip
        return GuardedTrainer(
            model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=data,
            processing_class=hf_tok, data_collator=collator, guard=Guard(run_dir=out),
            check_chat={"max_length": 64},
        )  # fmt: skip

    tokens = [{k: r[k] for k in ("input_ids", "labels")} for r in _tokenized(hf_tok)] * 2
    lm = transformers.DataCollatorForLanguageModeling(hf_tok, mlm=False)
    bad = trainer(tmp_path / "bad", [{"input_ids": r["input_ids"]} for r in tokens], lm)
    with pytest.raises(PreflightFailed, match="D403"):
        bad.train()
    assert bad.state.global_step == 0
    assert [f.code for f in bad.chat_findings] == ["D403", "D402"]  # D402: no messages
    assert '"D403"' in (tmp_path / "bad" / "guard.jsonl").read_text()
    good = trainer(tmp_path / "good", tokens, transformers.DataCollatorForSeq2Seq(hf_tok))
    good.train()
    assert good.state.global_step == 1 and [f.code for f in good.chat_findings] == ["D402"]


def test_human_output_shows_user_strings_as_text(tmp_path, toks):
    """A role like "[/b]" is rich markup: the table prints it as it is, never as markup."""
    data = _jsonl(tmp_path / "data.jsonl", [conv(("[/b]", "hi"), ("assistant", "four"))])
    res = CliRunner().invoke(
        app, ["data", "check-chat", str(data), "--tokenizer", str(toks["plain"])]
    )
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 1 and "'[/b]'" in res.output and "D411" in res.output


def test_generation_tags_with_whitespace_control_are_templates_not_errors() -> None:
    """`{%- generation %}` is valid for transformers; it was refused as an unknown tag, and the
    bare words "generation ... endgeneration" in text passed for the tags (found in review)."""
    from trainguard.checks.chat_data.tokenizer import check_template, has_generation_tags

    for tag in ("{%- generation %}", "{% generation -%}", "{%-generation-%}"):
        end = tag.replace("generation", "endgeneration")
        source = f"{{% for m in messages %}}{tag}{{{{ m.content }}}}{end}{{% endfor %}}"
        assert check_template(source, "t", "f") == source
        assert has_generation_tags(source)
    assert not has_generation_tags("{{ 'no generation here, nor endgeneration' }}")
