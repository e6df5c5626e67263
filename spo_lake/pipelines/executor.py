"""Where rollouts (sampling, then sandboxed judging of what was sampled) and judging run.

- `local`: in this process, with the model already loaded; judging in threads (each check is a sandboxed
  subprocess).
- `ray`: on Ray — one rollout worker actor per worker, each loading its own copy of the model from the model's path
  (so the path must be readable on every node: a shared directory or a hub name) and judging what it sampled; plain
  judging (`spolake judge`) as Ray tasks. A local Ray instance by default, or the cluster at `address`.

The executor never changes what lands in the lake. Every rollout call carries its own seed, derived by the pipeline
from the call's settings and its first request (spo_lake.pipelines.sample.draw), and a backend's samples depend only
on a call's prompts, settings, seed and the backend's batch size, which the workers copy. So which worker runs a call,
and in which order calls finish, changes only the order rows are committed in. A verdict depends only on its
(problem, response).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spo_lake.errors import InputError
from spo_lake.models.backend import PolicyBackend, SampleResult
from spo_lake.tasks import Problem, SandboxOptions, Verdict
from spo_lake.tasks.judge import CHUNK, judge_many, task_chunks

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class Call:
    """One `sample` call of a backend: one response per prompt, `prompts[i]` at `temperatures[i]`; `problems[i]`
    judges its response."""

    prompts: list[str]
    problems: list[Problem]
    temperatures: list[float]
    top_p: float
    max_new_tokens: int
    seed: int


@dataclass(frozen=True)
class PolicySpec:
    """How another process loads the same backend: path, backend, dtype, device and batch size (the last two
    shape the samples: batches are seeded one by one)."""

    path: str
    model_id: str
    backend: str
    dtype: str
    device: str
    batch_size: int | None

    @classmethod
    def of(cls, model: PolicyBackend) -> PolicySpec:
        backend, dtype = model.precision
        source = model.source or model.model_id
        local = Path(source)  # a worker need not share this process's working directory
        return cls(str(local.resolve()) if local.exists() else source, model.model_id, backend, dtype,
                   str(model.device), getattr(model, "batch_size", None))  # batch_size: the transformers backend's

    def load(self) -> PolicyBackend:
        if self.backend == "transformers":
            from spo_lake.models.backend import TransformersPolicy

            return TransformersPolicy.from_pretrained(self.path, self.device, self.dtype, self.batch_size or 64,
                                                      model_id=self.model_id)
        from spo_lake.models import load_policy

        return load_policy(self.path, backend=self.backend, dtype=self.dtype, model_id=self.model_id)


class RolloutWorker:
    """Runs rollout calls: samples with its model, then judges what it sampled. In this process for `local`; one Ray
    actor each for `ray`, where it loads the model from a PolicySpec."""

    def __init__(self, model: PolicyBackend | PolicySpec, judge_workers: int | None):
        self.model = model.load() if isinstance(model, PolicySpec) else model
        self.judge_workers = judge_workers

    def rollout(self, index: int, call: Call, judge: SandboxOptions | None
                ) -> tuple[int, list[SampleResult], list[Verdict] | None]:
        results = self.model.sample(call.prompts, n=1, temperature=call.temperatures, top_p=call.top_p,
                                    max_new_tokens=call.max_new_tokens, seed=call.seed)
        if judge is None:
            return index, results, None
        pairs = [(problem, r.text) for problem, r in zip(call.problems, results)]
        return index, results, judge_many(pairs, judge, self.judge_workers)


Rollout = tuple[int, list[SampleResult], list[Verdict] | None]  # (index of the call, its results, their verdicts)
OnDone = Callable[[list[int], list[Verdict]], None]


class LocalExecutor:
    def __init__(self, model: PolicyBackend | None, workers: int | None):
        self.model, self.workers = model, workers

    def rollouts(self, calls: Iterable[Call], judge: SandboxOptions | None) -> Iterator[Rollout]:
        """Each call's (index, results, verdicts), in call order."""
        assert self.model is not None  # only an executor that samples is given a model
        worker = RolloutWorker(self.model, self.workers)
        return (worker.rollout(i, call, judge) for i, call in enumerate(calls))

    def judge(self, items: Sequence[tuple[Problem, str]], options: SandboxOptions,
              on_done: OnDone | None = None) -> list[Verdict]:
        return judge_many(items, options, self.workers, on_done)

    def close(self) -> None:
        pass


class RayExecutor:
    """`workers` rollout actors (default: the Ray cluster's CPUs), created on first use; each takes one CPU (one GPU
    when the model is on CUDA) and judges with one sandbox at a time."""

    def __init__(self, model: PolicyBackend | None, workers: int | None, address: str | None):
        try:
            import ray
        except ImportError:
            raise InputError("the ray executor needs Ray: pip install 'spo-lake[ray]'") from None
        self.started = not ray.is_initialized()  # a caller's own instance (a test's, a notebook's) is left running
        if self.started:  # "local" starts a fresh instance rather than joining whatever cluster runs here
            ray.init(address=address or "local", include_dashboard=False, log_to_driver=False)
        self.workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.model = model
        # (Any: Ray types an actor method's .remote only where the method is decorated with Ray's @ray.method)
        self.actors: list[Any] = []

    def rollouts(self, calls: Iterable[Call], judge: SandboxOptions | None) -> Iterator[Rollout]:
        """Each call's (index, results, verdicts), in the order the calls finish."""
        import ray
        from ray.util import ActorPool

        calls = list(calls)
        if calls and not self.actors:
            assert self.model is not None  # only an executor that samples is given a model
            spec = PolicySpec.of(self.model)
            actor = ray.remote(num_cpus=1, num_gpus=int(spec.device.startswith("cuda")))(RolloutWorker)
            self.actors = [actor.remote(spec, 1) for _ in range(self.workers)]
        pool = ActorPool(self.actors)  # hands a call to whichever actor is idle
        return pool.map_unordered(lambda a, job: a.rollout.remote(job[0], job[1], judge), list(enumerate(calls)))

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


@contextmanager
def open_executor(kind: str, model: PolicyBackend | None = None, workers: int | None = None,
                  address: str | None = None) -> Iterator[LocalExecutor | RayExecutor]:
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
