"""pass@k of a policy on a set of problems: n samples per problem, judged in the sandbox, unbiased estimator.

Used by `spolake eval` and periodically inside training (paper §5: n = 20, temperature 0.4, top-p 0.95, k ∈ {1, 10}).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from spo_lake.errors import InputError
from spo_lake.lake import Lake, Snapshot
from spo_lake.lake.appender import BufferedAppender
from spo_lake.lake.rows import derive_seed, recorded_run, sampled_id
from spo_lake.lake.sql import where_clause
from spo_lake.models.backend import PolicyBackend
from spo_lake.models.tokens import render_prompt, tokenizer_id
from spo_lake.rollouts.engine import Call, Rollout
from spo_lake.rollouts.executors import LocalExecutor
from spo_lake.scores import EVAL_KS, EVAL_N, EVAL_TEMPERATURE, EVAL_TOP_P, RESPONSE_TOKENS, mean_pass_at_k
from spo_lake.tasks import Problem, SandboxOptions


@dataclass(frozen=True)
class EvalSettings:
    n: int = EVAL_N
    temperature: float = EVAL_TEMPERATURE
    top_p: float = EVAL_TOP_P
    ks: tuple[int, ...] = EVAL_KS
    max_new_tokens: int = RESPONSE_TOKENS
    seed: int = 0
    batch_prompts: int = 8  # prompts per sampling call (× n sequences)

    def __post_init__(self) -> None:
        if self.n < 1 or not self.ks or any(not 1 <= k <= self.n for k in self.ks):
            raise InputError(f"eval needs n >= 1 and every k in 1..n, got n={self.n}, k={list(self.ks)}")


@dataclass
class EvalResult:
    pass_at_k: dict[int, float]  # mean over problems
    per_problem: list[tuple[str, int, int]]  # (prompt_id, n, correct)
    samples: list[Rollout] = field(repr=False, default_factory=list)  # judged, grouped by problem
    mean_reward: float = 0.0
    seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        return {**{f"pass@{k}": v for k, v in self.pass_at_k.items()}, "eval_reward": self.mean_reward}


def select_problems(lake: Lake, where: str | None, snapshot: str | Snapshot | None = None,
                    limit: int | None = None) -> list[Problem]:
    """Problems chosen by `where` (SQL over prompts p), ordered by prompt_id, at most `limit`."""
    bound = f"LIMIT {int(limit)}" if limit else ""
    try:
        rows = lake.sql(f"SELECT p.* FROM prompts p {where_clause(where)} ORDER BY p.prompt_id {bound}", snapshot)
    except duckdb.Error as exc:  # duckdb names the bad column or syntax; one line is enough
        raise InputError(f"bad prompt selection `{where}`: {str(exc).splitlines()[0]}") from None
    return [Problem.from_row(r) for r in rows.to_pylist()]


def evaluate_policy(policy: PolicyBackend, problems: Sequence[Problem], settings: EvalSettings,
                    options: SandboxOptions = SandboxOptions(), workers: int | None = None) -> EvalResult:
    """Sample settings.n responses per problem and compute pass@k for every k (deterministic for settings.seed)."""
    if not problems:
        raise InputError("eval: no problems selected")
    started = time.perf_counter()
    chunks = [list(problems[start : start + settings.batch_prompts])
              for start in range(0, len(problems), settings.batch_prompts)]
    calls = [Call(chunk, [render_prompt(p) for p in chunk], [settings.temperature] * len(chunk), settings.top_p,
                  settings.max_new_tokens, derive_seed(settings.seed, "eval", chunk[0].prompt_id), n=settings.n)
             for chunk in chunks]
    samples = [r for _, rollouts in LocalExecutor(policy, workers).rollouts(calls, options) for r in rollouts]
    verdicts = [r.verdict for r in samples if r.verdict is not None]
    correct: dict[str, int] = {p.prompt_id: 0 for p in problems}
    for rollout, verdict in zip(samples, verdicts):
        correct[rollout.problem.prompt_id] += verdict.passed
    per_problem = [(pid, settings.n, c) for pid, c in correct.items()]
    ns, cs = [n for _, n, _ in per_problem], [c for _, _, c in per_problem]
    return EvalResult(
        pass_at_k={k: mean_pass_at_k(ns, cs, k) for k in settings.ks},
        per_problem=per_problem,
        samples=samples,
        mean_reward=sum(v.reward for v in verdicts) / len(verdicts),
        seconds=time.perf_counter() - started,
    )


def evaluate_in_lake(lake: Lake, policy: PolicyBackend, settings: EvalSettings, *, where: str | None = None,
                     snapshot: str | None = None, max_prompts: int | None = None,
                     options: SandboxOptions = SandboxOptions(),
                     workers: int | None = None, save: bool = True) -> tuple[EvalResult, str]:
    """`spolake eval`: pass@k on the prompts selected by `where` (SQL over prompts p), recorded as an `eval` run;
    with `save`, the samples and their verdicts are written back (source `policy`). Returns (result, run id)."""
    problems = select_problems(lake, where, snapshot, max_prompts)
    config = {"model_id": policy.model_id, "where": where, "snapshot": snapshot, "max_prompts": max_prompts,
              "n": settings.n,
              "temperature": settings.temperature, "top_p": settings.top_p, "k": list(settings.ks),
              "max_new_tokens": settings.max_new_tokens, "seed": settings.seed}
    with recorded_run(lake, "eval", config) as run:
        result = evaluate_policy(policy, problems, settings, options, workers)
        if save:
            with BufferedAppender(lake) as out:
                rows = _sample_rows(policy, run.run_id, settings, result)
                out.add("evaluations", [r for r, _ in rows])
                out.add("trajectories", [t for _, t in rows])
        run.metrics.update(prompts=len(problems), **result.metrics(), seconds=round(result.seconds, 3))
    return result, run.run_id


def _sample_rows(policy: PolicyBackend, run_id: str, settings: EvalSettings,
                 result: EvalResult) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    tok_id = tokenizer_id(policy)
    seen: dict[str, int] = {}
    rows = []
    for rollout in result.samples:
        pid = rollout.problem.prompt_id
        index = seen[pid] = seen.get(pid, -1) + 1
        tid = sampled_id(run_id, pid, index)
        trajectory = rollout.trajectory(
            trajectory_id=tid, source="policy", model_id=policy.model_id, run_id=run_id, policy_version=None,
            tokenizer_id=tok_id, metadata={"sample_index": index, "seed": settings.seed, "eval": True})
        rows.append((rollout.evaluation(tid), trajectory))
    return rows
