"""The reference file (`trainguard reference record RUN_DIR --out REF.json`): a finished run's
training loss at each of its steps, with what produced it.

```
{"format": "trainguard-reference/2",
 "recipe_name": "default", "recipe_hash": "<16 hex>",
 "recipe": {dotted curve key: value},        # config/identity.py: operational keys left out
 "env": {...},                               # train/envinfo.py's fingerprint of the run
 "single_environment": true,                 # false: the run resumed under other software
 "data_identity": {...} | null,              # tokenizer hash and shard checksums
 "steps": [0, 1, ...], "loss": [...], "batch_hash": [...],   # 0-based step indices

 "evals": [{"step", "val_loss", "val_bpb"}, ...],
 "source": {"run_dir", "recorded_at", "final_step"},
 "checksum": "<xxh3-128 of everything above>"}
```

A reference is untrusted input: it is read as JSON only, its size is bounded, every field is
type-checked, and the checksum (integrity, not authenticity) turns a truncated, damaged or
hand-edited file into a clear refusal instead of a comparison against the wrong numbers.

Format 1 (the previous release) numbered steps from 1, as `trainguard run` logged them then;
it is still read (its checksum verified as written), its steps moved to the 0-based index.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from trainguard.errors import BadInputError
from trainguard.reference.noise import Noise, learn_noise
from trainguard.util.atomic import atomic_write_text
from trainguard.util.hashing import bytes_checksum

FORMAT = "trainguard-reference/2"
FORMAT_1 = "trainguard-reference/1"  # steps from 1: read, converted
MIN_STEPS = 8  # fewer points leave nothing to learn the noise from
MAX_BYTES = 256 * 1024 * 1024  # a million steps take about 100 MB
_RECORD_FIX = "record it again: trainguard reference record RUN_DIR --out REF.json"
# The fields the checksum covers, in file order.
BODY_KEYS = (
    "format",
    "recipe_name",
    "recipe_hash",
    "recipe",
    "env",
    "single_environment",
    "data_identity",
    "steps",
    "loss",
    "batch_hash",
    "evals",
    "source",
)


@dataclass(frozen=True)
class ReferenceCurve:
    recipe_name: str
    recipe_hash: str
    recipe: dict[str, Any]
    env: dict[str, Any]
    steps: list[int]
    loss: list[float]
    batch_hash: list[str | None]
    single_environment: bool = True
    data_identity: dict[str, Any] | None = None
    evals: list[dict[str, Any]] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        """Everything the checksum covers (`BODY_KEYS`), in file order."""
        return {k: FORMAT if k == "format" else getattr(self, k) for k in BODY_KEYS}

    @cached_property
    def checksum(self) -> str:
        """Names this reference: a monitor's saved state belongs to one reference."""
        return _checksum(self.body())

    @cached_property
    def noise(self) -> Noise:
        return learn_noise(self.loss)

    @cached_property
    def index(self) -> dict[int, int]:
        """Step -> position in the lists."""
        return {s: i for i, s in enumerate(self.steps)}

    def to_dict(self) -> dict[str, Any]:
        return {**self.body(), "checksum": self.checksum}

    def save(self, path: str | Path) -> Path:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")
        return Path(path)

    def summary(self) -> dict[str, Any]:
        """What `trainguard recipes` and `reference record` show about a reference."""
        env = self.env
        return {
            "recipe_hash": self.recipe_hash,
            "steps": len(self.steps),
            "final_loss": self.loss[-1],
            "final_val_loss": self.evals[-1].get("val_loss") if self.evals else None,
            "noise_sigma": self.noise.sigma,
            "where": {k: env.get(k) for k in ("device", "cpu", "torch", "python", "cuda")},
            "recorded_at": self.source.get("recorded_at"),
        }


def _checksum(body: dict[str, Any]) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return bytes_checksum(text.encode("utf-8"))


def _problem(path: str, what: str) -> BadInputError:
    return BadInputError(f"reference file {path} {what}", _RECORD_FIX)


