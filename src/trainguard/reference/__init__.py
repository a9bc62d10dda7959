"""Reference curves: a finished run's loss at every step, with its recipe hash, environment and
data identity (`curve.py`), the noise that sets the comparison's band (`noise.py`), recording
one from a run dir (`record.py`) and finding the one a run is compared with (`select.py`).
The in-run comparison is `guard/detectors/reference.py`."""
