"""Streamed ingest: batches give exactly the rows one whole-input ingest gives, a bad row in a late batch commits
nothing and leaves no staged file, and separate sampling batches stay separate facts."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spo_lake.ingest import IngestError, ingest
from spo_lake.lake import Lake

ROWS = [{"prompt_id": f"p{i % 3}", "prompt": f"reach {i % 3}", "task": "countdown",
         "response": "x = 1" if i % 4 == 0 else f"x = {i}", "reward": 0.0 if i % 2 else -1.0,
         **({"trajectory_id": f"given-{i}"} if i % 5 == 0 else {})}
        for i in range(23)]  # repeats of "x = 1" and prompts spread over every batch


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def lake_rows(lake: Lake) -> list[tuple]:
    return lake.sql("SELECT trajectory_id, prompt_id, response_text FROM trajectories ORDER BY 1").to_pylist()


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_any_batch_size_gives_the_rows_of_one_batch(tmp_path, suffix):
    src = tmp_path / f"t.{suffix}"
    write_jsonl(src, ROWS) if suffix == "jsonl" else pq.write_table(pa.Table.from_pylist(ROWS), src)
    results = {}
    for batch_rows in (100, 7, 1):
        lake = Lake.init(tmp_path / f"lake{batch_rows}")
        report = ingest(lake, src, source="policy", batch_rows=batch_rows)
        assert (report.new, report.present, report.prompts_new, report.evaluations_new) == (23, 0, 3, 23)
        assert lake.count("prompts") == 3
        results[batch_rows] = lake_rows(lake)
        assert ingest(lake, src, source="policy", batch_rows=batch_rows).new == 0  # a re-ingest is a no-op
    assert results[7] == results[1] == results[100] and len(results[1]) == 23


def test_a_bad_row_in_a_late_batch_commits_nothing_and_leaves_no_file(tmp_path):
    rows = [*ROWS, {"prompt_id": "p0", "response": "late", "reward": 0.5}]  # not a lake reward
    lake = Lake.init(tmp_path / "lake")
    with pytest.raises(IngestError, match=r"t.jsonl:line 24: field 'reward'"):
        ingest(lake, write_jsonl(tmp_path / "t.jsonl", rows), source="policy", batch_rows=5)
    assert all(v == 0 for v in lake.versions().values())
    assert not list(Path(lake.root).rglob("*.parquet"))  # the four staged batches were deleted


def test_a_given_id_repeated_in_a_later_batch_is_an_error(tmp_path):
    rows = [{"prompt_id": "p", "prompt": "q", "task": "countdown", "response": f"r{i}", "trajectory_id": f"t{i % 4}"}
            for i in range(6)]
    with pytest.raises(IngestError, match=r"line 5: field 'trajectory_id': duplicate 't0'"):
        ingest(Lake.init(tmp_path / "lake"), write_jsonl(tmp_path / "t.jsonl", rows), batch_rows=3)


def test_the_same_response_drawn_in_two_batches_counts_twice(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    draw = {"prompt_id": "p", "prompt": "q", "task": "countdown", "response": "42", "run_id": "r", "model": "m"}
    for seed in (1, 2):  # two sampling batches of the same run: only their seed tells them apart
        batch = write_jsonl(tmp_path / f"b{seed}.jsonl", [{**draw, "metadata": {"seed": seed}}])
        assert ingest(lake, batch).new == 1
        assert ingest(lake, batch).new == 0  # re-ingesting a batch adds nothing
    assert lake.sql("SELECT count(*) AS n FROM trajectories WHERE response_text = '42'").to_pylist() == [{"n": 2}]
