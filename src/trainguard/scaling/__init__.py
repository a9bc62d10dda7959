"""Scaling laws: gating-run grids, Chinchilla approach-3 fits, the off-track alarm."""

MAX_BOOT = 10_000
"""Bootstrap refits a fit takes at most (`scale fit --boot`, `fit_scaling_law(n_boot=)`): the
refits run as one batch whose memory grows with their number (10,000 on 9 runs peaked at
0.9 GB resident and 27 s of CPU; ten million would ask for 335 GiB), and a 95% band's
percentiles settle long before.
Kept here, free of numpy, so that the CLI can name it in `--boot`'s range."""
