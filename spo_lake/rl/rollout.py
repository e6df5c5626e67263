"""Online rollouts: a worker thread samples with the behaviour policy and judges in the sandbox while the trainer
trains, and a source that hands each step its rollouts and writes them back to the lake.

Determinism despite the thread: the schedule is a function of the step alone. The rollouts of step s use
  - prompts and the temperature ~ U(temperature_min, temperature_max) drawn from a RNG seeded by (seed, s),
  - the sampler seed derived from (seed, s),
  - the weights of policy version `behaviour_version(s)` (the number of optimizer updates behind them),
so they are the same whatever the timing, and a resumed run regenerates exactly what it lost. Under torchrun every
rank generates its own contiguous share of the step's prompts (spo_lake.rl.distributed), and rank 0 writes them all.
"""
from __future__ import annotations

import copy
import dataclasses
import queue
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from spo_lake.lake import Lake, Snapshot
from spo_lake.lake.appender import BufferedAppender
from spo_lake.lake.rows import derive_seed, sampled_id
from spo_lake.models.backend import TransformersPolicy, encode_prompt
from spo_lake.models.tokens import render_prompt, tokenizer_id
from spo_lake.rl.data import LakeStream, fetch_problems, q0_or_nan
from spo_lake.rl.distributed import World
from spo_lake.rl.examples import Example
from spo_lake.rollouts.engine import Call, Rollout
from spo_lake.rollouts.executors import Executor, LocalExecutor
from spo_lake.tasks import SandboxOptions


def behaviour_version(step: int, interval: int, lag: int) -> int:
    """The policy version that generates step `step`'s rollouts: the latest refresh point (a multiple of
    `interval`) at least `lag` steps back. lag 0 + interval 1 is synchronous on-policy; lag 1 lets the rollouts of
    step s+1 be generated while step s trains."""
    return interval * (max(step - lag, 0) // interval)


@dataclass(frozen=True)
class RolloutSchedule:
    seed: int
    prompts_per_step: int
    samples_per_prompt: int
    temperature_min: float
    temperature_max: float
    top_p: float
    max_new_tokens: int
    interval: int
    lag: int
    stop: tuple[str, ...] = ()
    shard: int = 0  # this rank's share of each step's prompts (prompts_per_step each), of `shards`
    shards: int = 1

    def version(self, step: int) -> int:
        return behaviour_version(step, self.interval, self.lag)

    def plan(self, step: int, n_prompts: int) -> tuple[list[int], float, int]:
        """(indices into the prompt list, temperature, sampler seed) of this shard for a step: the step's prompts are
        drawn for all shards at once, and shard 0 samples with the seed a single process uses."""
        rng = random.Random(derive_seed(self.seed, "rollout", step))
        total = self.prompts_per_step * self.shards
        chosen = rng.sample(range(n_prompts), total) if total <= n_prompts else \
            [rng.randrange(n_prompts) for _ in range(total)]
        mine = chosen[self.shard * self.prompts_per_step : (self.shard + 1) * self.prompts_per_step]
        seed = derive_seed(self.seed, "sample", step) if self.shard == 0 else \
            derive_seed(self.seed, "sample", step, self.shard)
        return mine, rng.uniform(self.temperature_min, self.temperature_max), seed


@dataclass
class Rollouts:
    """One step's online rollouts: training examples plus the lake rows that record them, and (GRPO) the lake rows
    injected into their groups."""

    step: int
    version: int
    temperature: float
    examples: list[Example]
    trajectories: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]
    injected: list[Example] = dataclasses.field(default_factory=list)


