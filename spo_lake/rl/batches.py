"""Where a training run's batches came from, per stream and source, rebuilt from the run's record and the lake.

The trainer logs per step only the streams' mean rewards, not which rows it drew. But every draw is determined:
each batch holds `stream_counts(config)` sequences per stream; an online stream's sequences are the run's own
rollouts, written back to the lake under its run_id; a lake stream reads its selection at the pinned snapshot in a
fixed shuffled order per epoch (`DRAWN_SQL`, the order `LakeStream` reads in). So the sequences a lake stream drew in
S steps are the first count·S of that order, and their sources follow. Exact for single-process runs whose lake
streams skipped no row (`lake_rows_skipped` in metrics.jsonl, shown as `skipped`; a skipped row, one longer than
max_response_tokens, takes its place in the order but not in the batch). Not covered: GRPO's `inject` streams (rows
chosen per group and step, not from one order) and the SFT phase of SFT→GRPO; their rows are not listed.
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from spo_lake.lake import Lake
from spo_lake.rl.config import config_from_dict, stream_counts
from spo_lake.rl.data import selection_sql, shuffle_salt, stream_condition
from spo_lake.rl.run import read_metrics

# Per source: the stream's rows in one epoch, and how many of them fall within the first $drawn of epoch $salt's order.
DRAWN_SQL = """
WITH stream AS (SELECT * FROM ({selection}) WHERE {condition}),
ordered AS (SELECT source, row_number() OVER (ORDER BY md5(trajectory_id || $salt), trajectory_id) AS position
            FROM stream)
SELECT source, count(*) AS per_epoch, count(*) FILTER (WHERE position <= $drawn) AS in_partial_epoch
FROM ordered GROUP BY source ORDER BY source
"""


def batch_sources(lake: Lake, run_dir: str | Path) -> pa.Table:
    """(stream, kind, source, sequences, share) over the steps the run has logged."""
    run_dir = Path(run_dir)
    info = json.loads((run_dir / "manifest.json").read_text())
    config = config_from_dict(info["config"])
    steps = [m for m in read_metrics(run_dir) if "loss" in m and m.get("phase") != "sft"]
    skipped = steps[-1].get("lake_rows_skipped", 0) if steps else 0
    rows = []
    for stream, count in zip(config.data.streams, stream_counts(config)):
        if stream.inject:
            continue
        drawn = count * len(steps)
        if stream.kind == "online":
            written = lake.sql("SELECT source, count(*) AS n FROM trajectories WHERE run_id = $run GROUP BY source "
                               "ORDER BY source", params={"run": info["run_id"]}).to_pylist()
            rows += [{"stream": stream.name, "kind": "online", "source": r["source"], "sequences": r["n"]}
                     for r in written]
            continue
        query = DRAWN_SQL.format(selection=selection_sql(),
                                 condition=stream_condition(stream, config.algorithm.name == "spo"))
        size = lake.sql(f"SELECT sum(per_epoch) AS n FROM ({query})", info["snapshot"],
                        params={"salt": "", "drawn": 0, "pi0": config.model.pi0_id}).column("n")[0].as_py() or 0
        epochs, rest = divmod(drawn, size) if size else (0, 0)
        params = {"salt": shuffle_salt(config.run.seed, epochs, stream.name), "drawn": rest, "pi0": config.model.pi0_id}
        for r in lake.sql(query, info["snapshot"], params=params).to_pylist():
            rows.append({"stream": stream.name, "kind": "lake", "source": r["source"],
                         "sequences": epochs * r["per_epoch"] + r["in_partial_epoch"]})
    total = sum(r["sequences"] for r in rows) or 1
    return pa.Table.from_pylist([{**r, "share": round(r["sequences"] / total, 4), "steps": len(steps),
                                  "skipped": skipped} for r in rows])
