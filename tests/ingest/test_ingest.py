from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from spo_lake.ingest import (
    PROMPT_FIELDS,
    TRAJECTORY_FIELDS,
    IngestError,
    add_prompts,
    from_arrow,
    from_records,
    ingest_trajectories,
    located,
)
from spo_lake.lake import Lake
from spo_lake.tasks.normalize import response_hash


@pytest.fixture
def lake(tmp_path) -> Lake:
    lake = Lake.init(tmp_path / "lake")
    add_prompts(lake, prompts([{"prompt_id": "p1", "task": "countdown", "prompt": "reach 10"}]))
    return lake


def prompts(rows: list[dict]):
    return from_records(located(rows, "prompts.jsonl"), PROMPT_FIELDS, "prompts")


def trajectories(rows: list[dict]):
    return from_records(located(rows, "in.jsonl"), TRAJECTORY_FIELDS, "trajectories")


def test_reingest_is_a_reported_noop_and_identical_samples_stay_distinct(lake):
    rows = [{"prompt_id": "p1", "response": "x = 1\n"}, {"prompt_id": "p1", "response": "x = 1\n"},
            {"prompt_id": "p1", "response": "x = 2"}]
    first = ingest_trajectories(lake, trajectories(rows), source="policy")
    assert (first.new, first.present) == (3, 0)
    version = lake.versions()
    again = ingest_trajectories(lake, trajectories(rows), source="policy")
    assert again.summary() == "0 new, 3 already present"
    assert lake.versions() == version
    stored = lake.sql("SELECT response_text, response_hash FROM trajectories ORDER BY response_text").to_pylist()
    assert [r["response_text"] for r in stored] == ["x = 1\n", "x = 1\n", "x = 2"]
    assert all(r["response_hash"] == response_hash(r["response_text"]) for r in stored)
    # a third identical sample in a later input is new: it is the third occurrence there
    more = ingest_trajectories(lake, trajectories(rows[:1] * 3), source="policy")
    assert (more.new, more.present) == (1, 2)


def test_imported_rewards_become_evaluations_and_defaults_fill_fields(lake):
    rows = [{"prompt_id": "p1", "response": "a", "reward": 0.0, "token_ids": [5, 6], "logprobs": [-0.1, -2.0]},
            {"prompt_id": "p1", "response": "b", "reward": -1, "model": "own-model"},
            {"prompt_id": "p1", "response": "c"}]
    report = ingest_trajectories(lake, trajectories(rows), source="reference",
                                 defaults={"model": "default-model", "run_id": "r1", "tokenizer": "gpt2"})
    assert report.summary() == "3 new, 0 already present; 2 imported verdicts"
    got = lake.sql("""SELECT t.response_text, t.model_id, t.run_id, t.tokenizer_id, t.source, t.token_ids,
                             e.verifier, e.passed, e.reward
                      FROM trajectories t LEFT JOIN evaluations e USING (trajectory_id) ORDER BY 1""").to_pylist()
    assert [(g["model_id"], g["run_id"], g["tokenizer_id"], g["source"]) for g in got] == [
        ("default-model", "r1", "gpt2", "reference"), ("own-model", "r1", "gpt2", "reference"),
        ("default-model", "r1", "gpt2", "reference")]
    assert [(g["verifier"], g["passed"], g["reward"]) for g in got] == [
        ("imported", True, 0.0), ("imported", False, -1.0), (None, None, None)]
    assert got[0]["token_ids"] == [5, 6]


