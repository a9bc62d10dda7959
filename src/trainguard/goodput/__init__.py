"""Goodput planning (`trainguard plan`): how much of a fleet's wall time trains the model, and
the checkpoint interval that makes it largest.

`failures` holds the failure model (a per-GPU interruption rate; the default from the Llama 3
405B run), `model` the expected effective training time ratio (ETTR) of a run that saves every
k steps, in closed form, and the intervals of Young and Daly; `simulate` draws the same model's
timeline (failures, restarts, saves in flight) to check it; `measure` reads the costs a
`trainguard run` dir recorded; `plan` puts them together; `plot` draws the curves. The model,
its assumptions and where it stops holding: docs/goodput.md.
"""
