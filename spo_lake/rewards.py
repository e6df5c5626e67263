"""The task verifiers as TRL-compatible reward functions.

    from trl import GRPOTrainer
    from spo_lake import export, verifier_reward

    prompts = export(lake, "exp-1", shape="prompt").to_dataset()
    trainer = GRPOTrainer(model=..., reward_funcs=verifier_reward(), train_dataset=prompts)

TRL calls a reward function with the prompts, the completions and every other column of the dataset as keyword
lists; the `prompt` export carries what a verifier needs (`task`, `problem`, `tests`, limits, `prompt_metadata`).
Every completion is judged the way `spolake judge` judges it: by its task's verifier, with generated code run only
inside the sandbox (bubblewrap unless `options` says otherwise). Rewards follow the lake: 0 for a pass, -1 otherwise
(group-normalised advantages make that the same signal as 1/0). A row whose task spo-lake does not know gets None,
which TRL reads as "this reward function does not apply".
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spo_lake.tasks import Problem, SandboxOptions, Verdict, get_task, task_names
from spo_lake.tasks.judge import judge_many


def completion_text(completion: str | Sequence[dict[str, Any]]) -> str:
    """A completion as text: itself, or the contents of the assistant messages of a conversational completion."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in completion if m.get("role") == "assistant")


def problems_from_columns(n: int, columns: dict[str, list[Any]]) -> list[Problem | None]:
    """The problem of each of `n` rows from the `prompt` export's columns (None where the task is unknown)."""
    known = set(task_names())
    out: list[Problem | None] = []
    for i in range(n):
        row = {k: columns[k][i] if k in columns else None for k in ("prompt_id", "task", "problem", "tests",
                                                                     "time_limit_s", "memory_limit_mb",
                                                                     "prompt_metadata")}
        if row["task"] not in known:
            out.append(None)
            continue
        out.append(Problem.from_row({**row, "prompt": row["problem"], "metadata": row["prompt_metadata"]}))
    return out


class VerifierReward:
    """The reward function `verifier_reward` returns: callable like any TRL reward function, and `verdicts` gives
    the verdicts themselves (with the verifier's name), for callers that record them (`spo_lake.trl_lake`)."""

    __name__ = "spo_lake_verifier"  # TRL names a reward function's metrics after it

    def __init__(self, options: SandboxOptions, workers: int | None) -> None:
        self.options, self.workers = options, workers

    def verdicts(self, completions: list[Any], columns: dict[str, Any]) -> list[tuple[str, Verdict] | None]:
        """(verifier name, verdict) of each completion; None where the row's task is unknown."""
        missing = [c for c in ("task", "problem", "tests") if c not in columns]
        if missing:
            raise KeyError(f"spo_lake_verifier needs the columns of `spolake export --shape prompt`; missing "
                           f"{', '.join(missing)}")
        problems = problems_from_columns(len(completions), columns)
        todo = [(i, p) for i, p in enumerate(problems) if p is not None]
        judged = judge_many([(p, completion_text(completions[i])) for i, p in todo], self.options, self.workers)
        out: list[tuple[str, Verdict] | None] = [None] * len(completions)
        for (i, p), verdict in zip(todo, judged):
            out[i] = (get_task(p.task).verifier_name(p), verdict)
        return out

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        return [None if v is None else v[1].reward for v in self.verdicts(completions, columns)]


def verifier_reward(options: SandboxOptions = SandboxOptions(), workers: int | None = None) -> VerifierReward:
    """A reward function for TRL trainers (GRPO, RLOO, ...) that judges completions with the tasks' verifiers.

    `options` are the sandbox limits and mode (bubblewrap by default; `mode="none"` runs generated code unsandboxed
    and is for trusted data only); `workers` the parallel sandboxes (default: cores). Needs the columns of
    `export(..., shape="prompt")` in the training dataset. Returns 0.0 (pass), -1.0 (fail) or None (unknown task).
    """
    return VerifierReward(options, workers)


__all__ = ["VerifierReward", "completion_text", "problems_from_columns", "verifier_reward"]
