"""`data ablate`: does a data filter make a small model better on the use case, worse, or
neither? Held-out set carved once from the base data (`heldout.py`), the runs driven through
`scaling.grid.run_grid` with an injected runner (`run.py`), effects across seeds (`stats.py`),
and their plot (`plot.py`)."""
