"""In-run detectors: `update(step, metrics) -> list[Finding]`, `state_dict()` (docs/architecture.md,
convention 5).

One module per detector, named for the failure it catches; `monitor_set.MonitorSet` runs them.
Nothing is imported here: `monitors/config.py` sits on the config floor, and importing it (as
loading a recipe does) must not load the detectors.
"""
