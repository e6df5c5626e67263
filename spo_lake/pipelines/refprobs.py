"""`spolake refprobs`: cache a (reference) model's per-token log-probs of trajectories in `logprobs`.

The trainer reads these instead of running the reference model on lake data. A trajectory is scored on the token
ids it carries when they belong to this model's tokenizer; otherwise (text-only rows, other tokenizers) its text is
tokenised with this model's tokenizer, and the row records the token ids that were scored. The prompt is the task's
plain prompt format (what the trainer conditions πθ on), even for rows sampled under a template.
Incremental: trajectories already cached for this model are skipped.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from spo_lake.console import progress_bar
from spo_lake.errors import InputError
from spo_lake.lake import Lake
from spo_lake.lake.appender import BufferedAppender
from spo_lake.lake.rows import recorded_run
from spo_lake.lake.sql import where_clause
from spo_lake.models.backend import PolicyBackend
from spo_lake.models.tokens import tokenizer_id, trajectory_token_ids
from spo_lake.pipelines.common import TRAJECTORY_WITH_PROMPT


@dataclass
class RefprobsReport:
    scored: int = 0
    tokenized: int = 0
    already_cached: int = 0
    tokens: int = 0
    seconds: float = 0.0
    run_id: str = ""

    def summary(self) -> str:
        rate = f", {self.tokens / self.seconds:.0f} tokens/s" if self.seconds else ""
        return (f"scored {self.scored} trajectories ({self.tokenized} tokenised from text){rate}; "
                f"{self.already_cached} already cached")


def pending(lake: Lake, model_id: str, where: str | None) -> tuple[list[dict[str, Any]], int]:
    """Selected trajectories (with their prompts) not yet cached for this model, and how many already are."""
    selected = f"({TRAJECTORY_WITH_PROMPT} {where_clause(where)}) s"
    cached = "EXISTS (SELECT 1 FROM logprobs l WHERE l.trajectory_id = s.trajectory_id AND l.model_id = $model_id)"
    params = {"model_id": model_id}
    todo = lake.sql(f"SELECT s.* FROM {selected} WHERE NOT {cached} ORDER BY s.trajectory_id",
                    params=params).to_pylist()
    done = lake.sql(f"SELECT count(*) AS n FROM {selected} WHERE {cached}", params=params).column("n")[0].as_py()
    return todo, done


def refprobs(lake: Lake, model: PolicyBackend, *, where: str | None = None, batch_size: int = 16,
             flush_rows: int = 2000, show_progress: bool = True) -> RefprobsReport:
    """Score every selected trajectory (`where` is SQL over trajectories t joined with prompts p) not yet cached."""
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    todo, cached = pending(lake, model.model_id, where)
    report = RefprobsReport(already_cached=cached)
    tok_id = tokenizer_id(model)
    config = {"model_id": model.model_id, "tokenizer_id": tok_id, "where": where, "batch_size": batch_size,
              "backend": model.precision[0], "dtype": model.precision[1]}
    started = time.perf_counter()
    with recorded_run(lake, "refprobs", config) as run, BufferedAppender(lake, flush_rows=flush_rows) as out, \
            progress_bar("tokens_per_s", disable=not show_progress) as bar:
        report.run_id = run.run_id
        task_id = bar.add_task("refprobs", total=len(todo), tokens_per_s="-")
        pairs = []
        for r in todo:
            prompt_ids, response_ids, tokenized = trajectory_token_ids(model, tok_id, r)
            pairs.append((prompt_ids, response_ids))
            report.tokenized += tokenized
        # Similar lengths per batch: less padding to compute.
        order = sorted(range(len(todo)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            scores = model.score([pairs[i][0] for i in chunk], [pairs[i][1] for i in chunk], batch_size=batch_size)
            backend, dtype = model.precision
            out.add("logprobs", [{"trajectory_id": todo[i]["trajectory_id"], "model_id": model.model_id,
                                  "tokenizer_id": tok_id, "token_ids": pairs[i][1], "logprobs": lp,
                                  "backend": backend, "dtype": dtype}
                                 for i, lp in zip(chunk, scores)])
            report.scored += len(chunk)
            report.tokens += sum(len(pairs[i][1]) for i in chunk)
            report.seconds = time.perf_counter() - started
            bar.update(task_id, advance=len(chunk), tokens_per_s=f"{report.tokens / report.seconds:.0f}")
        out.flush()
        run.metrics.update(scored=report.scored, tokenized=report.tokenized, tokens=report.tokens,
                           seconds=round(report.seconds, 3))
    return report

