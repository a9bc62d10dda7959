"""Hardware and environment codes (H1xx single process; H2xx multi-process). Never renumber."""

from trainguard.codes import Code, register

register(
    Code(
        code="H101",
        title="Software drift on resume",
        severity="warning",
        catches="A run resumed under different software than wrote its checkpoint: Python, torch, "
        "numpy, trainguard, the platform, the device or the project's git revision changed.",
        why="Kernels, defaults and numerics change between versions; a resumed run is then no "
        "longer the run that was planned, and bitwise reproducibility is lost without any error.",
        fix="Resume with the environment recorded in the checkpoint's env.json, or accept the "
        "drift knowingly and note it in the run log.",
        false_positives="A git revision change that touches only docs or tests.",
        references=("OLMo-core: environment logging per checkpoint",),
    ),
)
