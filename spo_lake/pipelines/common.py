"""What the pipelines share: selecting trajectories with their prompts, and the quota of sampling claims."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

TRAJECTORY_WITH_PROMPT = """
SELECT t.*, p.task, p.prompt, p.tests, p.time_limit_s, p.memory_limit_mb, p.metadata AS prompt_metadata
FROM trajectories t JOIN prompts p USING (prompt_id)
"""


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