class PolicyVersions:
    """Weights of the policy versions that rollouts still need, passed from the trainer to the worker.

    Published weights are clones, so the trainer can keep updating its model while the worker samples with them
    (tensors the model ties, e.g. embeddings and LM head, stay one clone). The worker's model uses these very
    tensors, so rollouts cost one copy of the weights per version still needed, and no other.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._weights: dict[int, dict[str, torch.Tensor]] = {}

    def publish(self, version: int, state: dict[str, torch.Tensor]) -> None:
        clones: dict[tuple, torch.Tensor] = {}
        cloned = {k: clones.setdefault((v.data_ptr(), v.shape, v.stride(), v.dtype), v.detach().clone())
                  for k, v in state.items()}
        with self._cond:
            self._weights[version] = cloned
            self._cond.notify_all()

    def wait_for(self, version: int, stop: threading.Event) -> dict[str, torch.Tensor] | None:
        with self._cond:
            while version not in self._weights and not stop.is_set():
                self._cond.wait(timeout=0.1)
            return self._weights.get(version)

    def release_before(self, version: int) -> None:
        with self._cond:
            for v in [v for v in self._weights if v < version]:
                del self._weights[v]

    def state_dict(self) -> dict[int, dict[str, torch.Tensor]]:
        with self._cond:
            return dict(self._weights)


@dataclass
class RolloutSettings:
    """Everything the worker needs besides the model."""

    lake: Lake
    snapshot: str | Snapshot
    prompts: list[tuple[str, int | None, int | None]]  # (prompt_id, q0_n, q0_success), see data.online_prompts
    schedule: RolloutSchedule
    stream_index: int
    beta: float
    algorithm: str  # recorded as the rollouts' `source` in the lake
    run_id: str
    model_id: str
    options: SandboxOptions
    judge_workers: int
    q0_prior: float = 0.0
    # GRPO: the `inject` stream (its own connection and tokenizer, used by the worker thread only) and its rows per
    # group
    inject: LakeStream | None = None
    inject_per_group: int = 0


class RolloutThread(threading.Thread):
    """Generates steps start..end-1 in order into a bounded queue (at most `lag` + 1 steps ahead): plans each step,
    has its executor sample and judge it with the step's policy version, and packages examples and lake rows."""

    def __init__(self, policy: TransformersPolicy, versions: PolicyVersions, settings: RolloutSettings,
                 start: int, end: int, executor: Executor | None = None):
        super().__init__(name="rollout-worker", daemon=True)
        # By default the behaviour policy is a separate module in this process whose weights are the published
        # versions' tensors (loaded with assign=True before the first sample): the trainer updates its own model
        # while this one samples. Until then it shares the trainer's parameters (the memo), so building it copies no
        # weights. The tokenizer is copied too: a fast tokenizer used from two threads at once can fail ("Already
        # borrowed"). Or `executor`, over another backend of the same model (vLLM) or on Ray: it takes each
        # version's weights the same way, so which weights a step uses is the schedule's alone.
        shared = {id(t): t for t in [*policy.model.parameters(), *policy.model.buffers()]}
        self.tokenizer = copy.deepcopy(policy.tokenizer)
        self.executor: Executor = executor or LocalExecutor(TransformersPolicy(
            copy.deepcopy(policy.model, shared), self.tokenizer, policy.model_id), settings.judge_workers)
        self.versions, self.settings, self.start_step, self.end_step = versions, settings, start, end
        self.tok_id = tokenizer_id(policy)
        self.out: queue.Queue = queue.Queue(maxsize=settings.schedule.lag + 1)
        self.stop_event = threading.Event()
        self.loaded = -1

    def run(self) -> None:
        con = self.settings.lake.connect(self.settings.snapshot)
        try:
            for step in range(self.start_step, self.end_step):
                rollouts = self._generate(con, step)
                if rollouts is None or not self._put(rollouts):
                    return
        except BaseException as exc:  # the trainer re-raises it when it asks for the next step
            self._put(exc)
        finally:
            con.close()

    def _put(self, item: Any) -> bool:
        while not self.stop_event.is_set():
            try:
                self.out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _generate(self, con, step: int) -> Rollouts | None:
        s = self.settings
        version = s.schedule.version(step)
        weights = self.versions.wait_for(version, self.stop_event)
        if weights is None:
            return None
        if version != self.loaded:
            self.executor.load_weights(weights)
            self.loaded = version
        chosen, temperature, sample_seed = s.schedule.plan(step, len(s.prompts))
        entries = [s.prompts[i] for i in chosen]
        problems = fetch_problems(con, sorted({pid for pid, _, _ in entries}))
        texts = [render_prompt(problems[pid]) for pid, _, _ in entries]
        call = Call([problems[pid] for pid, _, _ in entries], texts, [temperature] * len(texts), s.schedule.top_p,
                    s.schedule.max_new_tokens, sample_seed, n=s.schedule.samples_per_prompt, stop=s.schedule.stop)
        ((_, rollouts),) = self.executor.rollouts([call], s.options)
        out = self._package(step, version, temperature, entries, texts, rollouts)
        if s.inject is not None:
            out.injected = self._inject(step, version, [pid for pid, _, _ in entries])
        return out

    def _inject(self, step: int, version: int, prompt_ids: list[str]) -> list[Example]:
        """Lake rows of each group's prompt, joined to the group. Their π_old is what it is for the group's own
        samples: the log-probs, under the policy version that sampled the group, scored now (docs/algorithms.md)."""
        s = self.settings
        assert s.inject is not None
        rows = s.inject.take_for(step, prompt_ids, s.inject_per_group)
        joined = [dataclasses.replace(e, group=group, policy_version=version)
                  for group, pid in enumerate(prompt_ids) for e in rows.get(pid, [])]
        if not joined:
            return []
        scored = self.executor.score([e.prompt_ids for e in joined], [e.response_ids for e in joined])
        return [dataclasses.replace(e, policy_logprobs=list(lp)) for e, lp in zip(joined, scored)]

    def _package(self, step: int, version: int, temperature: float, entries, texts: list[str],
                 rollouts: list[Rollout]) -> Rollouts:
        s = self.settings
        prompt_ids = [encode_prompt(self.tokenizer, t) for t in texts]
        policy_lps = self._policy_logprobs(prompt_ids, rollouts)
        out = Rollouts(step, version, temperature, [], [], [])
        first = s.schedule.shard * len(rollouts)  # sample indices count across the shards of a step
        for index, rollout in enumerate(rollouts):
            pid, q0_n, q0_success = entries[rollout.prompt_index]
            tid = sampled_id(s.run_id, pid, first + index, step)
            assert rollout.verdict is not None  # the call was judged
            out.examples.append(Example(
                stream=s.stream_index, prompt_id=pid, prompt_ids=prompt_ids[rollout.prompt_index],
                response_ids=list(rollout.token_ids), reward=rollout.verdict.reward,
                q0=q0_or_nan(q0_n, q0_success, s.beta, s.q0_prior),
                behavior_logprobs=list(rollout.result.logprobs), policy_logprobs=policy_lps[index],
                policy_version=version, trajectory_id=tid, group=rollout.prompt_index))
            out.trajectories.append(rollout.trajectory(
                trajectory_id=tid, source=s.algorithm, model_id=s.model_id, run_id=s.run_id, policy_version=version,
                tokenizer_id=self.tok_id, metadata={"step": step, "sample_index": first + index}))
            out.evaluations.append(rollout.evaluation(tid))
        return out

    def _policy_logprobs(self, prompt_ids: list[list[int]], rollouts: list[Rollout]) -> list[list[float]]:
        """log π_old of every sampled token: as the backend reported it, else scored with the behaviour weights."""
        results = [r.result for r in rollouts]
        missing = [i for i, r in enumerate(results) if r.policy_logprobs is None]
        scored = dict(zip(missing, self.executor.score([prompt_ids[results[i].prompt_index] for i in missing],
                                                       [results[i].token_ids for i in missing]))) if missing else {}
        return [list(r.policy_logprobs) if r.policy_logprobs is not None else scored[i] for i, r in enumerate(results)]

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=60)


