"""`spolake dedup`: group trajectories of one prompt whose normalised code is identical.

Raw rows are never deleted. Each trajectory gets one immutable `duplicates` row (its code hash under a
normalisation method); groups, canonical rows and the set of sources that found a program are derived in SQL
(`CANONICAL_SQL`), so they stay right as new trajectories arrive.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from spo_lake.console import progress_bar
from spo_lake.lake import Lake
from spo_lake.lake.appender import BufferedAppender
from spo_lake.lake.sql import CANONICAL_SQL, DEDUP_METHOD, where_clause
from spo_lake.pipelines.common import TRAJECTORY_WITH_PROMPT
from spo_lake.tasks.extract import extract_code
from spo_lake.tasks.normalize import code_hash, normalize_text


@dataclass(frozen=True)
class DedupReport:
    hashed: int
    groups: int
    duplicates: int

    def summary(self) -> str:
        return (f"hashed {self.hashed} new trajectories; {self.groups} distinct programs, {self.duplicates} "
                "duplicate rows")


def program_hash(task: str, response: str) -> str:
    """Python tasks hash their extracted program by tokens; other tasks (countdown) by normalised text."""
    if task == "countdown":
        from spo_lake.tasks.countdown import extract_answer

        return hashlib.sha256(normalize_text(extract_answer(response)).replace(" ", "").encode()).hexdigest()
    return code_hash(extract_code(response).code)


def dedup(lake: Lake, *, where: str | None = None, show_progress: bool = True) -> DedupReport:
    rows = lake.sql(f"""
        SELECT s.trajectory_id, s.prompt_id, s.task, s.response_text
        FROM ({TRAJECTORY_WITH_PROMPT} {where_clause(where)}) s
        WHERE NOT EXISTS (SELECT 1 FROM duplicates d
                          WHERE d.trajectory_id = s.trajectory_id AND d.method = '{DEDUP_METHOD}')
        ORDER BY s.trajectory_id""").to_pylist()
    with BufferedAppender(lake, flush_rows=50_000) as out, progress_bar(disable=not show_progress) as bar:
        task_id = bar.add_task("dedup", total=len(rows))
        for r in rows:
            out.add("duplicates", [{"trajectory_id": r["trajectory_id"], "prompt_id": r["prompt_id"],
                                    "code_hash": program_hash(r["task"], r["response_text"]), "method": DEDUP_METHOD}])
            bar.advance(task_id)
    stats = lake.sql(f"SELECT count(*) AS groups, coalesce(sum(group_size - 1), 0) AS dups FROM ({CANONICAL_SQL})"
                     ).to_pylist()[0]
    return DedupReport(hashed=len(rows), groups=stats["groups"], duplicates=int(stats["dups"]))
