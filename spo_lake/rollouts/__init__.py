"""Sampling, judging and the rows of both, for every pipeline that samples: the engine (engine.py) and where it
runs (executors.py)."""
