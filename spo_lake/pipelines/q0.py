"""`spolake q0`: Monte-Carlo success counts of π0 per prompt (temperature 1, top-p 1), for Q̂0 (paper §3.1.3).

Reuses what the lake holds: every evaluated trajectory of the model sampled from the plain prompt at temperature 1,
top-p 1 (any source; not PTS continuations, not templated prompts, not later policy versions) counts. Only the
missing samples are drawn (source `reference`, evaluated right away), so a second run with the same k samples
nothing. Writes prompt-level `values` rows (n, n_success) when the counts changed; readers take the row with the
largest n per key. Q̂0 = β·log(S0 + (1−S0)·e^{−1/β}) is derived from the counts, never stored.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from spo_lake.errors import InputError
from spo_lake.lake import Lake
from spo_lake.lake.appender import BufferedAppender
from spo_lake.lake.rows import recorded_run, values_row
from spo_lake.models.backend import PolicyBackend
from spo_lake.pipelines.common import sample_quota
from spo_lake.pipelines.judge import unjudgeable
from spo_lake.pipelines.sample import Request, SampleReport, SampleSettings, draw, select_prompts
from spo_lake.rollouts.executors import open_executor
from spo_lake.scores import PAPER_BETA, q0_from_counts
from spo_lake.tasks import Problem, SandboxOptions, get_task


@dataclass
class Q0Report:
    prompts: int = 0
    sampled: int = 0
    reused: int = 0
    values_written: int = 0
    mean_s0: float = float("nan")
    mean_q0: float = float("nan")
    beta: float = PAPER_BETA
    run_id: str = ""
    skipped: dict[str, int] = field(default_factory=dict)  # prompts whose samples cannot be judged, by reason

    def summary(self) -> str:
        skipped = "".join(f"; skipped {n} prompts ({reason})" for reason, n in sorted(self.skipped.items()))
        return (f"{self.prompts} prompts: reused {self.reused} evaluated samples, sampled {self.sampled}; "
                f"wrote {self.values_written} values rows; mean S0 {self.mean_s0:.3f}, "
                f"mean Q̂0 {self.mean_q0:.4f} at β={self.beta:.4g}{skipped}")


def success_counts(lake: Lake, model_id: str, problems: list[Problem]) -> dict[str, tuple[int, int]]:
    """{prompt_id: (n, n_success)} over π0 samples (see module doc) judged by the prompt's own verifier."""
    if not problems:
        return {}
    rows = lake.sql("""
        SELECT t.prompt_id, e.verifier, count(DISTINCT t.trajectory_id) AS n,
               count(DISTINCT t.trajectory_id) FILTER (WHERE e.passed) AS n_success
        FROM trajectories t JOIN evaluations e USING (trajectory_id)
        WHERE t.model_id = $model_id AND t.temperature = 1.0 AND t.top_p = 1.0
          AND t.prefix_trajectory_id IS NULL AND coalesce(t.policy_version, 0) = 0
          AND (t.metadata->>'template') IS NULL AND t.prompt_id IN (SELECT unnest($ids::VARCHAR[]))
        GROUP BY ALL""", params={"model_id": model_id, "ids": [p.prompt_id for p in problems]}).to_pylist()
    by_key = {(r["prompt_id"], r["verifier"]): (r["n"], r["n_success"]) for r in rows}
    counts = {}
    for p in problems:
        found = by_key.get((p.prompt_id, get_task(p.task).verifier_name(p)))
        if found:
            counts[p.prompt_id] = found
    return counts


def latest_prompt_values(lake: Lake, model_id: str, snapshot: str | None = None) -> list[dict[str, Any]]:
    """The prompt-level values row with the largest n per prompt for this model at temperature 1, top-p 1 (at
    `snapshot`, else the latest versions)."""
    return lake.sql("""
        SELECT prompt_id, n, n_success FROM "values"
        WHERE trajectory_id IS NULL AND position IS NULL AND model_id = $model_id
          AND temperature = 1.0 AND top_p = 1.0
        QUALIFY row_number() OVER (PARTITION BY prompt_id ORDER BY n DESC, created_at DESC) = 1""",
        snapshot, params={"model_id": model_id}).to_pylist()


