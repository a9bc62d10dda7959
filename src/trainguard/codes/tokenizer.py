"""Tokenizer layer codes (T).

T101-T199 `check-tokenizer`.

A code is never reused or renumbered; a renamed one gets a redirect in `codes/__init__.py`
(REDIRECTS). `docs/codes.md` is generated from these entries.
"""

from trainguard.codes import Code, register

_MAGIKARP = (
    "Land and Bartolo 2024, Fishing for Magikarp: Automatically Detecting Under-trained Tokens "
    "in Large Language Models (arXiv:2405.05417)"
)
_GPT2 = "Radford et al. 2019, Language Models are Unsupervised Multitask Learners (byte-level BPE)"


# --- T1xx tokenizer (`check-tokenizer`) -----------------------------------------------------------
register(
    Code(
        code="T101",
        title="Undecodable tokens",
        severity="warning",
        catches="Merged vocabulary entries whose bytes are not valid UTF-8 on their own: pieces "
        "of a multi-byte character, or the end of one character fused with the start of "
        "another.",
        why="Decoding such a token alone yields U+FFFD; streaming detokenisation shows garbage, "
        "and tokens that straddle character boundaries are rarely seen in training.",
        fix="Train the tokenizer with a pre-tokenizer that keeps characters whole, or accept "
        "them if your decoder buffers incomplete bytes.",
        false_positives="Intermediate merges of a 3- or 4-byte character (CJK, emoji) in "
        "byte-level BPE are partial by construction and harmless when decoding is buffered. "
        "The 256 single-byte base tokens are never reported.",
        references=(_MAGIKARP, _GPT2),
    ),
    Code(
        code="T102",
        title="Unreachable tokens",
        severity="warning",
        catches="Tokens that encoding their own decoded text never produces: the merge order "
        "builds the same text another way, a normaliser rewrites it, or the pre-tokenizer "
        "splits it.",
        why="An unreachable token never appears in training data, so its embedding stays at "
        "its initial value; if the model ever emits it, the output is erratic.",
        fix="Retrain the tokenizer, or remove the tokens from the vocabulary; at least mask "
        "them out of the output softmax.",
        false_positives="Tokens that only form in context (after a preceding character that "
        "changes the pre-tokenization) are reachable in running text though not alone.",
        references=(_MAGIKARP,),
    ),
    Code(
        code="T103",
        title="Tokens never seen in the training corpus",
        severity="warning",
        catches="Merged vocabulary entries that encoding the training corpus never produces "
        "(for example intermediate BPE merges that are always absorbed by a longer token, or "
        "a tokenizer trained on other data).",
        why="Tokens that never occur get no gradient through the input embedding: they stay "
        "under-trained, like the 'SolidGoldMagikarp' tokens, and derail the model when a "
        "user's text contains them.",
        fix="Train the tokenizer on the training corpus, shrink the vocabulary, or check the "
        "trained model with `check-tokenizer --checkpoint`.",
        false_positives="When the corpus passed is only a sample, rare tokens look unseen.",
        references=(_MAGIKARP,),
    ),
    Code(
        code="T104",
        title="Whitespace fused after punctuation",
        severity="warning",
        catches="Tokens in which whitespace follows punctuation (': ', '.\\n', ', '): the token "
        "boundary depends on whether text continues after the punctuation.",
        why="A prompt that ends in ':' or ': ' tokenizes differently from the same text in "
        "training, where the space was fused into one token: evaluation and generation see "
        "token sequences the model never saw.",
        fix="Use a pre-tokenizer that splits whitespace from punctuation (GPT-2's ByteLevel "
        "regex does), and retrain the tokenizer.",
        false_positives="Tokenizers for code may fuse '):\\n' on purpose; then keep eval "
        "prompts free of trailing whitespace (see `eval lint`).",
        references=(_GPT2,),
    ),
    Code(
        code="T105",
        title="Text does not survive the round trip",
        severity="error",
        catches="decode(encode(text)) differs from text on the corpus sample: a normaliser "
        "(lowercasing, NFKC, accent stripping), an unknown token, or lost whitespace.",
        why="The model trains on text that differs from the data and cannot reproduce the "
        "original: code loses its indentation, numbers change, bits-per-byte is wrong.",
        fix="Use a lossless tokenizer (byte-level BPE, no normaliser) or normalise the corpus "
        "yourself before training so that the round trip is the identity.",
        references=(_GPT2,),
    ),
    Code(
        code="T106",
        title="End-of-text token missing or not atomic",
        severity="error",
        catches="The end-of-text token is not in the vocabulary, or encoding it does not give "
        "one token.",
        why="Documents packed without a separator run into each other: the model learns that "
        "one file continues into another.",
        fix="Add the end-of-text token as a special token when training the tokenizer.",
    ),
    Code(
        code="T107",
        title="Documents not separated by exactly one end-of-text",
        severity="error",
        catches="In a packed sample, two end-of-text tokens in a row (an empty or doubled "
        "separator), or none at all in a sample longer than a document.",
        why="Doubled separators waste positions and teach the model to predict end-of-text "
        "after end-of-text; missing ones fuse documents.",
        fix="Append exactly one end-of-text after every document when packing, and drop "
        "empty documents.",
        false_positives="A packed sample drawn from inside one very long document holds no "
        "separator.",
    ),
    Code(
        code="T108",
        title="BOS/EOS not as the recipe expects",
        severity="error",
        catches="Documents in the packed sample that do not start with the beginning-of-sequence "
        "token when one is expected (or that do when none is), or a missing end-of-sequence "
        "when one is expected.",
        why="Training and inference must frame documents the same way; a missing or doubled "
        "BOS shifts every prediction at the start of a document.",
        fix="Make the packing code and the recipe agree on BOS/EOS; add the token once per "
        "document.",
    ),
    Code(
        code="T109",
        title="Literal end-of-text text becomes the separator",
        severity="error",
        catches="Encoding a document that contains the literal string '<|endoftext|>' yields "
        "the special token.",
        why="Any document quoting the marker (tokenizer code, ML papers) injects a fake "
        "document boundary, and a user can inject it at inference.",
        fix="Encode document text with special tokens treated as text (HF tokenizers: "
        "`tokenizer.encode_special_tokens = True`; trainguard's load_tokenizer does this), and "
        "add the separator by id.",
        references=("OpenAI tiktoken: `allowed_special` / `disallowed_special`",),
    ),
    Code(
        code="T110",
        title="Under-trained tokens in the trained embeddings",
        severity="warning",
        catches="Tokens whose trained embedding rows look untrained: close in direction to "
        "known-unused tokens once the first principal component is removed, or with a norm far "
        "below the rest (Magikarp indicator).",
        why="Under-trained tokens produce erratic outputs (hallucination, refusal to repeat "
        "the token) when they appear in a prompt.",
        fix="Remove or remap the tokens, retrain the tokenizer on the training data, or keep "
        "them out of prompts; verify each suspect by prompting the model to repeat it.",
        false_positives="The indicator ranks candidates; rare but trained tokens can score "
        "high. Verify by prompting, as Land and Bartolo do.",
        references=(_MAGIKARP,),
    ),
)
