"""The tokenizer and templates `data check-chat` compares: a Hugging Face tokenizer folder
loaded locally (never downloaded) and an optional training-side Jinja template file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainguard.errors import BadInputError
from trainguard.util.inputs import read_text

TOKENIZER_FIX = (
    "give --tokenizer the folder `save_pretrained` wrote: tokenizer.json and "
    "tokenizer_config.json (with its chat_template)"
)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise BadInputError(
            "data check-chat needs the transformers package to apply chat templates",
            "pip install 'trainguard[hf]'",
        ) from None
    return transformers


def load_chat_tokenizer(folder: str | Path) -> Any:
    """A `PreTrainedTokenizerFast` from `folder`'s files only (local_files_only: nothing is
    downloaded; no remote code is run, whatever the config's auto_map says)."""
    folder = Path(folder)
    if not folder.exists():
        raise BadInputError(f"tokenizer folder {folder} does not exist", TOKENIZER_FIX)
    if not folder.is_dir():
        raise BadInputError(f"--tokenizer {folder} is a file, not a folder", TOKENIZER_FIX)
    if not (folder / "tokenizer.json").is_file():
        raise BadInputError(
            f"tokenizer folder {folder} has no tokenizer.json (a slow, sentencepiece-only "
            "tokenizer is not supported)",
            TOKENIZER_FIX,
        )
    config = folder / "tokenizer_config.json"
    if config.exists():
        try:
            json.loads(read_text(config, "tokenizer config", TOKENIZER_FIX))
        except ValueError as e:
            raise BadInputError(f"{config} is not valid JSON ({e})", TOKENIZER_FIX) from None
    fast = _transformers().PreTrainedTokenizerFast
    try:
        return fast.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # a broken file: transformers raises many kinds
        raise BadInputError(
            f"cannot load the tokenizer in {folder}: {type(e).__name__}: {e}", TOKENIZER_FIX
        ) from None


def template_source(tokenizer: Any) -> str | None:
    """The tokenizer's chat template (the default one of a named set), or None."""
    tmpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tmpl, dict):
        tmpl = tmpl.get("default") or next(iter(tmpl.values()), None)
    return tmpl if isinstance(tmpl, str) and tmpl.strip() else None


# `{% generation %}` ... `{% endgeneration %}`, with Jinja's whitespace control on either side.
_GENERATION_TAG = re.compile(r"\{%-?\s*(end)?generation\s*-?%\}")


def check_template(source: str, what: str, fix: str) -> str:
    """`source` if it compiles as a Jinja template; BadInputError naming the line otherwise."""
    from jinja2 import TemplateSyntaxError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=[loopcontrols])
    # transformers adds a `{% generation %}` tag; parse it as a plain block to check syntax.
    probe = _GENERATION_TAG.sub(lambda m: "{% endif %}" if m[1] else "{% if true %}", source)
    try:
        env.parse(probe)
    except TemplateSyntaxError as e:
        raise BadInputError(
            f"{what} is not a valid Jinja template (line {e.lineno}: {e})", fix
        ) from None
    return source


def read_template(path: str | Path) -> str:
    fix = "give --template the Jinja chat template your training code renders with"
    text = read_text(path, "--template", fix)
    if not text.strip():
        raise BadInputError(f"--template {path} is empty", fix)
    return check_template(text, f"--template {path}", fix)


def has_generation_tags(source: str) -> bool:
    """Whether the template marks assistant tokens (`{% generation %}`), from which
    transformers derives the assistant mask (`return_assistant_tokens_mask`)."""
    tags = {bool(m[1]) for m in _GENERATION_TAG.finditer(source)}
    return tags == {False, True}
