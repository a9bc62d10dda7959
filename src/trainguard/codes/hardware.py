"""Hardware and environment codes (H1xx single process; H2xx multi-process). Never renumber."""

from trainguard.codes import Code, register

register(
    Code(
        code="H101",
        title="Software drift on resume or against the reference",
        severity="warning",
        catches="A run resumed under different software than wrote its checkpoint, or a run "
        "that departs from its reference curve (R501, R502) under different software than "
        "the reference's: Python, torch, numpy, CUDA, cuDNN, NCCL, the GPU driver, trainguard, "
        "the platform, the device or the project's git revision changed (each listed with its "
        "old and new value; CUDA, cuDNN, NCCL and the driver are None on CPU).",
        why="Kernels, defaults and numerics change between versions; a resumed run is then no "
        "longer the run that was planned, and bitwise reproducibility is lost without any error. "
        "Next to a departure from the reference it names the likely cause.",
        fix="Resume (or rerun) with the environment recorded in the checkpoint's env.json or the "
        "reference's env, or accept the drift knowingly and note it in the run log.",
        false_positives="A git revision change that touches only docs or tests.",
        references=("OLMo-core: environment logging per checkpoint",),
    ),
)
