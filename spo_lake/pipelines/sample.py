"""`spolake sample`: draw responses from a policy for selected prompts and write them as trajectories.

Every row carries its provenance: model, tokenizer, sampling settings, token ids, the behaviour log-probs of the
distribution actually sampled from, the run, and in metadata the finish reason, seeds and prompt template.
Resumable: a prompt that already holds n trajectories of this model, source and settings is skipped, and one that
holds m < n gets n − m more. Sampling is deterministic for a seed and a lake state: each batch's seed derives from
(seed, settings, first prompt and sample index), so resumed work draws fresh samples instead of repeating old ones.
"""
from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from spo_lake.console import progress_bar
from spo_lake.errors import InputError
from spo_lake.lake import Lake
from spo_lake.lake.appender import BufferedAppender
from spo_lake.lake.rows import derive_seed, recorded_run, sampled_id
from spo_lake.lake.sql import where_clause
from spo_lake.models.backend import PolicyBackend
from spo_lake.models.identity import weights_identity
from spo_lake.models.tokens import render_prompt, tokenizer_id
from spo_lake.pipelines.common import sample_quota
from spo_lake.rollouts.engine import Call, Rollout
from spo_lake.rollouts.executors import Executor, open_executor
from spo_lake.tasks import Problem, SandboxOptions


def select_prompts(lake: Lake, where: str | None) -> list[Problem]:
    rows = lake.sql(f"SELECT p.* FROM prompts p {where_clause(where)} ORDER BY p.prompt_id").to_pylist()
    return [Problem.from_row(r) for r in rows]


# ---------------------------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class SampleSettings:
    """How to sample. With `temperature_range`, each prompt gets one temperature drawn uniformly from it,
    deterministically by (seed, prompt_id)."""

    source: str
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    template: str | None = None
    seed: int = 0
    temperature_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        lo, hi = self.temperature_range or (self.temperature, self.temperature)
        if not 0 <= lo <= hi or not 0 < self.top_p <= 1 or self.max_new_tokens < 1:
            raise InputError(f"bad sampling settings: temperature {self.temperature_range or self.temperature}, "
                             f"top_p {self.top_p}, max_new_tokens {self.max_new_tokens}")
        if self.template is not None and "{prompt}" not in self.template:
            raise InputError("template has no {prompt} placeholder")

    def temperature_for(self, prompt_id: str) -> float:
        if self.temperature_range is None:
            return self.temperature
        return random.Random(derive_seed(self.seed, "temperature", prompt_id)).uniform(*self.temperature_range)


@dataclass(frozen=True)
class Request:
    """Draw the sample with this index (0-based among this prompt's samples of these settings)."""

    problem: Problem
    index: int
    temperature: float


@dataclass
class SampleReport:
    prompts: int = 0
    skipped: int = 0
    sampled: int = 0
    tokens: int = 0
    evaluated: int = 0
    passed: int = 0
    seconds: float = 0.0
    run_id: str = ""

    def summary(self) -> str:
        rate = f", {self.tokens / self.seconds:.0f} tokens/s" if self.seconds else ""
        judged = f"; passed {self.passed}/{self.evaluated}" if self.evaluated else ""
        return (f"sampled {self.sampled} responses for {self.prompts - self.skipped} prompts ({self.skipped} already "
                f"complete){rate}{judged}")


def existing_counts(lake: Lake, model_id: str, settings: SampleSettings) -> dict[tuple[str, float], int]:
    """{(prompt_id, temperature): trajectories of this model, source and settings already in the lake}."""
    rows = lake.sql("""
        SELECT prompt_id, temperature, count(*) AS n FROM trajectories
        WHERE model_id = $model_id AND source = $source AND top_p = $top_p::DOUBLE AND prefix_trajectory_id IS NULL
          AND (metadata->>'template') IS NOT DISTINCT FROM $template::VARCHAR
          AND TRY_CAST(metadata->>'max_new_tokens' AS BIGINT) = $max_new_tokens
        GROUP BY ALL""", params={"model_id": model_id, "source": settings.source, "top_p": settings.top_p,
                                 "template": settings.template, "max_new_tokens": settings.max_new_tokens}).to_pylist()
    return {(r["prompt_id"], r["temperature"]): r["n"] for r in rows}


