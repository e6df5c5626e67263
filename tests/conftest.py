"""Project-wide session fixtures.

`tiny_model_dir`: the built-in tiny countdown model, built once per test session with the default (real)
configuration, so the same build serves the quality test and every pipeline/trainer test. A finished build
is also kept in pytest's cache directory under a key of its config and the builder's source, so a second
session reuses it; nothing depends on that cache (delete it, or run with `-p no:cacheprovider`, and the
model is rebuilt into a temporary directory).
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest


def _tiny_build_key() -> str:
    """Changes whenever anything that shapes the built model changes: config, builder code, library versions."""
    import tokenizers
    import torch
    import transformers

    from spo_lake.models import tiny, tiny_data
    from spo_lake.tasks import countdown

    digest = hashlib.sha256(tiny.TinyConfig().hash().encode())
    for module in (tiny, tiny_data, countdown):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(f"{torch.__version__} {transformers.__version__} {tokenizers.__version__}".encode())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def tiny_model_dir(request, tmp_path_factory) -> Path:
    from spo_lake.models.tiny import build_tiny_model

    cache = getattr(request.config, "cache", None)
    if cache is None:
        return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    cached = Path(cache.mkdir("spo_lake_tiny")) / _tiny_build_key()
    if not (cached / "tiny_config.json").exists():  # written last by build_tiny_model
        built = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
        staging = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
        shutil.copytree(built, staging)
        shutil.rmtree(cached, ignore_errors=True)
        os.replace(staging, cached)  # atomic: a concurrent session sees either nothing or a whole model
    return cached


@pytest.fixture(scope="module")
def ray_instance():
    """A local 2-CPU Ray instance for one test module, shut down after it."""
    import ray  # a test extra: missing, this fails rather than skips
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
