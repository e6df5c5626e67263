"""What pipelines share: selecting trajectories with their prompts, buffered crash-safe commits, progress."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from spo_lake.lake import Lake, Work
from spo_lake.lake.upkeep import after_commit

# Commit order inside one flush: facts that reference trajectories first, trajectories last, so a crash between
# commits never leaves a visible trajectory without its facts (and a retry re-uses the orphans it left). A `work`
# claim commits its table first instead (see `Lake.append_many`).
COMMIT_ORDER = ("prompts", "runs", "values", "pivots", "logprobs", "duplicates", "evaluations", "trajectories")

TRAJECTORY_WITH_PROMPT = """
SELECT t.*, p.task, p.prompt, p.tests, p.time_limit_s, p.memory_limit_mb, p.metadata AS prompt_metadata
FROM trajectories t JOIN prompts p USING (prompt_id)
"""


def new_run_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def where_clause(where: str | None) -> str:
    return f"WHERE ({where})" if where else ""


@dataclass
class BufferedAppender:
    """Collects rows per table and commits them every `flush_rows` rows or `flush_seconds` seconds.

    Long pipelines commit as they go, so a killed run keeps what it finished and a re-run skips it; every commit is
    followed by the lake's upkeep (`after_commit`), so thousands of them keep appends and queries fast. Facts with a
    key (verdicts, hashes, log-probs...) are added only if absent, so copies of a pipeline running at once cannot
    record one twice; pipelines whose rows have no natural key (samples) pass their `work` claim (see `Work`).
    """

    lake: Lake
    flush_rows: int = 1000
    flush_seconds: float = 60.0
    work: Work | None = None
    _rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _last: float = field(default_factory=time.monotonic)
    committed: dict[str, int] = field(default_factory=dict)

    def add(self, table: str, rows: list[dict[str, Any]]) -> None:
        self._rows.setdefault(table, []).extend(rows)
        if sum(map(len, self._rows.values())) >= self.flush_rows or time.monotonic() - self._last >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        ordered = {t: self._rows[t] for t in COMMIT_ORDER if self._rows.get(t)}
        if ordered:
            versions = self.lake.append_many(ordered, work=self.work)
            for t, rows in ordered.items():
                self.committed[t] = self.committed.get(t, 0) + len(rows)
            for t, version in versions.items():
                after_commit(self.lake, t, version)
        self._rows = {}
        self._last = time.monotonic()

    def __enter__(self) -> "BufferedAppender":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.flush()  # also on error: what finished is kept, the re-run continues from there


def sample_quota(missing: Callable[[], dict[str, int]]) -> Callable[[dict[str, list]], dict[str, list]]:
    """A `Work.replan` for sampling pipelines: keep, per prompt, only as many buffered samples as `missing()` (read
    from the lake now, after other copies' commits) still asks for, and the verdicts of the samples kept."""
    def replan(batches: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
        left = missing()
        kept = []
        for row in batches.get("trajectories", []):
            if left.get(row["prompt_id"], 0) > 0:
                left[row["prompt_id"]] -= 1
                kept.append(row)
        ids = {r["trajectory_id"] for r in kept}
        out = {t: [r for r in rows if r["trajectory_id"] in ids] for t, rows in batches.items()}
        return {**out, "trajectories": kept} if "trajectories" in batches else out
    return replan


def progress_bar(*extra: str, disable: bool = False) -> Progress:
    """A rich progress bar on stderr; `extra` names fields shown after the bar (e.g. 'pass_rate')."""
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn()]
    columns += [TextColumn(f"{name}={{task.fields[{name}]}}") for name in extra]
    from spo_lake.cli.common import console

    return Progress(*columns, console=console, disable=disable, transient=False)
