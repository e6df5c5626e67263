"""Two copies of every fact-appending pipeline started at once produce exactly the rows one copy would, on a local
lake and on a real S3-compatible server (SeaweedFS on 127.0.0.1): keyed facts (verdicts, hashes, log-probs) are
added only if absent, and sampling pipelines re-count their quota when a copy committed first (`Work`)."""
from __future__ import annotations

import pytest

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from tests.lake.test_concurrent_commits import lake_at, run_all, s3_options  # noqa: F401 (fixtures)

SHORT = "24"


def one(lake: Lake, query: str) -> int:
    return lake.sql(query).column(0)[0].as_py()


# a dozen spolake processes racing (minutes under load): integration even on a local lake
@pytest.mark.integration
def test_two_copies_of_each_pipeline_add_what_one_would(lake_at, scripted_model_dir):  # noqa: F811 (the fixture)
    root, extra, options = lake_at
    lake = Lake.init(root, storage_options=options)
    ingest_dataset(lake, "countdown", None, n=4, seed=0)  # 4 prompts and their solver's solutions
    model = ["--model", str(scripted_model_dir)]  # plumbing: any model loaded by path

    def twice(*cmd: str) -> list[list[str]]:
        return [list(cmd), list(cmd)]

    # Sampling: n per prompt (T=0.7, so q0 does not count these) and k π0 samples per prompt, whoever draws them.
    sample = ["sample", *model, "--n", "2", "--temperature", "0.7", "--source", "policy", "--evaluate",
              "--max-new-tokens", SHORT]
    results = run_all(root, extra, [*twice(*sample), *twice("q0", *model, "--k", "3", "--max-new-tokens", SHORT)])
    assert [rc for rc, _ in results] == [0] * 4, results
    per_prompt = lake.sql("""SELECT prompt_id, count(*) FILTER (WHERE source = 'policy') AS policy,
                                    count(*) FILTER (WHERE source = 'reference') AS reference
                             FROM trajectories GROUP BY ALL""").to_pylist()
    assert {(r["policy"], r["reference"]) for r in per_prompt} == {(2, 3)} and len(per_prompt) == 4
    assert one(lake, """SELECT count(*) FROM trajectories t WHERE source IN ('policy', 'reference')
                        AND (SELECT count(*) FROM evaluations e WHERE e.trajectory_id = t.trajectory_id) <> 1""") == 0
    values = lake.sql("SELECT prompt_id, n FROM \"values\" WHERE trajectory_id IS NULL").to_pylist()
    assert sorted(r["n"] for r in values) == [3] * 4  # one count row per prompt

    # Keyed facts: one verdict, one hash and one log-prob row per trajectory however many copies ran.
    results = run_all(root, extra, [*twice("evaluate"), *twice("dedup"), *twice("refprobs", *model)])
    assert [rc for rc, _ in results] == [0] * 6, results
    trajectories = one(lake, "SELECT count(*) FROM trajectories")
    assert one(lake, "SELECT count(*) FROM evaluations WHERE verifier <> 'imported'") == trajectories
    assert one(lake, "SELECT count(DISTINCT (trajectory_id, verifier)) FROM evaluations") == \
        one(lake, "SELECT count(*) FROM evaluations")
    assert one(lake, "SELECT count(*) FROM duplicates") == trajectories
    assert one(lake, "SELECT count(*) FROM logprobs") == trajectories

    # PTS: each successful trajectory is searched by one copy only (its values, pivots and rollouts carry one run).
    results = run_all(root, extra, twice("pts", *model, "--k", "2", "--s0-range", "0", "1", "--max-new-tokens", SHORT))
    assert [rc for rc, _ in results] == [0, 0], results
    searched = lake.sql("""SELECT trajectory_id, count(DISTINCT run_id) AS runs FROM "values"
                            WHERE trajectory_id IS NOT NULL GROUP BY ALL""").to_pylist()
    assert searched and {r["runs"] for r in searched} == {1}
    assert one(lake, """SELECT count(*) FROM (SELECT prefix_trajectory_id FROM trajectories
                        WHERE source = 'pts_rollout' GROUP BY ALL HAVING count(DISTINCT run_id) > 1)""") == 0
    assert one(lake, "SELECT count(*) FROM pivots") == \
        one(lake, "SELECT count(DISTINCT (trajectory_id, model_id, position)) FROM pivots")