def test_prompts_are_created_from_trajectory_records_and_checked_against_the_lake(lake):
    rows = [{"prompt_id": "p2", "prompt": "reach 7", "response": "a"}, {"prompt_id": "p2", "response": "b"}]
    with pytest.raises(IngestError, match=r"in.jsonl:record 1: field 'task'"):
        ingest_trajectories(lake, trajectories(rows), source="policy")
    report = ingest_trajectories(lake, trajectories(rows), source="policy", task="countdown")
    assert (report.new, report.prompts_new) == (2, 1)
    assert lake.sql("SELECT task, prompt FROM prompts WHERE prompt_id = 'p2'").to_pylist() == [
        {"task": "countdown", "prompt": "reach 7"}]
    with pytest.raises(IngestError, match=r"record 1: field 'prompt': differs from prompt 'p1' in the lake"):
        ingest_trajectories(lake, trajectories([{"prompt_id": "p1", "prompt": "other", "response": "a"}]), source="policy")
    with pytest.raises(IngestError, match=r"record 2: field 'prompt_id': 'p9' is not in the lake"):
        ingest_trajectories(lake, trajectories([{"prompt_id": "p1", "response": "a"}, {"prompt_id": "p9", "response": "a"}]),
                            source="policy")
    with pytest.raises(IngestError, match=r"record 2: field 'prompt': differs from an earlier row of prompt 'p3'"):
        ingest_trajectories(lake, trajectories([{"prompt_id": "p3", "prompt": "x", "response": "a"},
                                                {"prompt_id": "p3", "prompt": "y", "response": "b"}]),
                            source="policy", task="countdown")


def test_add_prompts_is_idempotent_and_refuses_changed_content(lake):
    row = {"prompt_id": "p5", "task": "countdown", "prompt": "reach 3", "tests": {"public": [{"input": "1", "output": "2"}]},
           "time_limit_s": 2.0}
    assert add_prompts(lake, prompts([row])).summary() == "1 new, 0 already present"
    same = {**row, "tests": {"public": [{"output": "2", "input": "1"}]}}  # key order does not matter
    assert add_prompts(lake, prompts([same])).summary() == "0 new, 1 already present"
    with pytest.raises(IngestError, match=r"record 1: field 'time_limit_s': prompt 'p5' is already in the lake"):
        add_prompts(lake, prompts([{**row, "time_limit_s": 3.0}]))
    with pytest.raises(IngestError, match=r"record 2: field 'prompt_id': duplicate 'p6'"):
        add_prompts(lake, prompts([{**row, "prompt_id": "p6"}, {**row, "prompt_id": "p6"}]))
    assert lake.count("prompts") == 2


def test_arrow_input_types_are_checked_per_column_and_nested_metadata_becomes_json(lake):
    table = pa.table({
        "prompt_id": pa.array(["p1", "p1"], pa.large_string()),
        "response": ["a", "b"],
        "token_ids": pa.array([[1, 2], [3]], pa.large_list(pa.int64())),
        "logprobs": pa.array([[-1.0, -0.5], [-0.1]], pa.list_(pa.float32())),
        "metadata": pa.array([{"k": 1}, None], pa.struct([("k", pa.int64())])),
    })
    report = ingest_trajectories(lake, from_arrow(table, TRAJECTORY_FIELDS, "x.parquet", "trajectories"), source="import")
    assert report.new == 2
    got = lake.sql("SELECT token_ids, metadata FROM trajectories ORDER BY response_text").to_pylist()
    assert got == [{"token_ids": [1, 2], "metadata": '{"k": 1}'}, {"token_ids": [3], "metadata": None}]
    bad = table.set_column(2, "token_ids", pa.array([[1, None], [3]], pa.list_(pa.int64())))
    with pytest.raises(IngestError, match=r"x.parquet:row 1: field 'token_ids': element 1 is null"):
        ingest_trajectories(lake, from_arrow(bad, TRAJECTORY_FIELDS, "x.parquet", "trajectories"), source="import")


def test_given_trajectory_ids_must_be_unique_within_an_input(lake):
    rows = [{"trajectory_id": "t1", "prompt_id": "p1", "response": "a"},
            {"trajectory_id": "t1", "prompt_id": "p1", "response": "b"}]
    with pytest.raises(IngestError, match=r"record 2: field 'trajectory_id': duplicate 't1'"):
        ingest_trajectories(lake, trajectories(rows), source="policy")


def test_concurrent_ingests_of_the_same_input_add_each_row_once(lake):
    rows = [{"prompt_id": "p1", "response": f"r{i}", "reward": 0.0} for i in range(200)]
    reports, errors = [], []

    def run() -> None:
        try:
            reports.append(ingest_trajectories(lake, trajectories(rows), source="policy"))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(r.new for r in reports) == 200 and sum(r.present for r in reports) == 400
    assert lake.sql("SELECT count(*) AS n, count(DISTINCT trajectory_id) AS d FROM trajectories").to_pylist() == [
        {"n": 200, "d": 200}]
    assert lake.count("evaluations") == 200
