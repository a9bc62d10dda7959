"""The guards of several processes (a gloo group beside the training one)."""
