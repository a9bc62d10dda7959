"""Run codes R701-R709: goodput planning (`trainguard plan`)."""

from trainguard.codes import Code, register

_GOODPUT_DOCS = "docs/goodput.md"


register(
    Code(
        code="R701",
        title="Goodput plan: saves wait for the previous checkpoint write",
        severity="warning",
        catches="At the plan's checkpoint interval, or the one in use now (`--interval`, or "
        "the run's `checkpoint.interval`), writing a checkpoint until it is durable takes "
        "longer than the training between two saves plus the stall, so each save waits for "
        "the previous write: the wait is a stall too, and the plan counts it.",
        why="An asynchronous save hides its write only while the write is shorter than the "
        "interval. Past that, training blocks on every save, and a failure during the longer "
        "write falls back one more checkpoint: a short interval buys nothing.",
        fix="Make the write faster (local disk before object storage, fewer bytes: sharded "
        "saves, no optimizer copy you do not need), or save less often; the plan's interval "
        "already weighs the wait.",
        false_positives="Write times measured on a loaded machine or cold storage overstate "
        "the wait; measure on the fleet's storage.",
        references=(_GOODPUT_DOCS,),
        lifecycle="preview",
    ),
    Code(
        code="R702",
        title="Goodput plan: failures outpace progress (ETTR below one half)",
        severity="warning",
        catches="The expected effective training time ratio at the planned interval and "
        "number of GPUs is below 0.5: the job fails about as often as it can restart and "
        "reach its next durable checkpoint.",
        why="A job's failure rate grows with its GPUs (job MTBF = per-GPU MTBF / N). When "
        "restarts and redone work take most of the wall time, adding GPUs can slow the run.",
        fix="Cut the restart time (warm spares, faster checkpoint load), the stall "
        "(asynchronous saves) and the failure rate (health checks that drain bad hosts), or "
        "run on fewer GPUs until they are cut.",
        false_positives="A pessimistic failure rate: the default is Llama 3 405B's, an early "
        "H100 fleet; give --gpu-mtbf-hours from your own fleet's records.",
        references=(_GOODPUT_DOCS,),
        lifecycle="preview",
    ),
    Code(
        code="R703",
        title="Goodput plan: Young/Daly's interval is not the optimum here",
        severity="info",
        catches="The interval of Young/Daly's first-order formula, sqrt(2 * stall * MTBF), "
        "gives a lower expected ETTR than the best whole number of steps under the full "
        "model (by at least 0.001): the write outlasts Young's interval, or the MTBF is not "
        "large against the stall, the restart and the interval, where the first-order "
        "formula stops holding. The plan gives the model's optimum.",
        why="The first-order formula assumes failures are rare within an interval and that a "
        "save costs only its stall; a checkpoint interval taken from it where those fail "
        "loses goodput.",
        fix="Nothing to do: use the plan's interval_steps (the model's optimum, checked by "
        "the simulation).",
        false_positives="None: it records which formula gave the interval.",
        references=(_GOODPUT_DOCS, "Young 1974; Daly 2006 (optimum checkpoint intervals)"),
        lifecycle="preview",
    ),
)
