"""`spolake pts`: Pivotal Token Search (Phi-4 report §4.3) on successful trajectories.

For a successful trajectory, S(t) = P(success | prompt + first t response tokens) under π0 (temperature 1, top-p 1).
`search` bisects the token range recursively, estimating S only where the range's ends differ by ≥ threshold, so a
response of T tokens costs O(#pivots · log T) estimates instead of T. S(0) is the prompt-level Monte-Carlo count
from `spolake q0` (no rollouts, and no new values row: the prompt-level row is that fact); S(T) = 1 is the
trajectory's own verdict (a values row n = 1, n_success = 1); every other visited S(t) costs k rollouts.

Writes, per searched trajectory: every visited estimate to `values`, every pivotal token to `pivots`, and the
rollouts as `pts_rollout` trajectories with their evaluations. The values rows are committed last and mark the
trajectory as searched, so a run killed mid-commit searches that trajectory again (its earlier rollouts stay as
valid samples, `spolake judge` judging any left without a verdict; the run_id tells the two searches apart).
Two copies started at once search each trajectory once: whichever commits its rollouts first (`_unsearched`).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from spo_lake.console import progress_bar
from spo_lake.errors import InputError
from spo_lake.lake import Lake, Work
from spo_lake.lake.rows import derive_seed, recorded_run, sampled_id, values_row
from spo_lake.lake.sql import where_clause
from spo_lake.models.backend import PolicyBackend
from spo_lake.models.identity import weights_identity
from spo_lake.models.tokens import tokenizer_id, trajectory_token_ids
from spo_lake.pipelines.common import TRAJECTORY_WITH_PROMPT
from spo_lake.pipelines.q0 import latest_prompt_values
from spo_lake.rollouts.engine import Call, Rollout, RolloutWorker
from spo_lake.tasks import Problem, SandboxOptions, get_task

# Estimates are ratios like 6/10 and 4/10, whose float difference (0.1999...) must still reach a 0.2 threshold.
TOLERANCE = 1e-9
# Commit order of a batch of finished searches: rollouts (the trajectories first: they claim the search against
# concurrent copies, see `_unsearched`), their verdicts, pivots, then the values rows that mark a trajectory searched.
PTS_COMMIT_ORDER = ("trajectories", "evaluations", "pivots", "values")


# ---------------------------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class SearchResult:
    estimates: dict[int, float]  # position t (after the first t response tokens) -> S(t)
    pivots: list[int]  # token indices i whose range [i, i+1) changes S by >= threshold, ascending


def search(n_tokens: int, estimate: Callable[[int], float], threshold: float) -> SearchResult:
    """Recursive bisection over positions 0..n_tokens: split [i, j) at its midpoint while |S(i) − S(j)| ≥ threshold
    and j − i > 1; a one-token range with such a change is a pivotal token. `estimate(t)` is called at most once
    per position. Changes that cancel inside a range (up then down) are not seen, as in the original PTS."""
    if n_tokens < 0 or not threshold > 0:
        raise InputError(f"search needs n_tokens >= 0 and threshold > 0, got {n_tokens} and {threshold}")
    estimates: dict[int, float] = {}

    def s(t: int) -> float:
        if t not in estimates:
            estimates[t] = estimate(t)
        return estimates[t]

    pivots: list[int] = []

    def bisect(i: int, j: int) -> None:
        if abs(s(j) - s(i)) + TOLERANCE < threshold:
            return
        if j - i == 1:
            pivots.append(i)
            return
        mid = (i + j) // 2
        bisect(i, mid)
        bisect(mid, j)

    if n_tokens > 0:
        bisect(0, n_tokens)
    return SearchResult(estimates, pivots)


# ---------------------------------------------------------------------------------------------- the pipeline


@dataclass
class PtsReport:
    searched: int = 0
    pivots: int = 0
    rollouts: int = 0
    estimates: int = 0
    already_searched: int = 0
    no_q0: int = 0
    outside_s0_range: int = 0
    not_verified: int = 0
    too_long: int = 0
    run_id: str = ""

    def summary(self) -> str:
        per = f" ({self.rollouts / self.searched:.1f} rollouts per trajectory)" if self.searched else ""
        skipped = (f"; skipped {self.already_searched} already searched, {self.outside_s0_range} with S0 outside the "
                   f"range, {self.no_q0} whose prompt has no q0 estimate for this model (run `spolake q0` first), "
                   f"{self.not_verified} passed only by a verdict other than their task's verifier (run `spolake "
                   f"judge` first), {self.too_long} longer than max_new_tokens (their continuations could not "
                   "reach their length)")
        return (f"searched {self.searched} trajectories: {self.pivots} pivotal tokens, {self.rollouts} "
                f"rollouts{per}{skipped}")


@dataclass
class _Search:
    """One trajectory under search: its token ids under the model's tokenizer and what the search wrote."""

    row: dict[str, Any]
    problem: Problem
    prompt_ids: list[int]
    response_ids: list[int]
    s0: float
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {t: [] for t in PTS_COMMIT_ORDER})


