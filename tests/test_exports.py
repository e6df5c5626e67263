"""`spolake export --shape`: TRL-shaped datasets with their provenance, the DPO pairing rule, and re-ingest no-ops."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spo_lake import Lake, export, ingest, ingest_prompts
from spo_lake.errors import InputError
from spo_lake.ingest.shapes import formatted_prompt

PROMPT_COLUMNS = ["prompt", "prompt_id", "task", "problem", "tests", "time_limit_s", "memory_limit_mb",
                  "prompt_metadata"]


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Lake:
    """Countdown problems with solver solutions (passing), wrong answers (failing, one twice) and an unjudged row."""
    from spo_lake.ingest.datasets import ingest_dataset

    lake = Lake.init(tmp_path_factory.mktemp("export") / "lake")
    ingest_dataset(lake, "countdown", None, n=3, seed=0)
    wrong = [{"prompt_id": f"countdown/0/{i}", "response": f" {a}+{a}", "reward": -1}
             for i in range(3) for a in (1, 2, 3)]
    ingest(lake, wrong + wrong[:1], source="reference", model="m")  # a repeated failing text: paired once at most
    ingest(lake, [{"prompt_id": "countdown/0/0", "response": " unjudged"}], source="reference", model="m")
    lake.snapshot("s1")
    return lake


def verdicts(lake: Lake) -> dict[str, bool]:
    rows = lake.sql("SELECT trajectory_id, bool_and(passed) AS ok FROM evaluations GROUP BY 1").to_pylist()
    return {r["trajectory_id"]: r["ok"] for r in rows}


def test_sft_rows_are_prompt_and_completion_of_passing_trajectories(lake):
    result = export(lake, "s1", "sft")
    rows = result.table.to_pylist()
    passing = lake.sql("SELECT count(*) AS n FROM evaluations WHERE passed").to_pylist()[0]["n"]
    assert len(rows) == passing > 0
    assert result.table.column_names == ["prompt", "completion", "prompt_id", "trajectory_id"]
    ok = verdicts(lake)
    assert all(ok[r["trajectory_id"]] for r in rows)
    problems = {r["prompt_id"]: r for r in lake.sql("SELECT * FROM prompts").to_pylist()}
    assert all(r["prompt"] == formatted_prompt(problems[r["prompt_id"]]) for r in rows)
    assert result.provenance | {"spo_lake_version": None} == {
        "snapshot": "s1", "versions": lake.get_snapshot("s1").versions, "shape": "sft", "chat": False,
        "query": "SELECT trajectory_id FROM evaluations GROUP BY 1 HAVING bool_and(passed)", "rows": len(rows),
        "spo_lake_version": None}
    chat = export(lake, "s1", "sft", chat=True).table.to_pylist()[0]
    assert chat["prompt"] == [{"role": "user", "content": rows[0]["prompt"]}]
    assert chat["messages"] == chat["prompt"] + [{"role": "assistant", "content": rows[0]["completion"]}]


def test_dpo_pairs_follow_the_documented_rule(lake):
    rows = export(lake, "s1", "dpo").table.to_pylist()
    ok = verdicts(lake)
    assert rows and all(ok[r["chosen_trajectory_id"]] and not ok[r["rejected_trajectory_id"]] for r in rows)
    used = [r["chosen_trajectory_id"] for r in rows] + [r["rejected_trajectory_id"] for r in rows]
    assert len(used) == len(set(used))  # no trajectory in two pairs
    texts = lake.sql("SELECT trajectory_id, prompt_id, response_text, response_hash FROM trajectories").to_pylist()
    by_id = {t["trajectory_id"]: t for t in texts}
    for pid in {r["prompt_id"] for r in rows}:
        expected = []
        for passed in (True, False):  # one per distinct response (smallest id), ordered by id
            first: dict[str, str] = {}
            for tid in sorted(t for t in ok if ok[t] is passed and by_id[t]["prompt_id"] == pid):
                first.setdefault(by_id[tid]["response_hash"], tid)
            expected.append(sorted(first.values()))
        got = [(r["chosen_trajectory_id"], r["rejected_trajectory_id"]) for r in rows if r["prompt_id"] == pid]
        assert got == list(zip(*expected))
    assert export(lake, "s1", "dpo").table.to_pylist() == rows  # deterministic


def test_prompt_rows_carry_what_a_verifier_needs(lake):
    rows = export(lake, "s1", "prompt", query="SELECT prompt_id FROM prompts WHERE prompt_id <> 'countdown/0/2'")
    assert rows.table.column_names == PROMPT_COLUMNS
    got = rows.table.to_pylist()
    assert [r["prompt_id"] for r in got] == ["countdown/0/0", "countdown/0/1"]
    assert set(json.loads(got[0]["tests"])) >= {"numbers", "target"}


def test_a_query_without_the_id_column_is_a_clear_error(lake):
    with pytest.raises(ValueError, match=r"--shape sft: the query must return a 'trajectory_id' column \(it returns "
                                         r"prompt_id\)"):
        export(lake, "s1", "sft", query="SELECT prompt_id FROM prompts")


@pytest.mark.parametrize("shape", ["raw", "sft", "dpo"])
@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "hf"])
def test_every_export_reingests_as_a_noop_and_records_its_provenance(lake, tmp_path, shape, fmt):
    query = "SELECT * FROM trajectories" if shape == "raw" else None
    result = export(lake, "s1", shape, query)
    out = tmp_path / f"out.{fmt}"
    result.write(out, fmt)
    if fmt == "parquet":
        recorded = json.loads(pq.read_schema(out).metadata[b"spo_lake"])
    elif fmt == "jsonl":
        recorded = json.loads(out.with_name("out.jsonl.spolake.json").read_text())
    else:
        recorded = json.loads(datasets.load_from_disk(str(out)).info.description)
    assert recorded == result.provenance
    before = lake.versions()
    report = ingest(lake, str(out), split="train" if fmt == "hf" else None)
    assert (report.new, report.present) == (0, result.table.num_rows * (2 if shape == "dpo" else 1))
    assert lake.versions() == before


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "hf"])
def test_an_export_over_an_earlier_one_replaces_it_whole(lake, tmp_path, fmt):
    """Written beside the output and renamed into place: no staging left, nothing of the earlier export kept (a
    `datasets` directory is replaced, not written into); a file where a directory goes, or the reverse, is an error
    that leaves it."""
    out = tmp_path / "out"
    export(lake, "s1", "raw", "SELECT * FROM trajectories").write(out, fmt)
    export(lake, "s1", "raw", "SELECT * FROM trajectories LIMIT 1").write(out, fmt)
    if fmt == "parquet":
        rows = pq.read_table(out).num_rows
    elif fmt == "jsonl":
        rows = len(out.read_text().splitlines())
    else:
        rows = datasets.load_from_disk(str(out)).num_rows
    assert rows == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] + (["out.spolake.json"] if fmt == "jsonl" else [])
    other = tmp_path / "other"
    other.mkdir() if fmt != "hf" else other.write_text("mine")
    with pytest.raises(InputError, match=f"--out {other}: a (file|directory) is there"):
        export(lake, "s1", "raw", "SELECT * FROM trajectories").write(other, fmt)
    assert other.exists() and (fmt != "hf" or other.read_text() == "mine")
    if fmt == "hf":  # a directory of someone's files is not an earlier export to replace
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "notes.txt").write_text("keep")
        with pytest.raises(InputError, match="a directory that is not a datasets export is there"):
            export(lake, "s1", "raw", "SELECT * FROM trajectories").write(tmp_path / "mine", fmt)
        assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_two_exports_to_one_file_at_once_both_finish_and_leave_one_of_them_whole(lake, tmp_path):
    out = tmp_path / "out.parquet"
    queries = ["SELECT * FROM trajectories", "SELECT * FROM trajectories LIMIT 1"] * 4
    with ThreadPoolExecutor(8) as pool:  # each writes in a staging directory of its own, then renames
        list(pool.map(lambda q: export(lake, "s1", "raw", q).write(out), queries))
    assert pq.read_table(out).num_rows in (1, export(lake, "s1", "raw", queries[0]).table.num_rows)
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]


def test_the_prompt_export_readds_as_a_noop(lake, tmp_path):
    out = tmp_path / "prompts.parquet"
    export(lake, "s1", "prompt").write(out)
    before = lake.versions()
    assert ingest_prompts(lake, str(out)).summary() == "0 new, 3 already present"
    assert lake.versions() == before


def test_a_prompt_restated_in_its_task_format_reingests_as_the_same_prompt(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    ingest_prompts(lake, [{"prompt_id": "cc/1", "task": "codecontests", "prompt": "Print 1.",
                           "tests": {"public": [{"input": "", "output": "1\n"}]}}])
    ingest(lake, [{"prompt_id": "cc/1", "response": "print(1)", "reward": 0}], model="m")
    lake.snapshot("s")
    rows = export(lake, "s", "sft").table
    assert rows["prompt"][0].as_py() != "Print 1." and "Print 1." in rows["prompt"][0].as_py()  # the task's format
    before = lake.versions()
    assert ingest(lake, rows).summary() == "0 new, 1 already present"
    assert lake.versions() == before
    with pytest.raises(Exception, match=r"input:row 1: field 'prompt': differs from prompt 'cc/1' in the lake"):
        ingest(lake, rows.set_column(0, "prompt", pa.array(["Print 2."])))
