"""Under-trained token indicator on trained embeddings ("Fishing for Magikarp", Land and
Bartolo 2024), code T110.

Tokens that never occur in training receive no gradient through the input embedding, and
through a tied or separate unembedding only the push-down that every non-target token gets:
their rows drift together in one direction. Land and Bartolo remove the first principal
component (a direction shared by all rows) and rank tokens by the cosine similarity of their row
to the mean row of tokens known to be unused; tokens close to that mean are under-trained
candidates. Without known-unused tokens we fall back to rows whose norm is a robust low outlier
(untrained rows keep their small initial scale while trained ones grow).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainguard.errors import BadInputError
from trainguard.findings import Finding

if TYPE_CHECKING:
    import torch

EMBEDDING_KEYS = (
    "tok_emb.weight",
    "transformer.wte.weight",
    "wte.weight",
    "model.embed_tokens.weight",
    "embed_tokens.weight",
    "embeddings.word_embeddings.weight",
    "lm_head.weight",
)


class UnreadableWeights(BadInputError):
    """The file is not a readable safetensors file (truncated, damaged, something else)."""


def load_embedding(checkpoint: str | Path, key: str | None = None) -> tuple[np.ndarray, str]:
    """(weight as float64 (V, d), key) from a model.safetensors file or a folder holding one.

    The file is read as is: for a trainguard checkpoint, verify it first
    (`checkpoint.target.open_checkpoint`, as `check-tokenizer --checkpoint` does)."""
    path = Path(checkpoint)
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise BadInputError(
            f"no safetensors checkpoint at {path}",
            "give a model.safetensors file or a checkpoint folder (step-<N>/) holding one",
        )
    try:
        return _read_embedding(path, key)
    except BadInputError:
        raise
    except Exception as e:  # safetensors' own errors: a damaged header, a short file
        raise UnreadableWeights(
            f"{path} is not a readable safetensors file: {str(e).strip()[:300]}",
            "give an intact model.safetensors (copy it again from its source)",
        ) from None


def _read_embedding(path: Path, key: str | None) -> tuple[np.ndarray, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
        key = _embedding_key(shapes, key, str(path))
        tensor = f.get_tensor(key)
    return _matrix(tensor, key, str(path))


def embedding_from_state(
    state: dict[str, torch.Tensor], key: str | None, where: str
) -> tuple[np.ndarray, str]:
    """(weight as float64 (V, d), key) from a module's state dict (a checkpoint's "model",
    `checkpoint.read.read_module_state`); `where` names it in messages."""
    key = _embedding_key({k: list(t.shape) for k, t in state.items()}, key, where)
    return _matrix(state[key], key, where)


def _embedding_key(shapes: dict[str, list[int]], key: str | None, where: str) -> str:
    if key is None:
        key = next((k for k in EMBEDDING_KEYS if k in shapes), None)
        if key is None:
            key = next((k for k in shapes if k.endswith(("emb.weight", "embedding.weight"))), None)
    if key is None or key not in shapes:
        matrices = [k for k, shape in shapes.items() if len(shape) == 2]
        raise BadInputError(
            f"{where} has no embedding matrix {key!r}",
            f"pass --embedding-key with one of the 2-D tensors: {matrices[:20]}",
        )
    return key


def _matrix(tensor: torch.Tensor, key: str, where: str) -> tuple[np.ndarray, str]:
    if tensor.ndim != 2:
        raise BadInputError(f"{key} in {where} is not a matrix", "pass a (vocab, dim) tensor")
    return tensor.detach().float().numpy().astype(np.float64), key


def _remove_first_pc(emb: np.ndarray) -> np.ndarray:
    centered = emb - emb.mean(axis=0)
    # The d x d covariance is cheap even for a 50k vocabulary; its top eigenvector is the PC.
    _, vecs = np.linalg.eigh(centered.T @ centered)
    u = vecs[:, -1]
    return emb - np.outer(emb @ u, u)


def _cosine_scores(reduced: np.ndarray, refs: list[int]) -> tuple[np.ndarray, float]:
    """Each row's cosine with the mean of `refs`, and the references' median cosine: truly
    unused tokens drift together, so they sit close to their own mean (coherence near 1)."""
    mean = reduced[refs].mean(axis=0)
    norms = np.linalg.norm(reduced, axis=1) * max(float(np.linalg.norm(mean)), 1e-30)
    score = reduced @ mean / np.maximum(norms, 1e-30)
    return score, float(np.median(score[refs]))


def undertrained_tokens(
    embedding_weight: Any,
    tokenizer: Any = None,
    reference_ids: Iterable[int] | None = None,
    threshold: float = 0.8,
    z_threshold: float = 4.0,
    exclude_ids: Iterable[int] = (),
    max_list: int = 50,
) -> tuple[list[Finding], dict[str, Any]]:
    """T110 for suspicious rows of a trained (V, d) embedding or unembedding matrix.

    `reference_ids`: tokens known to be unused (unreachable, never seen in the training data);
    a token is suspicious when the cosine of its row (first principal component removed) with
    the references' mean row is at least `threshold`, provided the references themselves form
    a cluster (their median cosine is at least `threshold` too). Without references, the
    lowest-norm rows are tried as references (untrained rows keep a small norm); if they are no
    cluster, rows whose norm lies `z_threshold` robust standard deviations (median absolute
    deviation) below the median are flagged.
    Special tokens of `tokenizer` and `exclude_ids` are never listed.
    """
    emb = np.asarray(
        embedding_weight.detach().float().cpu().numpy()
        if hasattr(embedding_weight, "detach")
        else embedding_weight,
        dtype=np.float64,
    )
    if emb.ndim != 2 or emb.shape[0] < 2:
        raise BadInputError(f"embedding must be a (vocab, dim) matrix, got {emb.shape}", "")
    vocab = emb.shape[0]
    skip = set(exclude_ids)
    if tokenizer is not None:
        skip |= set(tokenizer.get_added_tokens_decoder())
    refs = sorted({int(i) for i in reference_ids or () if 0 <= int(i) < vocab} - skip)
    reduced = _remove_first_pc(emb)
    stats: dict[str, Any] = {"vocab": vocab, "dim": emb.shape[1], "references": len(refs)}
    method = "cosine to the known-unused tokens' mean (first PC removed)"
    if not refs:
        # No known-unused tokens: try the lowest-norm rows as provisional references. If they
        # form a coherent cluster, they are untrained; otherwise fall back to a norm test.
        norm = np.linalg.norm(reduced, axis=1)
        order = [int(i) for i in np.argsort(norm, kind="stable") if int(i) not in skip]
        refs = order[: max(5, vocab // 100)]
        method = "cosine to the lowest-norm rows' mean (first PC removed)"
    score, coherence = _cosine_scores(reduced, refs)
    stats["reference_coherence"] = round(coherence, 4)
    if coherence >= threshold:
        suspicious = score >= threshold
        stats |= {"method": method, "threshold": threshold}
    elif stats["references"]:
        # The given references are no coherent untrained cluster: closeness to their mean
        # means nothing, so nothing is flagged.
        suspicious = np.zeros(vocab, dtype=bool)
        stats |= {"method": method, "threshold": threshold}
    else:
        norm = np.linalg.norm(reduced, axis=1)
        med = float(np.median(norm))
        mad = 1.4826 * float(np.median(np.abs(norm - med))) or 1e-30
        score = (med - norm) / mad
        suspicious = score >= z_threshold
        stats |= {"method": "robust low-norm outlier", "z_threshold": z_threshold}
    if skip:
        suspicious[[i for i in skip if i < vocab]] = False
    ids = np.flatnonzero(suspicious)
    ids = ids[np.argsort(-score[ids], kind="stable")]
    stats["suspicious"] = len(ids)
    if not len(ids):
        return [], stats

    def name(i: int) -> str | None:
        return tokenizer.id_to_token(i) if tokenizer is not None else None

    listed = [
        {"id": int(i), "token": name(int(i)), "score": round(float(score[i]), 4)}
        for i in ids[:max_list]
    ]
    n_new = len(set(ids.tolist()) - set(refs))
    msg = (
        f"{len(ids)} tokens look under-trained ({n_new} beyond the {len(refs)} known unused), "
        f"e.g. {[d['token'] or d['id'] for d in listed[:8]]}"
    )
    return [Finding.of("T110", msg, data={"tokens": listed, "count": len(ids)})], stats
