"""Online rollouts on Ray (config `executor = "ray"`): the paper's asynchronous split of sampling and training.

The behaviour policy runs in a Ray actor (`PolicyActor`) that loads the model itself, on a local Ray instance or the
cluster at `ray_address`. The trainer's rollout worker thread (spo_lake.rl.rollout.RolloutWorker) still plans every
step, judges in the sandbox and writes back; it samples through `RayPolicy`, which forwards each new policy version
to the actor as the step that needs it comes up (every `model_update_interval` steps) while the trainer keeps
training. Which weights a step's rollouts use, and so the policy version recorded with them, is the same as with the
local thread: the schedule decides it (spo_lake.rl.rollout.behaviour_version).
"""
from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from spo_lake.errors import InputError
from spo_lake.models.backend import SampleResult, TransformersPolicy, encode_prompt


class PolicyActor:
    """A rollout policy in its own process (a Ray actor): sample, score, take new weights."""

    def __init__(self, path: str, backend: str, device: str, dtype: str, model_id: str, threads: int):
        from spo_lake.models import load_policy
        from spo_lake.models.threads import use_threads

        use_threads(threads)
        self.policy = load_policy(path, backend=backend, device=device, dtype=dtype, model_id=model_id)

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.policy.load_weights(weights)

    def sample(self, prompts: Sequence[str], **settings: Any) -> list[SampleResult]:
        return self.policy.sample(prompts, **settings)

    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        return self.policy.score(prompt_ids, response_ids)


class RayPolicy:
    """What the rollout worker samples with when executor = "ray": the calls of a policy backend, run by one
    PolicyActor (one CPU per thread; one GPU when the trainer's model is on CUDA). Prompts are encoded here."""

    def __init__(self, policy: TransformersPolicy, backend: str, dtype: str, threads: int, address: str = ""):
        try:
            import ray
        except ImportError:
            raise InputError("executor = \"ray\" needs Ray: pip install 'spo-lake[ray]'") from None
        self.ray = ray
        self.started = not ray.is_initialized()  # a caller's own instance (a test's, a notebook's) is left running
        if self.started:
            ray.init(address=address or "local", include_dashboard=False, log_to_driver=False)
        source = Path(policy.source or policy.model_id)  # an actor need not share this process's directory
        path = str(source.resolve()) if source.exists() else str(source)
        gpu = policy.device.type == "cuda"
        actor = ray.remote(num_cpus=threads, num_gpus=int(gpu))(PolicyActor)
        # (Any: Ray types an actor method's .remote only where the method is decorated with Ray's @ray.method)
        self.actor: Any = actor.remote(path, backend, "cuda" if gpu else "cpu", dtype, policy.model_id, threads)
        # The worker thread encodes while the trainer tokenizes: a fast tokenizer fails when two threads share it.
        self.tokenizer = copy.deepcopy(policy.tokenizer)

    def encode_prompt(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.ray.get(self.actor.load_weights.remote(weights))

    def sample(self, prompts: Sequence[str], **settings: Any) -> list[SampleResult]:
        return self.ray.get(self.actor.sample.remote(list(prompts), **settings))

    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        return self.ray.get(self.actor.score.remote(prompt_ids, response_ids))

    def close(self) -> None:
        self.ray.kill(self.actor)
        if self.started:
            self.ray.shutdown()
