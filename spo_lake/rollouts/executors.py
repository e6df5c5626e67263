"""Where rollouts (sampling, then sandboxed judging of what was sampled) and plain judging run.

- `local`: in this process, with the model already loaded; judging in threads (each check is a sandboxed
  subprocess).
- `ray`: on Ray — one RolloutWorker actor per worker, each loading its own copy of the model from a PolicySpec (so
  the path must be readable on every node: a shared directory or a hub name) and judging what it sampled; plain
  judging (`spolake judge`) as Ray tasks. A local Ray instance by default, or the cluster at `address`.

The executor never changes what lands in the lake. Every call carries its own seed, derived by the caller from the
call's settings and its first prompt, and a backend's samples depend only on a call's prompts, settings, seed and
the backend's batch size, which the workers copy. So which worker runs a call, and in which order calls finish,
changes only the order rows are committed in. A verdict depends only on its (problem, response).

Both executors also take a trainer's policy versions (`load_weights`, on every worker) and score tokens with the
loaded weights (`score`): the trainer's online stream samples through one of them.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from spo_lake.errors import InputError
from spo_lake.rollouts.engine import Call, PolicySpec, Rollout, RolloutWorker
from spo_lake.tasks import Problem, SandboxOptions, Verdict
from spo_lake.tasks.judge import CHUNK, judge_many, task_chunks

if TYPE_CHECKING:  # annotations only: judging alone (`spolake judge`) never loads torch or transformers
    import torch

    from spo_lake.models.backend import PolicyBackend

EXECUTORS = ("local", "ray")

OnDone = Callable[[list[int], list[Verdict]], None]


class LocalExecutor:
    """One RolloutWorker in this process; `workers` sandboxes judge at once."""

    def __init__(self, model: PolicyBackend | None, workers: int | None):
        self.workers = workers
        # (only an executor that samples is given a model: `spolake judge`'s is not)
        self.worker = RolloutWorker(model, workers) if model is not None else None

    def rollouts(self, calls: Iterable[Call], judge: SandboxOptions | None) -> Iterator[tuple[int, list[Rollout]]]:
        """Each call's (index, rollouts), in call order."""
        worker = self.worker
        assert worker is not None
        return (worker.rollout(i, call, judge) for i, call in enumerate(calls))

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        assert self.worker is not None
        self.worker.load_weights(weights)

    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        assert self.worker is not None
        return self.worker.score(prompt_ids, response_ids)

    def judge(self, items: Sequence[tuple[Problem, str]], options: SandboxOptions,
              on_done: OnDone | None = None) -> list[Verdict]:
        return judge_many(items, options, self.workers, on_done)

    def close(self) -> None:
        pass


class RayExecutor:
    """`workers` RolloutWorker actors (default: the Ray cluster's CPUs), created on first use; each takes the
    spec's threads in CPUs (one when unset; one GPU when the model is on CUDA) and judges with `judge_workers`
    sandboxes at a time."""

    def __init__(self, model: PolicyBackend | PolicySpec | None, workers: int | None, address: str | None, *,
                 judge_workers: int = 1):
        if address in (None, "local") and "ray" not in sys.modules:
            # a local instance listens on 127.0.0.1, not on the machine's address (Ray reads this switch, named
            # after the platforms where it is the default, when it is imported; a cluster's address is left alone)
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        try:
            import ray
        except ImportError:
            raise InputError("the ray executor needs Ray: pip install 'spo-lake[ray]'") from None
        self.started = not ray.is_initialized()  # a caller's own instance (a test's, a notebook's) is left running
        if self.started:  # "local" starts a fresh instance rather than joining whatever cluster runs here
            # ray.init replaces the process's SIGTERM handler with sys.exit(15); the process keeps its own (the CLI's
            # stops a verb as Ctrl-C does, exit 143: spo_lake.cli.interrupt)
            sigterm = signal.getsignal(signal.SIGTERM)
            ray.init(address=address or "local", include_dashboard=False, log_to_driver=False)
            if sigterm is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, sigterm)
        self.workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.model, self.judge_workers = model, judge_workers
        # (Any: Ray types an actor method's .remote only where the method is decorated with Ray's @ray.method)
        self.actors: list[Any] = []

    def _actors(self) -> list[Any]:
        import ray

        if not self.actors:
            assert self.model is not None  # only an executor that samples is given a model
            spec = self.model if isinstance(self.model, PolicySpec) else PolicySpec.of(self.model)
            actor = ray.remote(num_cpus=spec.threads or 1, num_gpus=int(spec.device.startswith("cuda")))(RolloutWorker)
            self.actors = [actor.remote(spec, self.judge_workers) for _ in range(self.workers)]
        return self.actors

    def rollouts(self, calls: Iterable[Call], judge: SandboxOptions | None) -> Iterator[tuple[int, list[Rollout]]]:
        """Each call's (index, rollouts), in the order the calls finish."""
        from ray.util import ActorPool

        calls = list(calls)
        if not calls:
            return iter(())
        pool = ActorPool(self._actors())  # hands a call to whichever actor is idle
        return pool.map_unordered(lambda a, job: a.rollout.remote(job[0], job[1], judge), list(enumerate(calls)))

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        import ray

        ray.get([a.load_weights.remote(weights) for a in self._actors()])

    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        import ray

        return ray.get(self._actors()[0].score.remote(prompt_ids, response_ids))

    def judge(self, items: Sequence[tuple[Problem, str]], options: SandboxOptions,
              on_done: OnDone | None = None) -> list[Verdict]:
        """Verdicts in input order; one Ray task per chunk of one task's pairs, sized so every worker gets work."""
        import ray

        remote = ray.remote(num_cpus=1)(judge_many)
        size = max(1, min(CHUNK, math.ceil(len(items) / self.workers)))
        # (ray's typing matches judge_many to its two-argument overload: it ignores parameters with defaults)
        pending = {remote.remote([items[i] for i in chunk], options, 1): chunk  # type: ignore[call-arg]
                   for chunk in task_chunks(items, lambda _: size)}
        out: list[Verdict | None] = [None] * len(items)
        while pending:
            (done,), _ = ray.wait(list(pending), num_returns=1)
            chunk, verdicts = pending.pop(done), ray.get(done)
            for i, v in zip(chunk, verdicts):
                out[i] = v
            if on_done:
                on_done(chunk, verdicts)
        return [v for v in out if v is not None]

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)
        if self.started:
            ray.shutdown()


Executor = LocalExecutor | RayExecutor


@contextmanager
def open_executor(kind: str, model: PolicyBackend | None = None, workers: int | None = None,
                  address: str | None = None) -> Iterator[Executor]:
    """The executor `kind` ('local' or 'ray'); `address` is the Ray cluster's (default: start a local instance)."""
    if kind not in EXECUTORS:
        raise InputError(f"executor {kind!r}: one of {', '.join(EXECUTORS)}")
    if address and kind != "ray":
        raise InputError("a Ray address needs the ray executor")
    executor = LocalExecutor(model, workers) if kind == "local" else RayExecutor(model, workers, address)
    try:
        yield executor
    finally:
        executor.close()
