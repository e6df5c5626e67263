"""Lake analytics: what accumulated rollouts say, as documented SQL that `spolake sql` users can build on.

Every view is a SELECT over the lake's tables at one snapshot (`lake.sql(query, snapshot)`). A trajectory is correct
when its verdict passed (`VERDICT_SQL`: a real verifier's verdict wins over an imported one, the latest among
equals); two correct trajectories of a prompt are the same program when `spolake dedup` gave them the same code hash
(comments, whitespace and names normalised), so "distinct correct programs" only counts deduped trajectories.
`{where}` is an optional SQL condition over trajectories `t`.

- PROMPT_SOLVES_SQL   per prompt (and group: source, run_id or 'all'): samples, correct, solve rate, distinct
                      correct programs, when it was first solved.
- FIRST_SOLVED_SQL    per solved prompt: the source, run and trajectory that solved it first (by created_at).
- COVERAGE_SQL        per source and run: prompts with ≥1 correct solution, and how many of those it solved first.
- HARDEST_SOLVED_SQL  prompts some source solved, lowest π0 Monte-Carlo success rate (Q0, the `values` table) first.
- REPLAY_SQL          past rollouts ranked the way replay buffers sample them (see below).
`solves_over_snapshots` runs PROMPT_SOLVES_SQL at each of several snapshots (e.g. a chain's) and summarises.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from spo_lake.errors import InputError
from spo_lake.lake import Lake
from spo_lake.lake.sql import DEDUP_METHOD, VERDICT_SQL

GROUPS = {"all": "'all'", "source": "t.source", "run_id": "t.run_id"}

PROMPT_SOLVES_SQL = f"""
WITH v AS ({VERDICT_SQL}),
h AS (SELECT trajectory_id, code_hash FROM duplicates WHERE method = '{DEDUP_METHOD}')
SELECT {{group}} AS grp, t.prompt_id, count(*) AS samples,
       count(*) FILTER (WHERE v.passed) AS correct,
       round(count(*) FILTER (WHERE v.passed) / count(*), 4) AS solve_rate,
       count(DISTINCT h.code_hash) FILTER (WHERE v.passed) AS distinct_correct,
       min(t.created_at) FILTER (WHERE v.passed) AS first_solved_at
FROM trajectories t JOIN v USING (trajectory_id) LEFT JOIN h USING (trajectory_id)
WHERE {{where}}
GROUP BY 1, 2 ORDER BY 1, 2
"""

FIRST_SOLVED_SQL = f"""
WITH v AS ({VERDICT_SQL})
SELECT t.prompt_id, t.source, t.run_id, t.trajectory_id, t.created_at AS solved_at
FROM trajectories t JOIN v USING (trajectory_id)
WHERE v.passed AND {{where}}
QUALIFY row_number() OVER (PARTITION BY t.prompt_id ORDER BY t.created_at, t.trajectory_id) = 1
ORDER BY t.prompt_id
"""

COVERAGE_SQL = f"""
WITH v AS ({VERDICT_SQL}),
solved AS (SELECT DISTINCT t.source, t.run_id, t.prompt_id
           FROM trajectories t JOIN v USING (trajectory_id) WHERE v.passed AND {{where}}),
first AS ({FIRST_SOLVED_SQL.format(where="{where}")}),
firsts AS (SELECT source, run_id, count(*) AS first_solved FROM first GROUP BY 1, 2)
SELECT s.source, s.run_id, count(*) AS prompts_solved, coalesce(any_value(f.first_solved), 0) AS first_solved
FROM solved s LEFT JOIN firsts f ON f.source = s.source AND f.run_id IS NOT DISTINCT FROM s.run_id
GROUP BY 1, 2 ORDER BY 1, 2
"""

HARDEST_SOLVED_SQL = f"""
WITH v AS ({VERDICT_SQL}),
q0 AS (SELECT prompt_id, n AS q0_n, n_success AS q0_success FROM "values"
       WHERE trajectory_id IS NULL AND position IS NULL AND temperature = 1.0 AND top_p = 1.0
         AND ($pi0 IS NULL OR model_id = $pi0)
       QUALIFY row_number() OVER (PARTITION BY prompt_id ORDER BY n DESC, created_at DESC) = 1)
SELECT q.prompt_id, q.q0_n, q.q0_success, round(q.q0_success / q.q0_n, 4) AS q0_rate,
       list(DISTINCT t.source ORDER BY t.source) AS solved_by, count(*) AS correct
FROM q0 q JOIN trajectories t USING (prompt_id) JOIN v USING (trajectory_id)
WHERE v.passed AND {{where}}
GROUP BY q.prompt_id, q.q0_n, q.q0_success ORDER BY q0_rate, q.prompt_id LIMIT $limit
"""


# Replay: rollouts with a policy version and a verdict, each with
#   staleness       versions behind the newest rollout of its run (max(policy_version) over the run - its own);
#   group_variance  the variance of the rewards of its group (same run, prompt and policy version: a GRPO group);
#                   0 means every sample of the group agreed, no advantage signal, so such rows are left out (as
#                   DAPO's dynamic sampling drops them);
#   draws           times it may already have been drawn. The lake does not record draws, so this counts the
#                   training runs (`runs.kind = 'train'`) started after the rollout was written: each could have
#                   sampled it, an upper bound;
#   priority        group_variance / (1 + staleness) / (1 + draws): informative, fresh, rarely replayed first.
# Rows more than {max_staleness} versions behind are left out; ties break by trajectory_id (deterministic).
REPLAY_SQL = f"""
WITH v AS ({VERDICT_SQL}),
scored AS (
    SELECT t.trajectory_id, t.prompt_id, t.run_id, t.policy_version, v.reward,
           max(t.policy_version) OVER (PARTITION BY t.run_id) - t.policy_version AS staleness,
           var_pop(v.reward) OVER (PARTITION BY t.run_id, t.prompt_id, t.policy_version) AS group_variance,
           (SELECT count(*) FROM runs r WHERE r.kind = 'train' AND r.created_at > t.created_at) AS draws
    FROM trajectories t JOIN v USING (trajectory_id)
    WHERE t.policy_version IS NOT NULL AND {{where}})
