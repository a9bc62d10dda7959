"""The guard: what judges each step and acts on it, in one package.

    core.py            the public `Guard`: detectors -> a Decision (apply, skip, rollback,
                       halt), the host and the device path, its log and state
    decision.py        `Decision`, the actions and their order
    arguments.py       the Guard's constructor arguments, checked
    device.py, masked_step.py
                       the device path: judge on the device, mask the update, read back later
    rerun.py, rollback.py
                       rerun a suspect step (hardware or data), return to a verified checkpoint
    detectors/         one concern per module: non-finite values, spikes, divergence, waves,
                       zero loss, MoE routers, loader stalls, throughput, stragglers, the
                       reference curve; `monitor_set.py` runs the recipe's set
    distributed/       the guards of several processes: replicas, stragglers, hung and dead
                       ranks, the monitor group and its timeouts
    watchdog.py, hang_report.py, derived_timeouts.py
                       the hang watchdog, the one hang-report writer, timeouts from step times
    config.py          the recipe's `guards` section (floor 1: this file imports nothing else)

This `__init__` imports nothing: loading a recipe imports `guard.config` and must not pull in
torch or the detectors.
"""
