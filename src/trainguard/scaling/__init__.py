"""Scaling laws: gating-run grids, Chinchilla approach-3 fits, the off-track alarm."""