SELECT *, group_variance / (1 + staleness) / (1 + draws) AS priority
FROM scored WHERE staleness <= {{max_staleness}} AND group_variance > 0
ORDER BY priority DESC, trajectory_id
"""


def replay_sql(where: str | None = None, max_staleness: int = 4, limit: int | None = None) -> str:
    """REPLAY_SQL as a query (for `export --query`, `spolake sql`), the top `limit` rows if given."""
    sql = REPLAY_SQL.format(where=_where(where), max_staleness=int(max_staleness)).strip()
    return f"{sql}\nLIMIT {int(limit)}" if limit is not None else sql


def replay_stream_where(where: str | None = None, max_staleness: int = 4, limit: int = 1024) -> str:
    """A lake stream's `where` (`streams.X.where`) that keeps the replay view's top `limit` rollouts."""
    return f"trajectory_id IN (SELECT trajectory_id FROM ({replay_sql(where, max_staleness, limit)}))"


def replay(lake: Lake, snapshot: str | None = None, where: str | None = None, max_staleness: int = 4,
           limit: int | None = None) -> pa.Table:
    return lake.sql(replay_sql(where, max_staleness, limit), snapshot)


def _where(where: str | None) -> str:
    return f"({where})" if where else "TRUE"


def prompt_solves(lake: Lake, snapshot: str | None = None, where: str | None = None,
                  group_by: str = "all", params: dict[str, Any] | None = None) -> pa.Table:
    """`params` bind the `$name` placeholders of `where`."""
    if group_by not in GROUPS:
        raise InputError(f"--group-by {group_by!r}: one of {', '.join(GROUPS)}")
    return lake.sql(PROMPT_SOLVES_SQL.format(group=GROUPS[group_by], where=_where(where)), snapshot, params=params)


def first_solved(lake: Lake, snapshot: str | None = None, where: str | None = None) -> pa.Table:
    return lake.sql(FIRST_SOLVED_SQL.format(where=_where(where)), snapshot)


def coverage(lake: Lake, snapshot: str | None = None, where: str | None = None) -> pa.Table:
    return lake.sql(COVERAGE_SQL.format(where=_where(where)), snapshot)


def hardest_solved(lake: Lake, snapshot: str | None = None, where: str | None = None, pi0: str | None = None,
                   limit: int = 20) -> pa.Table:
    return lake.sql(HARDEST_SOLVED_SQL.format(where=_where(where)), snapshot, params={"pi0": pi0, "limit": limit})


def solves_over_snapshots(lake: Lake, snapshots: Sequence[str | None], where: str | None = None,
                          group_by: str = "all") -> pa.Table:
    """Per snapshot (and group): prompts sampled, prompts solved, mean solve rate and mean distinct correct
    programs per sampled prompt."""
    rows: list[dict[str, Any]] = []
    for name in snapshots:
        per_prompt = prompt_solves(lake, name, where, group_by).to_pylist()
        for grp in dict.fromkeys(r["grp"] for r in per_prompt):  # the query's order; a missing run id last
            mine = [r for r in per_prompt if r["grp"] == grp]
            rows.append({"snapshot": name, "group": grp, "prompts": len(mine),
                         "solved": sum(r["correct"] > 0 for r in mine),
                         "mean_solve_rate": round(sum(r["correct"] / r["samples"] for r in mine) / len(mine), 4),
                         "mean_distinct_correct": round(sum(r["distinct_correct"] for r in mine) / len(mine), 4)})
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("snapshot", pa.string()), ("group", pa.string()), ("prompts", pa.int64()), ("solved", pa.int64()),
        ("mean_solve_rate", pa.float64()), ("mean_distinct_correct", pa.float64())]))


def plot_solves(table: pa.Table, path: Path) -> None:
    """Solved prompts and mean distinct correct programs per prompt, per group, across the snapshots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table.to_pylist()
    snapshots = list(dict.fromkeys(r["snapshot"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for grp in dict.fromkeys(r["group"] for r in rows):
        mine = {r["snapshot"]: r for r in rows if r["group"] == grp}
        x = [i for i, s in enumerate(snapshots) if s in mine]
        for ax, key in zip(axes, ("solved", "mean_distinct_correct")):
            ax.plot(x, [mine[snapshots[i]][key] for i in x], marker="o", label="∅" if grp is None else grp)
    for ax, title in zip(axes, ("prompts with ≥1 correct solution", "distinct correct programs per prompt")):
        ax.set_xticks(range(len(snapshots)), snapshots, rotation=30, ha="right")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_coverage(table: pa.Table, path: Path) -> None:
    """Prompts solved (and solved first) per source/run, as horizontal bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table.to_pylist()
    labels = [f"{r['source']} · {r['run_id'] or '∅'}" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.5))
    ax.barh(labels, [r["prompts_solved"] for r in rows], label="prompts solved")
    ax.barh(labels, [r["first_solved"] for r in rows], label="solved first")
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    ax.set_title("coverage per source and run")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
