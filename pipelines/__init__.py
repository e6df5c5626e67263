"""Procedures built from pipelines and training runs (`chain`); the TOML recipes next to this file are data."""
