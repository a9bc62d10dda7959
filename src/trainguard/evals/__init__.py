"""Evaluation first: eval specs, the runner, template lint, canaries, drift (issue 7)."""
