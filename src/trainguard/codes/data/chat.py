"""Data codes D401-D429: chat (instruction-tuning) data (`trainguard data check-chat`,
`check_chat_dataset`).
"""

from trainguard.codes import Code, register

_TEMPLATES = "Hugging Face, Chat templates (transformers documentation: apply_chat_template)"
_GEN = (
    "Hugging Face, Chat templates: training with `{% generation %}` and "
    "return_assistant_tokens_mask"
)
_EXAMPLES = (
    "data.example_ids lists the examples (0-based line numbers; the first 50, data.count says "
    "how many); data.examples describes the first five."
)


register(
    Code(
        code="D401",
        title="Training rendering differs from the tokenizer's chat template",
        severity="error",
        catches="Examples whose training token ids (the input_ids or text column, or the "
        "--template file applied to the messages) differ from the tokenizer's chat_template "
        "applied to the same messages: the first differing token, both sides decoded. " + _EXAMPLES,
        why="Serving applies the tokenizer's chat template. A model fine-tuned on another "
        "rendering (other role headers, a missing newline, an extra BOS, other end-of-turn "
        "tokens) meets prompts at inference it never saw in training: it answers worse, runs "
        "on past the turn, or emits the training format's markers.",
        fix="Render the training data with the tokenizer's own chat template "
        "(tokenizer.apply_chat_template), or ship the training template as the tokenizer's "
        "chat_template.",
        false_positives="A template that renders earlier assistant turns differently from the "
        "last one (reasoning stripped from history) differs on multi-turn examples by design.",
        references=(_TEMPLATES,),
        lifecycle="preview",
    ),
    Code(
        code="D402",
        title="A chat-data check could not run",
        severity="info",
        catches="A chat check skipped: examples with no training rendering of their own and no "
        "--template (the rendering is the chat template's, nothing to compare), a tokenizer "
        "without a chat_template, or a Trainer's collator that cannot be called on the dataset.",
        why="A skipped check is not a pass.",
        fix="Give --template FILE (the template the training code renders with), or keep the "
        "training pipeline's text or input_ids in the data.",
        lifecycle="preview",
    ),
    Code(
        code="D403",
        title="Loss on the prompt: labels on system or user tokens",
        severity="error",
        catches="Examples whose labels (the labels column, a collator's, or the template's "
        "{% generation %} marks) cover tokens of a system, user or tool turn; rows without "
        "messages whose labels cover every token. " + _EXAMPLES,
        why="Supervised fine-tuning learns the responses. Training on the prompt spends "
        "capacity on imitating users, and on short answers the prompt's tokens dominate the "
        "loss: a plausible loss curve and a worse assistant.",
        fix="Mask the prompt: labels -100 outside the assistant turns (TRL: "
        "assistant_only_loss or completion_only_loss; a {% generation %} block around the "
        "assistant content in the template).",
        false_positives="Rows that are plain pre-training text (no prompt) labelled on every "
        "token.",
        references=(_GEN,),
        lifecycle="preview",
    ),
    Code(
        code="D404",
        title="The model never learns to stop: end-of-turn token unlabelled or absent",
        severity="error",
        catches="Assistant turns whose content is learned but whose end-of-turn token (the "
        "special token the template puts after the content: EOS, <|im_end|>, <|eot_id|>) has no "
        "label, and renderings where no end-of-turn token follows the last response. " + _EXAMPLES,
        why="A model that never sees the end-of-turn token as a target never predicts it: "
        "generation runs on past the answer into invented user turns until the length limit.",
        fix="Include the end-of-turn token in the assistant's labels (inside the "
        "{% generation %} block); append the EOS token after each response when rendering "
        "prompt/response pairs.",
        false_positives="Templates whose turn ends with an ordinary (non-special) token are not "
        "located, so not checked.",
        references=(_GEN,),
        lifecycle="preview",
    ),
    Code(
        code="D405",
        title="Responses cut at the training length",
        severity="warning",
        catches="Examples longer than --max-length (or whose input_ids stop short of the "
        "rendering) whose response runs past the cut: the share of the data and how many "
        "response tokens each loses. " + _EXAMPLES,
        why="A cut response is learned without its ending: the model learns answers that stop "
        "mid-sentence and never see the end-of-turn token.",
        fix="Raise max_length, drop or split the longest examples, or truncate the prompt "
        "(from the left) instead of the response.",
        lifecycle="preview",
    ),
    Code(
        code="D406",
        title="Examples left with no response to learn",
        severity="error",
        catches="Examples whose prompt alone fills --max-length (no response token before the "
        "cut), or whose labels are all -100. " + _EXAMPLES,
        why="They cost compute and teach nothing; a batch made only of them gives a loss of NaN "
        "(0/0) in many trainers, and their share of the data is silently lost.",
        fix="Filter these examples out, raise max_length, or truncate the prompt instead.",
        lifecycle="preview",
    ),
    Code(
        code="D407",
        title="Conversation roles out of order",
        severity="error",
        catches="Conversations that do not alternate user and assistant turns (tool turns after "
        "an assistant's call), that start with an assistant turn, hold a system message after "
        "the first position, or end without an assistant turn. " + _EXAMPLES,
        why="Templates render such conversations into sequences serving never produces (many "
        "templates raise on them); two user turns in a row train the model to answer a prompt "
        "it was never asked, and a conversation ending on a user turn has nothing to learn.",
        fix="Merge consecutive turns of one role, drop conversations without a response, and "
        "put the system message first.",
        lifecycle="preview",
    ),
    Code(
        code="D408",
        title="Empty turn",
        severity="warning",
        catches="Messages whose content is empty or only whitespace. " + _EXAMPLES,
        why="An empty assistant turn teaches the model to answer with nothing (an end-of-turn "
        "token at once); an empty user turn is a conversion bug upstream.",
        fix="Drop the examples, or fix the conversion that lost the content.",
        false_positives="An empty system message some pipelines add on purpose.",
        lifecycle="preview",
    ),
    Code(
        code="D409",
        title="System prompt duplicated",
        severity="warning",
        catches="Conversations with more than one system message, or whose system prompt "
        "(16 characters or more) is repeated inside another message. " + _EXAMPLES,
        why="The model learns a prompt layout serving never sends (the system prompt twice), "
        "and the repeated text takes context length from the conversation.",
        fix="Keep one system message, first; do not also prepend it to the user's turn.",
        lifecycle="preview",
    ),
    Code(
        code="D410",
        title="Doubled BOS or EOS token",
        severity="error",
        catches="Training token ids with BOS or EOS twice in a row: typically a template that "
        "writes the BOS token and a tokenizer that adds another when the text is tokenized "
        "with special tokens, or an EOS appended after a template's own. " + _EXAMPLES,
        why="Serving produces one BOS: every training example starts in a state the model never "
        "meets at inference, and a doubled EOS teaches it to emit EOS after EOS.",
        fix="Tokenize rendered chat text with add_special_tokens=False (the template already "
        "holds the special tokens), and append EOS only when the template does not.",
        lifecycle="preview",
    ),
    Code(
        code="D411",
        title="Unknown role",
        severity="error",
        catches="Messages whose role is none of system, user, assistant, tool (ShareGPT's "
        "human/gpt, 'bot', a typo). " + _EXAMPLES,
        why="Templates render unknown roles as they are (a header serving never produces) or "
        "raise; the turn's loss masking is then undefined.",
        fix="Map the roles to system, user, assistant and tool before training.",
        false_positives="A template made for other role names (then map them, or extend it).",
        lifecycle="preview",
    ),
    Code(
        code="D412",
        title="Packed examples attend across their boundaries",
        severity="error",
        catches="Rows that pack several examples into one sequence (a packed flag, seq_lengths, "
        "segment ids, BOS starting a document again, a collator seen packing) with neither a "
        "document mask (segment ids, cu_seqlens, a 2-D mask) nor position ids reset to 0 at "
        "each document start. " + _EXAMPLES,
        why="Each example attends to the unrelated ones before it and sees positions it never "
        "sees at inference: the model learns to condition on noise, and the effective context "
        "of short examples is polluted.",
        fix="Pack with a document mask (flash-attention varlen through position ids or "
        "cu_seqlens: DataCollatorWithFlattening, TRL padding_free) or reset position_ids at "
        "each example; or do not pack.",
        false_positives="A rendering that uses BOS inside a conversation (rare).",
        references=(
            "Krell et al. 2021, Efficient Sequence Packing without Cross-contamination "
            "(arXiv:2107.02027)",
        ),
        lifecycle="preview",
    ),
    Code(
        code="D413",
        title="Packed examples masked, but positions run on",
        severity="warning",
        catches="Packed rows whose document mask separates the examples but whose position ids "
        "continue across them (no reset at a document start). " + _EXAMPLES,
        why="Later examples in a row train at positions they never occupy at inference (a "
        "response at position 1500 instead of 40), a train/serve mismatch for rotary and "
        "learned position embeddings.",
        fix="Reset position_ids to 0 at each example's first token.",
        lifecycle="preview",
    ),
    Code(
        code="D414",
        title="A chat template refuses the example",
        severity="error",
        catches="Examples for which the tokenizer's chat template (or the --template file) "
        "raises (its raise_exception, an undefined value), with the template's message. "
        + _EXAMPLES,
        why="Serving cannot render such a conversation, or the training pipeline drops or "
        "crashes on it.",
        fix="Fix the examples the message names (roles, alternation, missing fields), or the "
        "template.",
        lifecycle="preview",
    ),
)
