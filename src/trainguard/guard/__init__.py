"""The guard: what judges each step and acts on it, in one package.

    core.py            the public `Guard` and its protocol: judge (host or device path),
                       after_update, settle; its log
    judgement.py       `Judgement` (what judge returns: the update applied, skipped or
                       masked) and `Settled` (what settle did)
    settle.py          acting on a decision in one place: rerun, rollback, halt
    policy.py          findings -> one action, the escalations; where a step is judged
    decision.py        `Decision`, the actions and their order
    state.py, clock.py the Guard's checkpointed state; the step and data-phase clock
    arguments.py       the Guard's constructor arguments, checked
    device.py, masked_step.py
                       the device path: judge on the device, mask the update, read back later
    rerun.py, rollback.py
                       classify a rerun (hardware or data), return to a verified checkpoint
    detectors/         one concern per module: non-finite values, spikes, divergence, waves,
                       zero loss, MoE routers, loader stalls, throughput, stragglers, the
                       reference curve; `monitor_set.py` runs the recipe's set
    distributed/       the guards of several processes: replicas, stragglers, hung and dead
                       ranks, the monitor group and its timeouts (part.py: the Guard's part)
    watchdog.py, hang_report.py, derived_timeouts.py
                       the hang watchdog, the one hang-report writer, timeouts from step times
    config.py          the recipe's `guards` section (floor 1: this file imports nothing else)

This `__init__` imports nothing: loading a recipe imports `guard.config` and must not pull in
torch or the detectors.
"""
