"""Judge many (problem, response) pairs in parallel, each task with its own verifier, all inside the sandbox.

A batch always finishes: whatever goes wrong while judging one pair (short of the sandbox being unavailable on this
machine, which is a set-up error) becomes that pair's `sandbox_error` verdict, so it is recorded rather than lost.
"""
from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from spo_lake.lake.rows import evaluation_row
from spo_lake.sandbox import SandboxUnavailable
from spo_lake.tasks import Problem, SandboxOptions, Verdict, get_task

CHUNK = 64  # pairs per job for tasks that verify many answers in one sandboxed process


def judge_many(items: Sequence[tuple[Problem, str]], options: SandboxOptions, workers: int | None = None,
               on_done: Callable[[list[int], list[Verdict]], None] | None = None) -> list[Verdict]:
    """Verdicts in input order. Threads suffice: every check is a sandboxed subprocess.

    `on_done(indices, verdicts)` is called from the calling thread as each job finishes (for progress and
    buffered commits).
    """
    workers = workers or os.cpu_count() or 1
    jobs = task_chunks(items, lambda task: CHUNK if hasattr(get_task(task), "verify_many") else 1)

    def run(job: list[int]) -> list[Verdict]:
        task = get_task(items[job[0]][0].task)
        if hasattr(task, "verify_many"):
            try:
                return task.verify_many([items[i] for i in job], options)
            except SandboxUnavailable:
                raise
            except Exception:
                pass  # judged one by one below, so that only the pair at fault fails
        return [judge_one(task, items[i][0], items[i][1], options) for i in job]

    out: list[Verdict | None] = [None] * len(items)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run, job): job for job in jobs}
        for fut in as_completed(futures):
            job, verdicts = futures[fut], fut.result()
            for i, v in zip(job, verdicts):
                out[i] = v
            if on_done:
                on_done(job, verdicts)
    return [v for v in out if v is not None]


def task_chunks(items: Sequence[tuple[Problem, str]], size: Callable[[str], int]) -> list[list[int]]:
    """Indices of `items` grouped by task, in chunks of at most size(task)."""
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, (problem, _) in enumerate(items):
        by_task[problem.task].append(i)
    return [idx[k:k + size(name)] for name, idx in by_task.items() for k in range(0, len(idx), size(name))]


def judge_one(task, problem: Problem, response: str, options: SandboxOptions) -> Verdict:
    """`task.verify`, with any failure of the judging itself as this pair's `sandbox_error` verdict."""
    try:
        return task.verify(problem, response, options)
    except SandboxUnavailable:
        raise
    except Exception as error:
        return Verdict(passed=False, verdict="sandbox_error", detail=f"judging failed: {type(error).__name__}: "
                                                                     f"{error}"[:500])


def verdict_row(trajectory_id: str, verifier: str, v: Verdict) -> dict[str, Any]:
    """The `evaluations` row recording verdict `v` of `verifier` on a trajectory."""
    return evaluation_row(trajectory_id=trajectory_id, verifier=verifier, passed=v.passed, reward=v.reward,
                          verdict=v.verdict, first_failing_test=v.first_failing_test, detail=v.detail,
                          duration_s=v.duration_s, extraction=v.extracted_code)
