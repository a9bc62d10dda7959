"""Model layer codes (M): a position that sees the future, samples that depend on each
other, train/serve differences, MoE token drops.

M101-M199 pre-flight `check-model`.

A code is never reused or renumbered; a renamed one gets a redirect in `codes/__init__.py`
(REDIRECTS). `docs/codes.md` is generated from these entries.
"""

from trainguard.codes import Code, register

# --- M1xx pre-flight model checks (`check-model`) -------------------------------------------------
register(
    Code(
        code="M101",
        title="Future-token leak: prefix logits change when later tokens change",
        severity="error",
        catches=(
            "Resampling the tokens after a cut point changes the logits of positions before it. "
            "Tested at many cut points spread over the sequence (the last positions included), "
            "in train and in eval mode, with dropout draws pinned; the comparison is exact."
        ),
        why=(
            "A language model trained with teacher forcing that can see later tokens learns to "
            "copy them: the training loss looks fine and generation, which has no future, fails. "
            "Causes: a missing or off-by-one attention mask, sequence packing without document "
            "masks, statistics over time, pooling over the sequence, MoE expert-choice routing or "
            "capacity routing prioritised by router score across the sequence (a token's route "
            "depends on the tokens after it)."
        ),
        fix=(
            "Make every position depend only on itself and earlier positions: use "
            "`F.scaled_dot_product_attention(..., is_causal=True)` or a mask "
            "`torch.triu(ones(T, T), diagonal=1)`, replace expert-choice routing with token-choice "
            "(or dropless) routing, and compute normalisation statistics per position."
        ),
        false_positives=(
            "A model that is nondeterministic outside torch's RNG (Python `random`, numpy, "
            "non-deterministic GPU kernels) can change without a leak; M106 reports that case "
            "and the comparison then allows the measured run-to-run noise."
        ),
        references=(
            "Vaswani et al. 2017, Attention Is All You Need (masked decoder self-attention)",
            "Zhou et al. 2022, Mixture-of-Experts with Expert Choice Routing (not causal)",
        ),
    ),
    Code(
        code="M102",
        title="Gradient leak: a position's logits have a gradient from later positions",
        severity="error",
        catches=(
            "The gradient of the logits at positions before a cut point with respect to the "
            "input embeddings (a hook on the token embedding output) is not exactly zero at "
            "some later position. Reports which later positions feed which earlier ones."
        ),
        why=(
            "A faint, smooth dependence on the future (a tiny mask value, a small pooled term) "
            "may change the logits below rounding, so the perturbation test (M101) misses it, "
            "but training follows the gradient and will amplify it."
        ),
        fix=(
            "Find the layer that mixes positions without a causal mask (attention mask, "
            "convolution padding, pooling, normalisation over time) and make it causal."
        ),
        false_positives=(
            "Hard routing flips (expert choice) have zero gradient and are caught by M101, not "
            "here. Models without an `nn.Embedding` for tokens are skipped (M107)."
        ),
        references=("Vaswani et al. 2017, Attention Is All You Need",),
    ),
    Code(
        code="M103",
        title="Batch dependence: a sample's logits depend on other samples in the batch",
        severity="error",
        catches=(
            "Changing the other sequences of a batch changes a kept sequence's logits "
            "(exact comparison, dropout draws pinned)."
        ),
        why=(
            "Normalisation statistics or MoE routing groups that span the batch make a sample's "
            "output depend on its batch-mates: training and serving (other batch sizes and "
            "mixes) disagree, and in train mode information leaks between samples."
        ),
        fix=(
            "Use per-sample normalisation (LayerNorm/RMSNorm instead of BatchNorm) and route MoE "
            "tokens per sequence or without capacity limits shared across the batch."
        ),
        false_positives=(
            "Capacity-limited MoE routing whose capacity is shared by the batch is batch-"
            "dependent by design; accept it only if serving uses the same batching."
        ),
        references=("Ioffe and Szegedy 2015, Batch Normalization",),
    ),
    Code(
        code="M104",
        title="Train/serve mismatch: teacher-forced logits differ from prefix-only logits",
        severity="error",
        catches=(
            "The logits of a full teacher-forced forward differ, at some position, from those "
            "of a forward on the prefix ending at that position (what generation computes). "
            "Allowed difference: 1e-4 of the largest logit (kernels may block differently for "
            "different lengths)."
        ),
        why=(
            "The model is trained on one function and served as another: the validation loss "
            "does not predict generation quality."
        ),
        fix=(
            "Make the forward depend only on the prefix: no statistics or pooling over the "
            "whole sequence, no future-dependent routing, no length-dependent scaling."
        ),
        false_positives=(
            "Models whose numerics depend on the sequence length beyond 1e-4 relative (very low "
            "precision logits) can trip it; models with stochastic layers are checked in eval "
            "mode only (M107 says so)."
        ),
        references=("Press et al. 2022, Train Short, Test Long (length-dependent behaviour)",),
    ),
    Code(
        code="M105",
        title="MoE token drops: capacity limits skip tokens",
        severity="warning",
        catches=(
            "An MoE layer exposing router statistics (`router_stats()` with `tokens_routed` and "
            "`tokens_dropped`) dropped more than 1% of its tokens over a few batches."
        ),
        why=(
            "Dropped tokens skip the expert computation silently: less compute per token than "
            "intended, and a loss that depends on batch composition."
        ),
        fix=(
            "Raise the capacity factor (`model.moe.capacity_factor`), strengthen the load-"
            "balancing loss, or use dropless routing (`model.moe.router=dropless`)."
        ),
        false_positives=(
            "At initialisation routers are often unbalanced; drops may fall as the "
            "load-balancing loss trains. Random token inputs also differ from real text."
        ),
        references=(
            "Fedus et al. 2021, Switch Transformers (capacity factor, token dropping)",
            "Gale et al. 2022, MegaBlocks: Efficient Sparse Training with Mixture-of-Experts",
        ),
    ),
    Code(
        code="M106",
        title="Nondeterministic forward: same input and seed give different logits",
        severity="warning",
        catches=(
            "Two forwards of the same batch with the same torch RNG seed differ, so exact "
            "comparisons are impossible; the checks then tolerate 8x the measured noise."
        ),
        why=(
            "Randomness outside torch's RNG (Python `random`, numpy) or nondeterministic "
            "kernels make runs irreproducible and can hide faint leaks below the noise."
        ),
        fix=(
            "Draw randomness from torch's RNG; on GPU call "
            "`torch.use_deterministic_algorithms(True)` for the check."
        ),
        references=("PyTorch notes: Reproducibility",),
    ),
    Code(
        code="M107",
        title="Model check skipped or limited",
        severity="info",
        catches=(
            "A check could not run in one mode: no token `nn.Embedding` to hook for the "
            "gradient map, or train/serve in train mode with stochastic layers (dropout draws "
            "cannot line up between different lengths)."
        ),
        why="A skipped check is not a pass; this records what was not verified.",
        fix=(
            "Expose the token embedding as an `nn.Embedding`; train/serve consistency is "
            "verified in eval mode, which is what generation uses."
        ),
        false_positives="Informational only.",
    ),
    Code(
        code="M108",
        title="Non-finite logits: the model outputs NaN or infinity",
        severity="error",
        catches=(
            "The reference forward (random token ids, dropout draws pinned) returns logits "
            "that are NaN or infinite, in train or in eval mode. Reports how many, how many are "
            "NaN, and at which positions."
        ),
        why=(
            "A NaN logit gives a NaN loss and NaN gradients on the first step that sees it, so "
            "the run diverges at once or, with skip guards, silently skips batches. It also "
            "blinds the other checks: compared with NaN, every difference is NaN and every "
            "`>` test is False, so a leaky model would pass. The leak checks therefore compare "
            "the finite entries only and this finding fails the check on its own."
        ),
        fix=(
            "Find the operation that produces it: division by a norm or a count that can be 0, "
            "`log` or `sqrt` of 0 or a negative, `-inf` attention masks on a fully masked row "
            "(softmax of all `-inf` is NaN), an uninitialised parameter (`torch.empty`), or an "
            "overflow in fp16. `torch.autograd.set_detect_anomaly(True)` names the operation "
            "in the backward pass; `torch.isfinite` after each block in the forward."
        ),
        false_positives=(
            "None for training: a language model's logits are scored with a softmax, where "
            "one NaN spoils the whole row. A model that masks some vocabulary entries with "
            "`-inf` on purpose is flagged too; use a large negative finite value instead."
        ),
        references=("PyTorch docs: torch.autograd.detect_anomaly",),
    ),
)
