"""`spolake judge`: judge every trajectory that its task's verifier has not judged yet.

Incremental and resumable: the pending set is computed against the `evaluations` table, and verdicts are committed
in buffered batches while the run goes on, so a killed run loses at most one buffer of work. Every selected
trajectory gets a verdict, a failed judgment included (`sandbox_error`), so nothing stays pending forever.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from spo_lake.console import progress_bar
from spo_lake.lake import Lake
from spo_lake.lake.appender import BufferedAppender
from spo_lake.lake.sql import where_clause
from spo_lake.pipelines.common import TRAJECTORY_WITH_PROMPT
from spo_lake.rollouts.executors import open_executor
from spo_lake.tasks import Problem, SandboxOptions, Verdict, get_task
from spo_lake.tasks.judge import verdict_row


@dataclass(frozen=True)
class JudgeReport:
    evaluated: int
    passed: int
    already_done: int
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> trajectories that cannot be judged

    def summary(self) -> str:
        rate = f" ({self.passed / self.evaluated:.1%})" if self.evaluated else ""
        skipped = "".join(f"; skipped {n} ({reason})" for reason, n in sorted(self.skipped.items()))
        return f"evaluated {self.evaluated}, passed {self.passed}{rate}; {self.already_done} already evaluated{skipped}"


def unjudgeable(problem: Problem) -> str | None:
    """Why a problem's trajectories cannot be judged (an unknown task, no tests), or None."""
    try:
        task = get_task(problem.task)
    except KeyError:
        return f"unknown task {problem.task!r}"
    if not problem.tests:
        return "prompt has no tests"
    try:
        task.verifier_name(problem)
    except (KeyError, TypeError, ValueError):
        return f"tests lack what task {problem.task!r} needs"
    return None


def pending(lake: Lake, where: str | None = None) -> tuple[list[tuple[str, str, Problem, str]], int, Counter]:
    """(trajectory_id, verifier, problem, response) for every selected trajectory its verifier has not judged,
    how many selected ones were already judged, and how many cannot be judged, by reason."""
    rows = lake.sql(f"""
        SELECT s.*, (SELECT list(e.verifier) FROM evaluations e WHERE e.trajectory_id = s.trajectory_id) AS done
        FROM ({TRAJECTORY_WITH_PROMPT} {where_clause(where)}) s ORDER BY s.trajectory_id""").to_pylist()
    todo: list[tuple[str, str, Problem, str]] = []
    done, skipped = 0, Counter[str]()
    for r in rows:
        problem = Problem.from_row(r)
        reason = unjudgeable(problem)
        if reason is not None:
            skipped[reason] += 1
            continue
        verifier = get_task(problem.task).verifier_name(problem)
        if verifier in (r["done"] or []):
            done += 1
        else:
            todo.append((r["trajectory_id"], verifier, problem, r["response_text"]))
    return todo, done, skipped


def judge(lake: Lake, *, where: str | None = None, options: SandboxOptions = SandboxOptions(),
          workers: int | None = None, flush_rows: int = 500, show_progress: bool = True, executor: str = "local",
          ray_address: str | None = None) -> JudgeReport:
    """Judge every pending trajectory (`where` is SQL over trajectories t joined with prompts p); `executor` 'ray'
    judges in Ray tasks, with the same verdicts as 'local'. Prompts that cannot be judged are counted, by reason."""
    todo, already, skipped = pending(lake, where)
    passed = 0
    with (open_executor(executor, None, workers, ray_address) as running,
          BufferedAppender(lake, flush_rows=flush_rows) as out,
          progress_bar("pass_rate", disable=not show_progress) as bar):
        task_id = bar.add_task("judge", total=len(todo), pass_rate="-")
        finished = 0

        def on_done(indices: list[int], verdicts: list[Verdict]) -> None:
            nonlocal passed, finished
            out.add("evaluations", [verdict_row(todo[i][0], todo[i][1], v) for i, v in zip(indices, verdicts)])
            passed += sum(v.passed for v in verdicts)
            finished += len(verdicts)
            bar.update(task_id, advance=len(verdicts), pass_rate=f"{passed / finished:.1%}")

        running.judge([(p, resp) for _, _, p, resp in todo], options, on_done)
    return JudgeReport(evaluated=len(todo), passed=passed, already_done=already, skipped=dict(skipped))
