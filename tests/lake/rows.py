"""Rows for lake tests."""
from __future__ import annotations


def trajectory_rows(n: int, start: int = 0, prompt_id: str = "p0") -> list[dict]:
    """Rows conforming to the trajectories contract (what the lake stores, not what ingest reads)."""
    return [{"trajectory_id": f"t{i:05d}", "prompt_id": prompt_id, "source": "policy", "response_text": f"x = {i}",
             "token_ids": [i, i + 1], "behavior_logprobs": [-0.5, -0.25], "response_hash": f"h{i}"}
            for i in range(start, start + n)]