def candidates(lake: Lake, model_id: str, where: str | None, s0_range: tuple[float, float],
               report: PtsReport) -> list[tuple[dict[str, Any], float]]:
    """(trajectory row, S0) for every selected successful trajectory (not itself a rollout) that this model has
    not searched and whose prompt's S0 lies in s0_range; counts the skipped ones in `report`."""
    rows = lake.sql(f"""
        SELECT * FROM (
            SELECT s.*,
                (SELECT list(e.verifier) FROM evaluations e
                 WHERE e.trajectory_id = s.trajectory_id AND e.passed) AS passed_by,
                EXISTS (SELECT 1 FROM "values" v WHERE v.trajectory_id = s.trajectory_id
                        AND v.model_id = $model_id) AS searched
            FROM ({TRAJECTORY_WITH_PROMPT} {where_clause(where)}) s WHERE s.prefix_trajectory_id IS NULL)
        WHERE passed_by IS NOT NULL ORDER BY trajectory_id""", params={"model_id": model_id}).to_pylist()
    s0 = {r["prompt_id"]: r["n_success"] / r["n"] for r in latest_prompt_values(lake, model_id)}
    out = []
    for r in rows:
        problem = Problem.from_row(r)
        if get_task(problem.task).verifier_name(problem) not in r["passed_by"]:
            report.not_verified += 1  # e.g. an imported verdict: PTS needs the verifier its rollouts get
        elif r["searched"]:
            report.already_searched += 1
        elif r["prompt_id"] not in s0:
            report.no_q0 += 1
        elif not s0_range[0] <= s0[r["prompt_id"]] <= s0_range[1]:
            report.outside_s0_range += 1
        else:
            out.append((r, s0[r["prompt_id"]]))
    return out


def rollouts(worker: RolloutWorker, problem: Problem, prompt_ids: list[int], prefix: list[int], k: int,
             max_new_tokens: int, seed: int, options: SandboxOptions) -> list[Rollout]:
    """k continuations of prompt + a token-level response prefix from π0 (temperature 1, top-p 1), sampled in one
    batch and judged in the sandbox; each rollout's response is the prefix and its continuation."""
    call = Call([problem], [prompt_ids + prefix], [1.0], 1.0, max_new_tokens, seed, n=k, prefixes=[prefix])
    return worker.rollout(0, call, options)[1]


@dataclass(frozen=True)
class _Searcher:
    """Estimates S(t) for one pipeline run and keeps the rows they produce in the trajectory's `_Search`."""

    model: PolicyBackend
    tok_id: str
    run_id: str
    k: int
    max_new_tokens: int
    seed: int
    worker: RolloutWorker
    options: SandboxOptions

    def estimate(self, job: _Search, t: int) -> float:
        """S(t): the q0 count at t = 0, the verdict at t = T, else k rollouts from the prefix."""
        if t == 0:
            return job.s0
        if t == len(job.response_ids):
            job.rows["values"].append(self._value_row(job, t, 1, 1))
            return 1.0
        tid, pid = job.row["trajectory_id"], job.row["prompt_id"]
        call_seed = derive_seed(self.seed, "pts", tid, t)
        # A continuation may use what a full response from the prompt may: max_new_tokens in all (the caller
        # only searches responses that fit, so every continuation can at least reach the searched one's length).
        drawn = rollouts(self.worker, job.problem, job.prompt_ids, job.response_ids[:t], self.k,
                         self.max_new_tokens - t, call_seed, self.options)
        for i, r in enumerate(drawn):
            rollout_id = sampled_id(weights_identity(self.model.model_id), pid, i, tid, t, call_seed, r.token_ids)
            job.rows["evaluations"].append(r.evaluation(rollout_id))
            job.rows["trajectories"].append(r.trajectory(
                trajectory_id=rollout_id, source="pts_rollout", model_id=self.model.model_id, run_id=self.run_id,
                policy_version=0, tokenizer_id=self.tok_id, prefix_trajectory_id=tid, prefix_position=t,
                metadata={"seed": self.seed, "call_seed": call_seed, "sample_index": i}))
        successes = sum(bool(r.verdict and r.verdict.passed) for r in drawn)
        job.rows["values"].append(self._value_row(job, t, self.k, successes))
        return successes / self.k

    def _value_row(self, job: _Search, position: int, n: int, n_success: int) -> dict[str, Any]:
        return values_row(prompt_id=job.row["prompt_id"], trajectory_id=job.row["trajectory_id"], position=position,
                          model_id=self.model.model_id, n=n, n_success=n_success, run_id=self.run_id)

    def pivot_row(self, job: _Search, i: int, result: SearchResult, threshold: float) -> dict[str, Any]:
        return {"trajectory_id": job.row["trajectory_id"], "model_id": self.model.model_id, "position": i,
                "token_id": job.response_ids[i], "s_before": result.estimates[i], "s_after": result.estimates[i + 1],
                "threshold": threshold, "run_id": self.run_id}


