"""Evaluation layer codes (E): does the run optimise what it is for?

E101-E199: E10x evaluation first, E11x eval template lint, E12x metric drift, E13x
canaries, E14x scaling-law fits, E15x off-track alarm, E16x gating-run grids.

A code is never reused or renumbered; a renamed one gets a redirect in `codes/__init__.py`
(REDIRECTS). `docs/codes.md` is generated from these entries.
"""

from trainguard.codes import Code, register

_LM_EVAL = "Gao et al., A framework for few-shot language model evaluation (lm-evaluation-harness)"
_CHINCHILLA = "Hoffmann et al. 2022, Training Compute-Optimal Large Language Models, section 3.3"
_BESIROGLU = "Besiroglu et al. 2024, Chinchilla Scaling: A replication attempt"


# --- E1xx evaluation: evals first, lint, drift, canaries, scaling, off-track ----------------------
register(
    Code(
        code="E101",
        title="no use-case evaluation declared",
        severity="error",
        catches="A recipe whose `evals.specs` holds no spec marked `use_case: true`.",
        why="Without an evaluation of the task the model is for, the run optimises a proxy "
        "(validation loss, leaderboard numbers) and nobody can tell whether it solves the problem.",
        fix="Add a use-case eval to `evals.specs` (the shipped `python_next_line`, or your own "
        "spec with `use_case: true`), or start with `--no-evals` on purpose.",
        false_positives="Exploratory runs where no use case exists yet; use `--no-evals`.",
        references=("Evaluation-first practice in LLM training guides",),
    ),
    Code(
        code="E111",
        title="trailing-space trap in an eval template",
        severity="error",
        catches="A context that ends in whitespace while its continuation begins with whitespace; "
        "a generation prompt ending in whitespace where, with the tokenizer, running text "
        "(prompt + answer) carries the space inside the answer's first token (' Paris'). With "
        "a tokenizer that keeps the space as its own token the prompt needs it, and nothing is "
        "reported. Without a tokenizer a trailing space is a warning: the lint cannot tell.",
        why="The model then scores a double space, or must produce 'Paris' without the leading "
        "space it always saw after such a prefix, so log-likelihoods and generations degrade "
        "into garbage. The Falcon case shows the reverse: a tokenizer that splits the space off "
        "needs the prompt to end in it.",
        fix="Put the separating whitespace on one side only, where the tokenizer puts it: for "
        "GPT-2 style byte-level BPE at the start of the continuation ('Answer:' + ' Paris'); "
        "lint with --tokenizer to see which form the model saw in training. `trainguard run` "
        "reports it as a warning and never stops on it alone.",
        false_positives="Tasks that really are about whitespace (formatters, indentation).",
        references=(
            _LM_EVAL,
            "Hugging Face Open LLM Leaderboard, 'What's going on with the Open LLM Leaderboard?' "
            "(2023): Falcon's scores depended on the prompt's trailing space",
        ),
    ),
    Code(
        code="E112",
        title="token boundary mismatch",
        severity="warning",
        catches="encode(context) + encode(continuation) differs from encode(context + "
        "continuation).",
        why="The scored continuation tokens are not the ones the model would see in running "
        "text, so likelihoods are biased against (or for) some choices.",
        fix="Move the split point to a token boundary (usually: context without trailing "
        "whitespace, continuation starting with a space or newline).",
        false_positives="Some merges across the boundary are unavoidable for a given tokenizer; "
        "the bias is small when all choices are affected alike.",
        references=(_LM_EVAL,),
    ),
    Code(
        code="E113",
        title="BOS (document-start token) missing",
        severity="warning",
        catches="Eval sequences that do not start with the document-start token the model was "
        "trained with (trainguard separates documents with `<|endoftext|>`).",
        why="The model never saw a document begin without it; the first tokens are scored out "
        "of distribution.",
        fix="Set the spec's `bos` to the tokenizer's document-start token (`<|endoftext|>`).",
        false_positives="Models trained without any document separator.",
    ),
    Code(
        code="E114",
        title="BOS doubled",
        severity="error",
        catches="Eval sequences that start with the document-start token twice: the spec adds it "
        "while the text or the tokenizer's post-processor already does.",
        why="A doubled BOS is an input the model never saw in training and shifts every score.",
        fix="Add the start token in one place only: remove it from the text, or set `bos: null` "
        "when the tokenizer's post-processor adds it.",
    ),
    Code(
        code="E115",
        title="empty choice or continuation",
        severity="error",
        catches="A multiple-choice option, generation answer or perplexity text that is empty.",
        why="An empty continuation has log-likelihood 0 (probability 1), so it always wins.",
        fix="Fill in or remove the empty entry in the JSONL data.",
    ),
    Code(
        code="E116",
        title="duplicate choices",
        severity="error",
        catches="Two identical options in one multiple-choice example.",
        why="Ties make accuracy depend on tie-breaking, and a duplicated gold answer counts twice.",
        fix="Remove the duplicate option and fix the gold index.",
    ),
    Code(
        code="E117",
        title="gold index out of range",
        severity="error",
        catches="A multiple-choice gold index that is negative or not below the number of choices.",
        why="The example can never be answered correctly, or crashes scoring.",
        fix="Set `gold` to the 0-based index of the right choice.",
    ),
    Code(
        code="E118",
        title="invalid regular expression answer",
        severity="error",
        catches="A generation example with `match: regex` whose answer is not a valid Python "
        "regular expression (an unbalanced parenthesis or bracket, a dangling `*` or `?`).",
        why="The answer can never be matched: scoring stops with an error, or the task would "
        "report 0 accuracy for a model that answers correctly. `trainguard eval` refuses such "
        "a spec (exit 2) before scoring anything.",
        fix="Fix the pattern (escape literal characters with a backslash or `re.escape`), or "
        "use `match: exact` or `match: contains` for literal answers.",
        references=("Python docs: re, Regular expression syntax",),
    ),
    Code(
        code="E121",
        title="eval metric dropped significantly",
        severity="warning",
        catches="An eval metric worse than its best earlier value by more than chance allows "
        "(one-sided binomial test for accuracies, z-test on per-example means for bits per byte).",
        why="Capabilities can regress while the training loss still falls (overfitting to the "
        "domain mix, a data change, a bad resume).",
        fix="Compare the checkpoints around the drop on the failing examples; check the data "
        "order and mixture near that step.",
        false_positives="At level alpha, about alpha of evaluations of an unchanged model fire by "
        "chance; repeated evals on the same examples are correlated, which makes the test "
        "conservative rather than liberal.",
    ),
    Code(
        code="E131",
        title="canary failed",
        severity="warning",
        catches="A configured canary prompt whose greedy completion lacks the expected substring.",
        why="Canaries pin down facts the model must know (who trained it, a house style); "
        "losing one is an early sign of a data or fine-tuning problem.",
        fix="Check that the canary's facts are in the training data and the prompt matches "
        "their format.",
        false_positives="Small or early models that have not learned the fact yet.",
    ),
    Code(
        code="E141",
        title="scaling-law fit did not converge",
        severity="error",
        catches="No L-BFGS start of the Chinchilla approach-3 fit reached a stationary point.",
        why="An unconverged fit predicts nothing; Besiroglu et al. traced Chinchilla's implausibly "
        "narrow intervals to a fit stopped early.",
        fix="Add gating runs over a wider range of sizes and token budgets; check the CSV for "
        "failed runs (NaN or huge losses).",
        references=(_CHINCHILLA, _BESIROGLU),
    ),
    Code(
        code="E142",
        title="scaling-law fit poorly identified",
        severity="warning",
        catches="Fewer than 10 runs, fewer than 3 distinct model sizes or token budgets, or a "
        "fitted exponent at the edge of its plausible range.",
        why="Five parameters from a handful of points give extrapolations with huge error bars.",
        fix="Add gating runs that vary model size and token budget independently.",
        references=(_BESIROGLU,),
    ),
    Code(
        code="E151",
        title="run above its predicted loss band",
        severity="error",
        catches="A run's validation loss above the scaling-law prediction band for several "
        "consecutive evaluations.",
        why="The big run is not landing where the gating runs said: a bug, a bad hyperparameter "
        "transfer or a data problem is costing compute now.",
        fix="Compare the run's recipe with the gating runs'; check learning rate, data mixture "
        "and the loss curve around where it left the band.",
        false_positives="Mid-run losses under a cosine schedule sit above the final-loss law "
        "until the schedule has decayed; the alarm waits for part of the budget and allows a "
        "margin for that reason.",
        references=(_CHINCHILLA,),
    ),
    Code(
        code="E152",
        title="run below its predicted loss band",
        severity="warning",
        catches="A validation loss far below the scaling-law prediction band.",
        why="Better than predicted is usually too good: validation data leaking into training, "
        "duplicates across the split, or a different tokenizer than the gating runs.",
        fix="Check the train/validation split and deduplication; make sure the gating runs used "
        "the same tokenizer and data.",
    ),
    Code(
        code="E161",
        title="gating run failed",
        severity="error",
        catches="A cell of `scale run`'s grid whose guarded run halted or produced no loss.",
        why="A missing grid point biases the fit towards the configurations that happened to work.",
        fix="Look at that cell's run dir report; fix the cause and rerun `scale run` (finished "
        "cells are skipped).",
    ),
)