def draw(model: PolicyBackend, requests: Sequence[Request], settings: SampleSettings, out: BufferedAppender, *,
         run_id: str, report: SampleReport, executor: Executor, evaluate: SandboxOptions | None = None,
         batch: int = 64, show_progress: bool = True, label: str = "sample", stop: Sequence[str] = ()) -> None:
    """Sample every request (in batches of `batch`, each request at its own temperature) on `executor` and add
    trajectories (and, with `evaluate`, their evaluations, added first) to `out`; counts go into `report`. `label`
    names the progress bar and separates the random streams of different pipelines (q0 and sample never replay each
    other's draws). `stop`: stop strings (spo_lake.models.decode.CLOSING_FENCE ends a code answer at its fence)."""
    chunks = [requests[start:start + batch] for start in range(0, len(requests), batch)]
    # A call's seed is a function of its own settings and first request, whichever worker runs it.
    calls = [Call([r.problem for r in chunk], [render_prompt(r.problem, settings.template) for r in chunk],
                  [r.temperature for r in chunk], settings.top_p, settings.max_new_tokens,
                  derive_seed(settings.seed, label, settings.source, settings.template, chunk[0].temperature,
                              settings.top_p, chunk[0].problem.prompt_id, chunk[0].index), stop=tuple(stop))
             for chunk in chunks]
    tok_id = tokenizer_id(model)
    started = time.perf_counter()
    with progress_bar("tokens_per_s", disable=not show_progress) as bar:
        task_id = bar.add_task(label, total=len(requests), tokens_per_s="-")
        for index, rollouts in executor.rollouts(calls, evaluate):
            chunk, call_seed = chunks[index], calls[index].seed
            ids = [_trajectory_id(model.model_id, settings, r, rollout, call_seed)
                   for r, rollout in zip(chunk, rollouts)]
            if evaluate is not None:
                out.add("evaluations", [rollout.evaluation(tid) for tid, rollout in zip(ids, rollouts)])
                report.evaluated += len(rollouts)
                report.passed += sum(rollout.verdict.passed for rollout in rollouts if rollout.verdict)
            out.add("trajectories", [rollout.trajectory(
                trajectory_id=tid, source=settings.source, model_id=model.model_id, run_id=run_id, policy_version=0,
                tokenizer_id=tok_id, metadata={
                    "seed": settings.seed, "call_seed": call_seed, "sample_index": r.index, "stop": list(stop) or None,
                    "template": settings.template, "max_new_tokens": settings.max_new_tokens,
                    "temperature_range": list(settings.temperature_range) if settings.temperature_range else None})
                for tid, r, rollout in zip(ids, chunk, rollouts)])
            report.sampled += len(rollouts)
            report.tokens += sum(len(rollout.token_ids) for rollout in rollouts)
            report.seconds = time.perf_counter() - started
            bar.update(task_id, advance=len(chunk), tokens_per_s=f"{report.tokens / report.seconds:.0f}")


def _trajectory_id(model_id: str, settings: SampleSettings, request: Request, rollout: Rollout,
                   call_seed: int) -> str:
    return sampled_id(weights_identity(model_id), request.problem.prompt_id, request.index, settings.source,
                      call_seed, request.temperature, settings.top_p, settings.max_new_tokens, settings.template,
                      list(rollout.token_ids))


def sample(lake: Lake, model: PolicyBackend, *, where: str | None = None, n: int = 1, temperature: float = 1.0,
           top_p: float = 1.0, max_new_tokens: int = 256, source: str = "reference", template: str | None = None,
           seed: int = 0, temperature_range: tuple[float, float] | None = None, evaluate: bool = False,
           options: SandboxOptions = SandboxOptions(), workers: int | None = None, batch: int = 64,
           flush_rows: int = 1000, show_progress: bool = True, executor: str = "local",
           ray_address: str | None = None, stop: Sequence[str] = ()) -> SampleReport:
    """Sample n responses per selected prompt (`where` is SQL over prompts p), skipping what is already there.
    `executor` 'ray' samples and judges on Ray workers (`workers` of them), with the same rows as 'local'. `stop`:
    stop strings, e.g. [CLOSING_FENCE] (spo_lake.models.decode) to end pyfunc answers at their closing fence."""
    if n < 1:
        raise InputError(f"n must be at least 1, got {n}")
    settings = SampleSettings(source, temperature, top_p, max_new_tokens, template, seed, temperature_range)
    problems = select_prompts(lake, where)

    def missing() -> dict[str, int]:
        have = existing_counts(lake, model.model_id, settings)
        return {p.prompt_id: n - have.get((p.prompt_id, settings.temperature_for(p.prompt_id)), 0) for p in problems}

    # Claimed before counting: a copy of this run committing samples meanwhile makes ours re-count (exactly n each).
    work = lake.claim(f"sample/{model.model_id}/{source}", "trajectories", sample_quota(missing))
    have = existing_counts(lake, model.model_id, settings)
    requests = []
    report = SampleReport(prompts=len(problems))
    for p in problems:
        t = settings.temperature_for(p.prompt_id)
        done = have.get((p.prompt_id, t), 0)
        report.skipped += done >= n
        requests += [Request(p, i, t) for i in range(done, n)]
    config = {"model_id": model.model_id, "where": where, "n": n, "temperature": temperature, "top_p": top_p,
              "max_new_tokens": max_new_tokens, "source": source, "template": template, "seed": seed,
              "temperature_range": list(temperature_range) if temperature_range else None, "evaluate": evaluate,
              "executor": executor, "stop": list(stop)}
    with (open_executor(executor, model, workers, ray_address) as running, recorded_run(lake, "sample", config) as run,
          BufferedAppender(lake, flush_rows=flush_rows, work=work) as out):
        report.run_id = run.run_id
        draw(model, requests, settings, out, run_id=run.run_id, report=report, executor=running,
             evaluate=options if evaluate else None, batch=batch, show_progress=show_progress, stop=stop)
        out.flush()
        run.metrics.update(sampled=report.sampled, tokens=report.tokens, seconds=round(report.seconds, 3),
                           evaluated=report.evaluated, passed=report.passed)
    return report