def pts(lake: Lake, model: PolicyBackend, *, k: int = 10, threshold: float = 0.2, where: str | None = None,
        s0_range: tuple[float, float] = (0.2, 0.8), max_new_tokens: int = 256, seed: int = 0,
        options: SandboxOptions = SandboxOptions(), workers: int | None = None, flush_seconds: float = 60.0,
        show_progress: bool = True) -> PtsReport:
    """Search every selected successful trajectory (`where` is SQL over trajectories t joined with prompts p; see
    the module doc); returns counts of what was done."""
    if k < 1 or not 0 < threshold <= 1 or not 0 <= s0_range[0] <= s0_range[1] <= 1:
        raise InputError(f"pts needs k >= 1, 0 < threshold <= 1 and 0 <= lo <= hi <= 1; got k={k}, "
                         f"threshold={threshold}, s0_range={s0_range}")
    report = PtsReport()
    # Claimed before selecting, on the rollouts: a copy of this run that commits rollouts of a trajectory first makes
    # ours drop its search of that trajectory.
    since = datetime.now(UTC)
    work = lake.claim(f"pts/{model.model_id}", "trajectories", _unsearched(lake, model.model_id, since))
    todo = candidates(lake, model.model_id, where, s0_range, report)
    tok_id = tokenizer_id(model)
    config = {"model_id": model.model_id, "tokenizer_id": tok_id, "k": k, "threshold": threshold, "where": where,
              "s0_range": list(s0_range), "max_new_tokens": max_new_tokens, "seed": seed}
    with recorded_run(lake, "pts", config) as run, progress_bar("pivots", "rollouts", disable=not show_progress) as bar:
        report.run_id = run.run_id
        searcher = _Searcher(model, tok_id, run.run_id, k, max_new_tokens, seed, RolloutWorker(model, workers),
                             options)
        task_id = bar.add_task("pts", total=len(todo), pivots=0, rollouts=0)
        pending: list[_Search] = []
        last_commit = time.monotonic()
        for row, s0 in todo:
            prompt_ids, response_ids, _ = trajectory_token_ids(model, tok_id, row)
            if len(response_ids) > max_new_tokens:  # S(t) near T would be biased to 0 against S(T) = 1: fake pivots
                report.too_long += 1
                bar.update(task_id, advance=1)
                continue
            job = _Search(row, Problem.from_row(row), prompt_ids, response_ids, s0)
            result = search(len(response_ids), partial(searcher.estimate, job), threshold)
            job.rows["pivots"] = [searcher.pivot_row(job, i, result, threshold) for i in result.pivots]
            report.searched += 1
            report.pivots += len(result.pivots)
            report.rollouts += len(job.rows["trajectories"])
            report.estimates += len(result.estimates)
            pending.append(job)
            if time.monotonic() - last_commit >= flush_seconds:
                _commit(lake, pending, work)
                pending, last_commit = [], time.monotonic()
            bar.update(task_id, advance=1, pivots=report.pivots, rollouts=report.rollouts)
        _commit(lake, pending, work)
        run.metrics.update(searched=report.searched, pivots=report.pivots, rollouts=report.rollouts,
                           already_searched=report.already_searched, no_q0=report.no_q0,
                           outside_s0_range=report.outside_s0_range, not_verified=report.not_verified,
                           too_long=report.too_long)
    return report


def _commit(lake: Lake, searches: list[_Search], work: Work) -> None:
    batches = {t: [r for s in searches for r in s.rows[t]] for t in PTS_COMMIT_ORDER}
    lake.append_many({t: rows for t, rows in batches.items() if rows}, work=work)


def _unsearched(lake: Lake, model_id: str, since: datetime) -> Callable[[dict[str, list]], dict[str, list]]:
    """A `Work.replan`: drop every row of a search whose trajectory another copy of this run searched or is
    searching: it has values rows, or rollouts committed by another run since this one started (an older run's
    rollouts without values are a killed search, which this run redoes)."""
    def replan(batches: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
        mine = sorted({r["trajectory_id"] for r in batches.get("values", [])})
        if not mine:
            return batches
        done = {r["trajectory_id"] for r in lake.sql("""
            WITH mine AS (SELECT unnest($mine::VARCHAR[]) AS trajectory_id)
            SELECT trajectory_id FROM "values" WHERE model_id = $model_id AND trajectory_id IN (FROM mine)
            UNION SELECT prefix_trajectory_id FROM trajectories
            WHERE source = 'pts_rollout' AND model_id = $model_id AND prefix_trajectory_id IN (FROM mine)
              AND run_id <> $run_id AND created_at >= $since::TIMESTAMPTZ""",
            params={"mine": mine, "model_id": model_id, "run_id": batches["values"][0]["run_id"],
                    "since": since.isoformat()}).to_pylist()}
        rollouts = {r["trajectory_id"] for r in batches.get("trajectories", []) if r["prefix_trajectory_id"] in done}
        return {"evaluations": [r for r in batches.get("evaluations", []) if r["trajectory_id"] not in rollouts],
                "trajectories": [r for r in batches.get("trajectories", []) if r["prefix_trajectory_id"] not in done],
                "pivots": [r for r in batches.get("pivots", []) if r["trajectory_id"] not in done],
                "values": [r for r in batches.get("values", []) if r["trajectory_id"] not in done]}
    return replan
