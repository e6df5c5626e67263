"""The rollout engine: sample a batch of prompts with a policy backend, judge the responses in the sandbox, and
return them as typed rollouts that make their own lake rows.

Every pipeline that samples goes through here (`spolake sample`, `q0`, `pts`' continuations, `eval` and the
trainer's online stream); what differs between them is only which prompts a call holds, its seed, and the ids and
metadata of the rows (each caller's own: they are what makes a resumed or replayed run find its rows again).
A backend (spo_lake.models) samples; an executor (spo_lake.rollouts.executors) decides where a RolloutWorker runs.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spo_lake.lake.rows import trajectory_row
from spo_lake.tasks import Problem, SandboxOptions, Verdict, get_task
from spo_lake.tasks.judge import judge_many, verdict_row
from spo_lake.tasks.normalize import response_hash

if TYPE_CHECKING:  # annotations only: judging alone (`spolake judge`) never loads torch or transformers
    import torch

    from spo_lake.models.backend import PolicyBackend, SampleResult


@dataclass(frozen=True)
class Call:
    """One sampling call of a backend: `n` responses to each prompt, `prompts[i]` at `temperatures[i]`, judged by
    `problems[i]`. A prompt is text, or with `prefixes` token ids to continue: a prompt's ids followed by a response
    prefix (`prefixes[i]`), which the recorded and judged response then starts with (text could not carry a
    token-exact prefix)."""

    problems: list[Problem]
    prompts: list[str] | list[list[int]]
    temperatures: list[float]
    top_p: float
    max_new_tokens: int
    seed: int
    n: int = 1
    stop: tuple[str, ...] = ()
    prefixes: list[list[int]] | None = None


@dataclass(frozen=True)
class Rollout:
    """One sampled response of a call: of its prompt `prompt_index`, judged unless the call was not."""

    problem: Problem
    prompt_index: int
    temperature: float
    top_p: float
    result: SampleResult  # as the backend returned it (a continuation's token ids are the new tokens only)
    text: str  # the response: the result's text, or a continuation decoded with its prefix
    token_ids: list[int]
    verdict: Verdict | None
    prefix: list[int] | None = None

    def trajectory(self, *, metadata: dict[str, Any], **provenance: Any) -> dict[str, Any]:
        """Its `trajectories` row, with the ids, model, run and source given by keyword (trajectory_row's)."""
        return trajectory_row(
            response_text=self.text, token_ids=self.token_ids, response_hash=response_hash(self.text),
            # a continuation's behaviour log-probs stay null: only the continuation was sampled, the prefix was not
            behavior_logprobs=None if self.prefix is not None else self.result.logprobs,
            prompt_id=self.problem.prompt_id, temperature=self.temperature, top_p=self.top_p,
            metadata={"finish_reason": self.result.finish_reason, **metadata}, **provenance)

    def evaluation(self, trajectory_id: str) -> dict[str, Any]:
        """Its `evaluations` row: the verdict of its task's verifier."""
        assert self.verdict is not None, "an unjudged rollout has no evaluation"
        return verdict_row(trajectory_id, get_task(self.problem.task).verifier_name(self.problem), self.verdict)


@dataclass(frozen=True)
class PolicySpec:
    """How another process loads the same backend: path, backend, dtype, device and batch size (the last two
    shape the samples: batches are seeded one by one), and the torch threads it may use."""

    path: str
    model_id: str
    backend: str
    dtype: str
    device: str
    batch_size: int | None
    threads: int | None = None

    @classmethod
    def of(cls, model: PolicyBackend, **changes: Any) -> PolicySpec:
        backend, dtype = model.precision
        source = model.source or model.model_id
        local = Path(source)  # a worker need not share this process's working directory
        spec = dict(path=str(local.resolve()) if local.exists() else source, model_id=model.model_id,
                    backend=backend, dtype=dtype, device=str(model.device),
                    batch_size=getattr(model, "batch_size", None))  # batch_size: the transformers backend's
        return cls(**{**spec, **changes})

    def load(self) -> PolicyBackend:
        if self.threads is not None:
            from spo_lake.models.threads import use_threads

            use_threads(self.threads)
        if self.backend == "transformers":
            from spo_lake.models.backend import TransformersPolicy

            return TransformersPolicy.from_pretrained(self.path, self.device, self.dtype, self.batch_size or 64,
                                                      model_id=self.model_id)
        from spo_lake.models import load_policy

        return load_policy(self.path, backend=self.backend, device=self.device, dtype=self.dtype,
                           model_id=self.model_id)


class RolloutWorker:
    """Runs calls with one backend: samples, then judges what it sampled (`judge_workers` sandboxes at once). In
    this process (LocalExecutor), or a Ray actor that loads its backend from a PolicySpec (RayExecutor). A trainer
    sends it each policy version's weights (`load_weights`) and scores tokens with them (`score`)."""

    def __init__(self, model: PolicyBackend | PolicySpec, judge_workers: int | None):
        self.model = model.load() if isinstance(model, PolicySpec) else model
        self.judge_workers = judge_workers

    def rollout(self, index: int, call: Call, judge: SandboxOptions | None) -> tuple[int, list[Rollout]]:
        """(index, the call's rollouts): the index comes back so that calls finishing out of order can be placed."""
        m = self.model
        # (the type: ignores: prompts are text without prefixes and token ids with them, which mypy cannot follow)
        if call.prefixes is None:
            results = m.sample(call.prompts, n=call.n, temperature=call.temperatures,  # type: ignore[arg-type]
                               top_p=call.top_p, max_new_tokens=call.max_new_tokens, stop=list(call.stop) or None,
                               seed=call.seed)
            prompt_of = [r.prompt_index for r in results]
            prefixes: list[list[int] | None] = [None] * len(results)
        else:
            assert len(set(call.temperatures)) == 1, "continuations are sampled at one temperature"
            expanded: list[Sequence[int]] = [p for p in call.prompts for _ in range(call.n)]  # type: ignore[misc]
            results = m.sample_continuations(expanded, temperature=call.temperatures[0], top_p=call.top_p,
                                             max_new_tokens=call.max_new_tokens, stop=list(call.stop) or None,
                                             seed=call.seed)
            prompt_of = [r.prompt_index // call.n for r in results]
            prefixes = [call.prefixes[i] for i in prompt_of]
        token_ids = [r.token_ids if p is None else p + r.token_ids for r, p in zip(results, prefixes)]
        texts = [r.text if p is None else m.tokenizer.decode(ids, skip_special_tokens=True)
                 for r, p, ids in zip(results, prefixes, token_ids)]
        verdicts: Sequence[Verdict | None] = [None] * len(results) if judge is None else judge_many(
            [(call.problems[i], text) for i, text in zip(prompt_of, texts)], judge, self.judge_workers)
        return index, [Rollout(call.problems[i], i, call.temperatures[i], call.top_p, r, text, ids, v, p)
                       for i, r, text, ids, v, p in zip(prompt_of, results, texts, token_ids, verdicts, prefixes)]

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.model.load_weights(weights)

    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        return self.model.score(prompt_ids, response_ids)
