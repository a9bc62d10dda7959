"""Detectors: `update(step, metrics) -> list[Finding]`, one failure per module."""
