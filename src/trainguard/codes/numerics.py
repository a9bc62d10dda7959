"""Numerics layer codes (N): low-precision sums and updates.

N101-N199 `check-precision` and the bf16 run.

A code is never reused or renumbered; a renamed one gets a redirect in `codes/__init__.py`
(REDIRECTS). `docs/codes.md` is generated from these entries.
"""

from trainguard.codes import Code, register

# --- N1xx low-precision numerics (`check-precision`) ----------------------------------------------
register(
    Code(
        code="N101",
        title="Biased reduction: low-precision sums lose small terms systematically",
        severity="error",
        catches=(
            "Gradients of R ranks (a shared signal plus per-rank noise) reduced in the given "
            "dtype and algorithm, regressed on the float64 sum of the same inputs: the slope "
            "differs from 1 by more than 1e-3. Applies to the simulated reduction and to the "
            "real torch.distributed all_reduce."
        ),
        why=(
            "When a running sum is large, rounding to nearest swamps increments below half an "
            "ulp (bf16 keeps 8 significant bits, fp16 11): the reduced gradient is shrunk by "
            "the same factor every step. A bias compounds over steps, unlike noise, which "
            "averages out."
        ),
        fix=(
            "Accumulate in fp32: upcast before the all-reduce (`trainguard.numerics."
            "fp32_accumulate_hook` as a DDP communication hook), keep gradients in fp32, or "
            "use a tree reduction."
        ),
        false_positives=(
            "The slope is fitted on simulated gradients with a realistic magnitude spread; "
            "gradients whose signal is far below their noise fit a noisier slope."
        ),
        references=(
            "Higham 1993, The accuracy of floating point summation",
            "Micikevicius et al. 2018, Mixed Precision Training",
            "Zamirai et al. 2020, Revisiting BFloat16 Training",
        ),
    ),
    Code(
        code="N102",
        title="Noisy reduction: rounding error above the documented bound",
        severity="warning",
        catches=(
            "The residual RMS of the reduced sum around the fitted line, relative to the RMS of "
            "the exact sum, is above 1% (the bound: 1% is well below minibatch gradient noise "
            "but well above what fp32 accumulation gives)."
        ),
        why=(
            "Unbiased rounding noise averages out over steps, but at this size it adds "
            "measurably to gradient noise and hides the signal of small gradient entries."
        ),
        fix="Accumulate the reduction in fp32 or use a tree (pairwise) reduction.",
        false_positives="Harmless when minibatch gradient noise is much larger.",
        references=("Higham 1993, The accuracy of floating point summation",),
    ),
    Code(
        code="N103",
        title="Low-precision gradients differ from fp32 gradients",
        severity="warning",
        catches=(
            "The relative error ||g_lp - g_fp32|| / ||g_fp32|| of some parameter's gradient "
            "under bf16/fp16 autocast exceeds 0.1 (one forward/backward each, same batch)."
        ),
        why=(
            "Gradients that point elsewhere than the fp32 ones mean the model's numerics, not "
            "the data, steer training; sensitive layers (attention logits, norms, the output "
            "head) are the usual culprits."
        ),
        fix=(
            "Keep the sensitive layer in fp32 (exclude it from autocast), use bf16 instead of "
            "fp16, or normalise its inputs (QK-norm for attention logits)."
        ),
        false_positives=(
            "Parameters whose fp32 gradient is near zero have large relative errors that do "
            "not matter; those below 1e-12 in norm are skipped."
        ),
        references=("Micikevicius et al. 2018, Mixed Precision Training",),
    ),
    Code(
        code="N104",
        title="fp16 overflow: activations or gradients beyond 65504",
        severity="error",
        catches=(
            "Some activation or gradient of an fp32 forward/backward exceeds fp16's largest "
            "finite value, so an fp16 run would produce inf."
        ),
        why="Overflow turns into inf and NaN, which spread through the whole model in a step.",
        fix=(
            "Use bf16 (fp32's range), dynamic loss scaling (`torch.amp.GradScaler`) for "
            "gradients, or rescale the overflowing layer."
        ),
        references=("Micikevicius et al. 2018, Mixed Precision Training",),
    ),
    Code(
        code="N105",
        title="fp16 underflow: gradients flush to zero",
        severity="warning",
        catches=(
            "More than 1% of the nonzero gradient entries are smaller than fp16's smallest "
            "subnormal (2^-24), so they become zero in fp16."
        ),
        why="Underflowed gradients stop learning for the affected weights without any error.",
        fix="Use dynamic loss scaling (`torch.amp.GradScaler`) or bf16.",
        references=("Micikevicius et al. 2018, Mixed Precision Training (loss scaling)",),
    ),
    Code(
        code="N106",
        title="Update swallowing: rounding erases parameter updates of low-precision weights",
        severity="warning",
        catches=(
            "With weights stored in bf16/fp16, more than 1% of the parameter updates of an "
            "Adam step at the recipe's learning rate (and at its final, lowest rate) round "
            "back to the old weight."
        ),
        why=(
            "A weight w only moves if the update exceeds half an ulp of w (w * 2^-9 in bf16): "
            "swallowed updates are a bias, the weights with large magnitude (norm gains near "
            "1) stop training."
        ),
        fix=(
            "Keep fp32 master weights (the recipe's `train.precision=bf16` does: autocast with "
            "fp32 weights), or use stochastic rounding or Kahan-compensated updates."
        ),
        false_positives=(
            "Reported as info when the weights are kept in fp32: then it is a what-if."
        ),
        references=(
            "Zamirai et al. 2020, Revisiting BFloat16 Training",
            "Micikevicius et al. 2018, Mixed Precision Training (fp32 master weights)",
        ),
    ),
    Code(
        code="N107",
        title="Precision error grows linearly: a bias that compounds",
        severity="warning",
        catches=(
            "A shadow run of K steps in the candidate precision against float64, from the same "
            "initial weights and data: ||theta - theta_ref|| grows like steps^p with p >= 0.75 "
            "(p near 1: bias that compounds; near 0.5: noise that averages out)."
        ),
        why="A compounding error drives the run to a different model, not a noisier one.",
        fix=(
            "Remove the bias: fp32 master weights or stochastic rounding for updates, fp32 "
            "accumulation for reductions (see N101 and N106)."
        ),
        false_positives=(
            "Chaotic training dynamics amplify any difference; p is then large even for "
            "unbiased noise. Compare against the fp32 candidate in the same run."
        ),
        references=("Zamirai et al. 2020, Revisiting BFloat16 Training",),
    ),
)
