"""Buffered, crash-safe commits for long pipelines: rows collected per table, committed in a safe order."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from spo_lake.lake.core import Lake, Work
from spo_lake.lake.upkeep import after_commit

# Commit order inside one flush: facts that reference trajectories first, trajectories last, so a crash between
# commits never leaves a visible trajectory without its facts (and a retry re-uses the orphans it left). A `work`
# claim commits its table first instead (see `Lake.append_many`).
COMMIT_ORDER = ("prompts", "runs", "values", "pivots", "logprobs", "duplicates", "evaluations", "trajectories")


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

    def __enter__(self) -> BufferedAppender:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.flush()  # also on error: what finished is kept, the re-run continues from there
