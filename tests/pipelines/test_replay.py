"""The replay view ranks constructed rollouts by reward variance in their group, staleness and (approximate) draws."""
from __future__ import annotations

import pytest

from spo_lake import Lake, export, ingest
from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.pipelines.views import replay, replay_sql, replay_stream_where
from spo_lake.rl.data import selection_sql


def group(prompt: int, version: int, rewards: list[float]) -> list[dict]:
    return [{"prompt_id": f"countdown/0/{prompt}", "response": f"{prompt}-{version}-{i}", "reward": r,
             "policy_version": version, "run_id": "r"} for i, r in enumerate(rewards)]


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Lake:
    lake = Lake.init(tmp_path_factory.mktemp("replay") / "lake")
    ingest_dataset(lake, "countdown", None, n=4, seed=0)  # human solutions: no policy version, never replayed
    ingest(lake, group(0, 0, [0, -1]), source="trl-grpo", model="m")  # then a training run starts: 1 draw
    lake.append("runs", [{"run_id": "train-1", "kind": "train", "status": "finished"}])
    ingest(lake, group(0, 2, [0, -1]) + group(2, 2, [0, -1, -1, -1]) + group(1, 2, [0, 0]) + group(3, 1, [-1, 0]),
           source="trl-grpo", model="m")
    lake.snapshot("replay")
    return lake


def test_replay_orders_by_variance_over_staleness_and_draws(lake):
    got = replay(lake, "replay").to_pylist()
    keys = [(r["prompt_id"][-1], r["policy_version"], r["staleness"], r["draws"]) for r in got]
    assert keys == [("0", 2, 0, 0)] * 2 + [("2", 2, 0, 0)] * 4 + [("3", 1, 1, 0)] * 2 + [("0", 0, 2, 1)] * 2
    assert [r["priority"] for r in got] == pytest.approx([0.25] * 2 + [0.1875] * 4 + [0.125] * 2 + [0.25 / 6] * 2)
    assert all(got[i]["trajectory_id"] < got[i + 1]["trajectory_id"] for i in (0, 2, 3, 4))  # ties: by id
    assert [r["policy_version"] for r in replay(lake, "replay", max_staleness=1).to_pylist()] == [2] * 6 + [1] * 2


def test_replay_as_a_lake_stream_where_and_an_export_query(lake):
    top = [r["trajectory_id"] for r in replay(lake, "replay", limit=3).to_pylist()]
    streamed = lake.sql(f"SELECT trajectory_id FROM ({selection_sql()}) WHERE {replay_stream_where(limit=3)} "
                        "ORDER BY 1", "replay", params={"pi0": "m"}).column("trajectory_id").to_pylist()
    assert streamed == sorted(top)
    exported = export(lake, "replay", "sft", query=replay_sql(limit=3)).table
    assert sorted(exported.column("trajectory_id").to_pylist()) == sorted(top)
