"""The callbacks `trainguard run` is composed of, one file each (see `train/callback.py`)."""
