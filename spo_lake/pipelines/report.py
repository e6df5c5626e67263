"""`spolake report passk`: pass@k per source / model / run over the lake's evaluations (unbiased estimator)."""
from __future__ import annotations

from collections import defaultdict

import pyarrow as pa

from spo_lake.errors import InputError
from spo_lake.lake import Lake, Snapshot
from spo_lake.lake.sql import VERDICT_SQL, where_clause
from spo_lake.scores import pass_at_k

GROUPS = {"source": "t.source", "model": "t.model_id", "run_id": "t.run_id", "prompt": "t.prompt_id", "none": "'all'"}


def passk_counts(lake: Lake, group_by: str = "source", snapshot: str | Snapshot | None = None,
                 where: str | None = None) -> list[dict]:
    """(group, prompt_id, n, c) for every evaluated (group, prompt)."""
    if group_by not in GROUPS:
        raise InputError(f"--group-by {group_by!r}: one of {', '.join(GROUPS)}")
    return lake.sql(f"""
        SELECT CAST({GROUPS[group_by]} AS VARCHAR) AS grp, t.prompt_id, count(*) AS n,
               CAST(count(*) FILTER (WHERE v.passed) AS BIGINT) AS c
        FROM trajectories t JOIN ({VERDICT_SQL}) v USING (trajectory_id) {where_clause(where)}
        GROUP BY 1, 2 ORDER BY 1, 2""", snapshot).to_pylist()


def passk_table(counts: list[dict], ks: list[int]) -> pa.Table:
    """Mean pass@k over prompts per group, in `counts`' order; a prompt counts for k only if it has at least k
    samples. Its columns are the same with no rows (nothing evaluated yet)."""
    by_group: dict[str | None, list[tuple[int, int]]] = defaultdict(list)
    for r in counts:
        by_group[r["grp"]].append((r["n"], r["c"]))
    rows = []
    for grp, nc in by_group.items():
        row: dict = {"group": grp, "prompts": len(nc), "samples": sum(n for n, _ in nc)}
        for k in ks:
            eligible = [pass_at_k(n, c, k) for n, c in nc if n >= k]
            row[f"pass@{k}"] = round(sum(eligible) / len(eligible), 4) if eligible else None
            row[f"prompts@{k}"] = len(eligible)
        rows.append(row)
    columns = [("group", pa.string()), ("prompts", pa.int64()), ("samples", pa.int64())]
    columns += [c for k in ks for c in ((f"pass@{k}", pa.float64()), (f"prompts@{k}", pa.int64()))]
    return pa.Table.from_pylist(rows, schema=pa.schema(columns))
