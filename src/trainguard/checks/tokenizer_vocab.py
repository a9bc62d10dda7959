"""What each vocabulary entry of an HF tokenizer is, as bytes: the raw material of the audit.

Byte-level BPE (GPT-2 style) stores each byte as a printable character (GPT-2's
`bytes_to_unicode` table: 'Ġ' is the space byte); SentencePiece-style tokenizers use '▁' for
spaces and `<0xNN>` byte-fallback tokens. Anything else is read through the tokenizer's decoder.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from tokenizers import Tokenizer

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character -> byte table (inverse of `bytes_to_unicode`)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _types(node: Any) -> set[str]:
    """Every component type in a (possibly nested Sequence) tokenizer.json section."""
    if not isinstance(node, dict):
        return set()
    found = {node.get("type", "")}
    for key in ("pretokenizers", "decoders", "normalizers"):
        for child in node.get(key) or []:
            found |= _types(child)
    return found


@dataclass
class VocabEntry:
    id: int
    token: str  # the vocabulary string as stored
    raw: bytes | None  # the bytes it stands for; None when unknown
    special: bool  # an added/special token (EOT, BOS, pad ...)
    base: bool  # a single byte (byte-level alphabet or <0xNN> fallback)

    text: str | None = field(init=False)
    """The token's text if its bytes are valid UTF-8 on their own, else None."""

    def __post_init__(self) -> None:
        try:
            self.text = None if self.raw is None else self.raw.decode("utf-8")
        except UnicodeDecodeError:
            self.text = None


@dataclass
class VocabInfo:
    entries: list[VocabEntry]
    byte_level: bool
    model_type: str
    has_normalizer: bool


def _component_types(component: Any) -> set[str]:
    """Types of a tokenizer component, nested Sequences included, without serialising the
    whole tokenizer (its vocabulary and merges make that the slow part on large vocabularies)."""
    if component is None:
        return set()
    name = type(component).__name__
    if name != "Sequence":
        return {name}
    return _types(json.loads(component.__getstate__()))


def read_vocab(tok: Tokenizer) -> VocabInfo:
    """Every vocabulary entry with its bytes and kind."""
    model_type = type(tok.model).__name__
    byte_level = "ByteLevel" in _component_types(tok.decoder) | _component_types(tok.pre_tokenizer)
    added = tok.get_added_tokens_decoder()
    table = byte_decoder()
    vocab = tok.get_vocab(with_added_tokens=True)
    # Byte-level characters -> bytes in C: translate to code points 0-255, encode as Latin-1.
    to_latin1 = str.maketrans({c: chr(b) for c, b in table.items()})
    outside = re.compile("[^" + "".join(re.escape(c) for c in table) + "]")
    entries: list[VocabEntry] = []
    for token, ident in sorted(vocab.items(), key=lambda kv: kv[1]):
        special = ident in added
        raw: bytes | None
        base = False
        if special:
            raw = token.encode("utf-8")
        elif byte_level and not outside.search(token):
            raw = token.translate(to_latin1).encode("latin-1")
            base = len(raw) == 1
        elif m := _BYTE_FALLBACK.match(token):
            raw, base = bytes([int(m.group(1), 16)]), True
        else:
            decoded = tok.decode([ident], skip_special_tokens=False)
            # A lone U+FFFD from the decoder means the token's bytes were not valid UTF-8.
            raw = None if "\ufffd" in decoded and "\ufffd" not in token else decoded.encode()
        entries.append(VocabEntry(ident, token, raw, special, base))
    return VocabInfo(
        entries=entries,
        byte_level=byte_level,
        model_type=model_type,
        has_normalizer=tok.normalizer is not None,
    )