class OnlineSource:
    """The online stream: hands the trainer each step's rollouts (in step order) from its worker thread, started
    with `start` at the run's first step, and writes them back to the lake as they are used."""

    def __init__(self, policy: TransformersPolicy, versions: PolicyVersions, settings: RolloutSettings, end: int, *,
                 appender: BufferedAppender | None = None, already_written: set[str] | None = None,
                 on_rollouts: Callable[[Rollouts], None] | None = None, world: World | None = None,
                 write_back: bool | None = None):
        self.policy, self.versions, self.settings, self.end = policy, versions, settings, end
        self.stream_index = settings.stream_index
        self.appender, self.already_written = appender, already_written or set()
        self.on_rollouts = on_rollouts
        # Under torchrun only rank 0 has an appender; every rank sends it its rollouts' rows.
        self.world = world or World()
        self.write_back = appender is not None if write_back is None else write_back
        self.worker: RolloutThread | None = None

    def start(self, first: int, executor: Executor | None = None) -> RolloutThread:
        """Start generating steps first..end-1 (on `executor`, over another backend of the policy or on Ray, when
        given)."""
        self.worker = RolloutThread(self.policy, self.versions, self.settings, first, self.end, executor)
        self.worker.start()
        return self.worker

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()

    def take(self, step: int, n: int) -> list[Example]:
        worker = self.worker
        assert worker is not None, "the online stream is drawn before its worker started"
        while True:
            try:
                item = worker.out.get(timeout=1.0)
                break
            except queue.Empty:
                if not worker.is_alive():
                    raise RuntimeError("the rollout worker stopped without producing step rollouts") from None
        if isinstance(item, BaseException):
            raise item
        if item.step != step or len(item.examples) != n:
            raise RuntimeError(f"rollout worker out of step: expected step {step} ({n} rollouts), "
                               f"got step {item.step} ({len(item.examples)})")
        if self.write_back:
            self._write_back(self.world.gather((item.evaluations, item.trajectories)))
        if self.on_rollouts:
            self.on_rollouts(item)
        return item.examples + item.injected

    def _write_back(self, ranks: list[tuple[list[dict], list[dict]]] | None) -> None:
        """Append (each rank's) rows not written before; `ranks` is None on every rank but rank 0."""
        for evaluations, trajectories in ranks or []:
            assert self.appender is not None  # rank 0, the one that receives rows, has one
            fresh = [i for i, row in enumerate(trajectories) if row["trajectory_id"] not in self.already_written]
            # Verdicts are committed before the trajectories they describe (BufferedAppender's COMMIT_ORDER).
            self.appender.add("evaluations", [evaluations[i] for i in fresh])
            self.appender.add("trajectories", [trajectories[i] for i in fresh])


def written_trajectory_ids(lake: Lake, run_id: str) -> set[str]:
    """Ids this run already wrote back (a resumed run regenerates them identically and must not add them twice)."""
    rows = lake.sql("SELECT trajectory_id FROM trajectories WHERE run_id = $run_id", params={"run_id": run_id})
    return set(rows.column("trajectory_id").to_pylist())
