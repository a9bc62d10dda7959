"""Checkpoint layer failure codes. Never reuse or renumber a code."""

from trainguard.codes import Code, register

register()
