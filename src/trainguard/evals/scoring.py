"""Model-side primitives of evaluation: encoding, log-likelihoods, greedy decoding.

Shared by the runner, the lint (which must see exactly the tokens the runner scores) and the
lm-evaluation-harness adapter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer


def bos_ids(tokenizer: Tokenizer, bos: str | None) -> list[int]:
    """The document-start prefix: [id of `bos`], or [] when none is set or it is not a token."""
    if bos is None:
        return []
    ident = tokenizer.token_to_id(bos)
    return [] if ident is None else [ident]


def encode_context(tokenizer: Tokenizer, bos: str | None, context: str) -> list[int]:
    # add_special_tokens=True: a post-processor that adds its own BOS shows up here, which is
    # what lets the lint see a doubled BOS.
    return bos_ids(tokenizer, bos) + tokenizer.encode(context).ids


def encode_continuation(tokenizer: Tokenizer, continuation: str) -> list[int]:
    return tokenizer.encode(continuation, add_special_tokens=False).ids


def model_seq_len(model: torch.nn.Module, default: int = 1024) -> int:
    return int(getattr(model, "seq_len", default))


@torch.no_grad()
def loglikelihoods(
    model: torch.nn.Module,
    requests: Sequence[tuple[list[int], list[int]]],
    *,
    device: str | torch.device = "cpu",
    batch_size: int = 32,
) -> list[tuple[float, bool]]:
    """For each (context ids, continuation ids): (sum of log p(continuation | context), whether
    the continuation is the greedy one). Contexts are cut on the left to fit the model's window.

    Requests are batched by length (longest first) and right-padded: the model is causal, so
    padding after a sequence changes none of its logits.
    """
    seq_len = model_seq_len(model)
    prepared = []
    for ctx, cont in requests:
        if not cont:
            prepared.append(([], 0))
            continue
        full = (ctx + cont)[-(seq_len + 1) :]
        n_cont = min(len(cont), len(full) - 1)  # the first token of a bare sequence is unscored
        prepared.append((full, n_cont))
    out: list[tuple[float, bool]] = [(0.0, True)] * len(requests)
    order = sorted(range(len(requests)), key=lambda i: -len(prepared[i][0]))
    model.eval()
    for start in range(0, len(order), batch_size):
        chunk = [i for i in order[start : start + batch_size] if prepared[i][1] > 0]
        if not chunk:
            continue
        width = max(len(prepared[i][0]) for i in chunk) - 1
        inp = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            full = prepared[i][0]
            inp[row, : len(full) - 1] = torch.tensor(full[:-1])
        logp = F.log_softmax(model(inp.to(device)).float(), dim=-1).cpu()  # (B, T, V)
        for row, i in enumerate(chunk):
            full, n = prepared[i]
            pos = torch.arange(len(full) - 1 - n, len(full) - 1)
            target = torch.tensor(full[-n:])
            lp = logp[row, pos]  # (n, V)
            total = lp.gather(1, target[:, None]).sum().item()  # host sync: eval only
            greedy = bool((lp.argmax(dim=1) == target).all())
            out[i] = (total, greedy)
    return out


@torch.no_grad()
def greedy_generate(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    prompts: Sequence[list[int]],
    *,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    stop_ids: Sequence[int] = (),
    device: str | torch.device = "cpu",
) -> list[str]:
    """Greedy continuations of each prompt, cut at the first stop string or stop token.

    No KV cache: the reference GPT recomputes the window each step, which is fine for the
    short answers evals decode.
    """
    seq_len = model_seq_len(model)
    model.eval()
    outs: list[str] = []
    for prompt in prompts:
        ids = list(prompt) or list(stop_ids[:1]) or [0]
        new: list[int] = []
        for _ in range(max_new_tokens):
            window = torch.tensor([(ids + new)[-seq_len:]], dtype=torch.long, device=device)
            nxt = int(model(window)[0, -1].argmax().item())  # host sync: decoding needs it
            if nxt in stop_ids:
                break
            new.append(nxt)
            text = tokenizer.decode(new)
            if any(s and s in text for s in stop):
                break
        text = tokenizer.decode(new)
        for s in stop:
            if s and s in text:
                text = text[: text.index(s)]
        outs.append(text)
    return outs


@torch.no_grad()
def sum_nll_bits(
    model: torch.nn.Module, ids: list[int], *, device: str | torch.device = "cpu"
) -> tuple[float, int]:
    """(bits to encode ids[1:] given their prefix, tokens scored), in windows of seq_len + 1
    that overlap by one token (the window's first token conditions only)."""
    seq_len = model_seq_len(model)
    total, count = 0.0, 0
    model.eval()
    for start in range(0, max(len(ids) - 1, 0), seq_len):
        window = ids[start : start + seq_len + 1]
        if len(window) < 2:
            break
        x = torch.tensor([window[:-1]], dtype=torch.long, device=device)
        y = torch.tensor(window[1:], dtype=torch.long)
        logp = F.log_softmax(model(x).float(), dim=-1)[0].cpu()  # (T, V)
        total -= logp.gather(1, y[:, None]).sum().item()  # host sync: eval only
        count += len(y)
    return total / math.log(2), count