def q0(lake: Lake, model: PolicyBackend, *, k: int = 800, where: str | None = None, beta: float = PAPER_BETA,
       seed: int = 0, batch: int = 64, max_new_tokens: int = 256, options: SandboxOptions = SandboxOptions(),
       workers: int | None = None, flush_rows: int = 2000, show_progress: bool = True, executor: str = "local",
       ray_address: str | None = None) -> Q0Report:
    """Bring every selected prompt (`where` is SQL over prompts p) to at least k evaluated π0 samples and record
    the counts. `executor` 'ray' samples and judges on Ray workers, with the same rows as 'local'."""
    if k < 1:
        raise InputError(f"k must be at least 1, got {k}")
    q0_from_counts(1, 0, beta)  # rejects a bad β before any sampling
    # A prompt whose samples cannot be judged (a task without a verifier here, no tests) has no S0: skipped and said,
    # as `judge` skips its trajectories, rather than failing the whole run (a lake may hold any task's prompts).
    selected = select_prompts(lake, where)
    reasons = {p.prompt_id: unjudgeable(p) for p in selected}
    problems = [p for p in selected if reasons[p.prompt_id] is None]

    def missing() -> dict[str, int]:
        have = success_counts(lake, model.model_id, problems)
        return {p.prompt_id: k - have.get(p.prompt_id, (0, 0))[0] for p in problems}

    # Claimed before counting: a copy of this run committing samples meanwhile makes ours re-count (exactly k each).
    work = lake.claim(f"q0/{model.model_id}", "trajectories", sample_quota(missing))
    have = success_counts(lake, model.model_id, problems)
    # Sample indices continue after the reused ones, so their seeds differ from any earlier q0 run's.
    requests = [Request(p, i, 1.0) for p in problems for i in range(have.get(p.prompt_id, (0, 0))[0], k)]
    report = Q0Report(prompts=len(problems), reused=sum(n for n, _ in have.values()), beta=beta,
                      skipped=dict(Counter(reason for reason in reasons.values() if reason is not None)))
    settings = SampleSettings("reference", 1.0, 1.0, max_new_tokens, None, seed)
    config = {"model_id": model.model_id, "k": k, "where": where, "beta": beta, "seed": seed,
              "max_new_tokens": max_new_tokens, "executor": executor}
    with open_executor(executor, model, workers, ray_address) as running, recorded_run(lake, "q0", config) as run:
        report.run_id = run.run_id
        with BufferedAppender(lake, flush_rows=flush_rows, work=work) as out:
            sampled = SampleReport()
            draw(model, requests, settings, out, run_id=run.run_id, report=sampled, executor=running,
                 evaluate=options, batch=batch, show_progress=show_progress, label="q0")
        report.sampled = sampled.sampled
        counts = success_counts(lake, model.model_id, problems)
        recorded = {r["prompt_id"]: (r["n"], r["n_success"]) for r in latest_prompt_values(lake, model.model_id)}
        rows = [values_row(prompt_id=pid, trajectory_id=None, position=None, model_id=model.model_id, n=n,
                           n_success=s, run_id=run.run_id)
                for pid, (n, s) in counts.items() if recorded.get(pid) != (n, s)]
        # counts a concurrent copy recorded first are the same fact (the key holds n and n_success): not added
        report.values_written = lake.added("values", rows) if rows else 0
        if counts:
            report.mean_s0 = sum(s / n for n, s in counts.values()) / len(counts)
            report.mean_q0 = sum(q0_from_counts(n, s, beta) for n, s in counts.values()) / len(counts)
        run.metrics.update(sampled=report.sampled, reused=report.reused, values_written=report.values_written,
                           mean_s0=report.mean_s0 if counts else None, mean_q0=report.mean_q0 if counts else None)
    return report
