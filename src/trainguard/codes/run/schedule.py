"""Run codes R620-R629: the learning-rate schedule across resumes."""

from trainguard.codes import Code, register

register(
    Code(
        code="R620",
        title="train.max_steps changed on resume: the LR schedule was extended, not reshaped",
        severity="info",
        catches="A run resumed with another `train.max_steps` than the checkpoint planned. "
        "The schedule keeps its warm-up and cosine decay to the old end and, for a larger "
        "max_steps, appends the segment `train.schedule_on_extend` names (constant or "
        "rewarm); the finding gives both ends and the LR of the checkpoint's step and of the "
        "next.",
        why="A cosine schedule is a function of max_steps: recomputing it for a new max_steps "
        "moves every later step's LR, so a run resumed near its end would jump from the "
        "minimum back to a large LR with nothing logged (a loss spike, or a silently "
        "different run). Keeping the decay and saying what was appended makes the change "
        "explicit and the curve explainable.",
        fix="Nothing, if the extension was meant. Choose `train.schedule_on_extend: rewarm` "
        "to climb back to the peak (continued pre-training) or `constant` to hold the last LR "
        "(fine-tuning the end of a run); start a new run for a different schedule.",
        false_positives="None: it records a change of the recipe.",
        references=(
            "Ibrahim et al. 2024, Simple and Scalable Strategies to Continually Pre-train "
            "Large Language Models (re-warming and re-decaying the LR)",
        ),
    ),
)