def load_reference(path: str | Path) -> ReferenceCurve:
    """The validated reference at `path`; BadInputError (exit 2) naming what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise BadInputError(
            f"reference file {p} does not exist",
            "give a file written by `trainguard reference record RUN_DIR --out REF.json` "
            "(reference.path), or leave reference.path unset",
        )
    if p.stat().st_size > MAX_BYTES:
        raise _problem(str(p), f"is larger than {MAX_BYTES // 2**20} MiB")
    try:
        doc = json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise _problem(str(p), "is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        what = "is truncated" if _unclosed(e.doc) else "is not valid JSON"
        raise _problem(str(p), f"{what} (line {e.lineno}, column {e.colno}: {e.msg})") from None
    return reference_from_dict(doc, str(p))


def _unclosed(text: str) -> bool:
    """True when `text` ends inside a string or with a bracket open: a JSON document cut short
    (empty counts), as opposed to one that is complete but wrong."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
    return in_string or depth > 0 or not text.strip()


def reference_from_dict(doc: Any, origin: str = "reference") -> ReferenceCurve:
    if not isinstance(doc, dict) or doc.get("format") not in (FORMAT, FORMAT_1):
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise _problem(origin, f"is not a trainguard reference (format {got!r}, want {FORMAT!r})")
    expected = {
        "recipe_name": str,
        "recipe_hash": str,
        "recipe": dict,
        "env": dict,
        "single_environment": bool,
        "steps": list,
        "loss": list,
        "batch_hash": list,
        "evals": list,
        "source": dict,
        "checksum": str,
    }
    missing = [k for k in expected if k not in doc]
    if missing:
        raise _problem(origin, f"lacks the field(s) {', '.join(missing)}")
    wrong = [k for k, t in expected.items() if not isinstance(doc[k], t)]
    if doc.get("data_identity") is not None and not isinstance(doc["data_identity"], dict):
        wrong.append("data_identity")
    if wrong:
        raise _problem(origin, f"has field(s) of the wrong type: {', '.join(wrong)}")
    body = {k: doc.get(k) for k in BODY_KEYS}
    if _checksum(body) != doc["checksum"]:
        raise _problem(origin, "was changed or damaged after it was recorded (checksum mismatch)")
    _check_curve(doc, origin)
    if doc["format"] == FORMAT_1:  # logged steps counted from 1; the index counts from 0
        doc = {**doc, "steps": [s - 1 for s in doc["steps"]]}
    return ReferenceCurve(
        recipe_name=doc["recipe_name"],
        recipe_hash=doc["recipe_hash"],
        recipe=doc["recipe"],
        env=doc["env"],
        steps=doc["steps"],
        loss=doc["loss"],
        batch_hash=doc["batch_hash"],
        single_environment=doc["single_environment"],
        data_identity=doc.get("data_identity"),
        evals=doc["evals"],
        source=doc["source"],
    )


def _check_curve(doc: dict[str, Any], origin: str) -> None:
    steps, loss, hashes = doc["steps"], doc["loss"], doc["batch_hash"]
    if not len(steps) == len(loss) == len(hashes):
        raise _problem(
            origin, f"has {len(steps)} steps, {len(loss)} losses and {len(hashes)} batch hashes"
        )
    if len(steps) < MIN_STEPS:
        raise _problem(origin, f"has {len(steps)} steps; a reference needs at least {MIN_STEPS}")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in steps) or any(
        b <= a for a, b in zip(steps, steps[1:], strict=False)
    ):
        raise _problem(origin, "has steps that are not increasing integers")
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in loss) or not all(
        math.isfinite(x) for x in loss
    ):
        raise _problem(origin, "has a loss that is not a finite number")
    if not all(h is None or isinstance(h, str) for h in hashes):
        raise _problem(origin, "has a batch hash that is not a string")
    if not all(isinstance(e, dict) for e in doc["evals"]):
        raise _problem(origin, "has an evaluation that is not an object")
