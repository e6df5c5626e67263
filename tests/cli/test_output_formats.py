"""`--format` means the same in every verb: json is one JSON document (an array of row objects for rows), jsonl one
row object per line, csv a header and rows; a missing value is null (empty in csv), never the tables' ∅."""
from __future__ import annotations

import csv
import io
import json
from datetime import datetime

import pytest


def rows_in_every_format(spolake, *args: str) -> list[dict]:
    """The verb's rows as json (one document) and as jsonl (one per line); both must say the same."""
    as_json = spolake(*args, "--format", "json")
    assert as_json.exit_code == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert isinstance(rows, list)
    as_jsonl = spolake(*args, "--format", "jsonl")
    assert as_jsonl.exit_code == 0, as_jsonl.stderr
    assert [json.loads(line) for line in as_jsonl.stdout.splitlines()] == rows
    return rows


def test_sql_rows_keep_their_json_types_and_a_missing_value_is_null(filled, tmp_path):
    query = "SELECT response_text, token_ids, run_id, created_at FROM trajectories ORDER BY 1"
    rows = rows_in_every_format(filled, "sql", query)
    assert [(r["response_text"], r["token_ids"], r["run_id"]) for r in rows] == [
        ("x = 0", [0, 7], None), ("x = 1", [1, 7], None), ("x = 2", None, None), ("x = 3", None, None)]
    assert all(datetime.fromisoformat(r["created_at"]).tzinfo is not None for r in rows)
    counted = rows_in_every_format(filled, "sql", "SELECT count(*) AS n, avg(length(response_text)) AS mean FROM "
                                   "trajectories")
    assert counted == [{"n": 4, "mean": 5.0}]
    assert rows_in_every_format(filled, "sql", "SELECT * FROM prompts WHERE false") == []
    table = list(csv.reader(io.StringIO(filled("sql", query, "--format", "csv").stdout)))
    assert table[0] == ["response_text", "token_ids", "run_id", "created_at"] and table[3][:3] == ["x = 2", "", ""]
    out = tmp_path / "rows.json"
    assert filled("sql", query, "--format", "json", "--out", out).exit_code == 0
    assert json.loads(out.read_text()) == rows


def test_report_verbs_print_rows_with_null_for_a_missing_run(filled):
    # the filled lake's runs have no run id: policy x = 0 passed, x = 1 failed (imported verdicts)
    assert rows_in_every_format(filled, "report", "coverage") == [
        {"source": "policy", "run_id": None, "prompts_solved": 1, "first_solved": 1}]
    (first,) = rows_in_every_format(filled, "report", "first-solved")
    assert (first["prompt_id"], first["source"], first["run_id"]) == ("p1", "policy", None)
    datetime.fromisoformat(first["solved_at"])
    assert rows_in_every_format(filled, "report", "solves", "--group-by", "run_id") == [
        {"snapshot": None, "group": None, "prompts": 1, "solved": 1, "mean_solve_rate": 0.5,
         "mean_distinct_correct": 0.0}]
    (per_prompt,) = rows_in_every_format(filled, "report", "solves", "--per-prompt", "--group-by", "run_id")
    assert (per_prompt["grp"], per_prompt["samples"], per_prompt["correct"]) == (None, 2, 1)
    assert rows_in_every_format(filled, "report", "passk", "--group-by", "run_id", "--k", "1,10") == [
        {"group": None, "prompts": 1, "samples": 2, "pass@1": 0.5, "prompts@1": 1, "pass@10": None,
         "prompts@10": 0}]
    assert rows_in_every_format(filled, "report", "hardest") == []  # no Q0 counts in this lake
    table = filled("report", "coverage")
    assert table.exit_code == 0 and "∅" in table.stdout  # the glyph is for people only
    coverage_csv = filled("report", "coverage", "--format", "csv").stdout.splitlines()
    assert coverage_csv == ['"source","run_id","prompts_solved","first_solved"', '"policy",,1,1']


def test_passk_keeps_its_columns_with_nothing_evaluated_and_bad_k_values_are_one_line(spolake):
    assert spolake("init").exit_code == 0
    csv = spolake("report", "passk", "--k", "1,10", "--format", "csv")  # printed nothing at all
    assert csv.exit_code == 0 and csv.stdout.splitlines() == [
        '"group","prompts","samples","pass@1","prompts@1","pass@10","prompts@10"']
    for k in ("x", "0", "-3", ""):  # a bug's traceback ("ValueError: pass@k needs 1 <= k <= n")
        bad = spolake("report", "passk", "--k", k)
        assert bad.exit_code == 1 and bad.stderr == \
            f"error: --k {k!r}: expected comma-separated positive integers such as 1,10\n", bad.stderr


def test_history_and_snapshot_list_are_rows_and_the_other_verbs_one_document(filled):
    (snap,) = rows_in_every_format(filled, "snapshot", "list")
    assert (snap["name"], snap["note"], snap["versions"]["trajectories"]) == ("v1", "three rows", 1)
    datetime.fromisoformat(snap["created_at"])
    history = rows_in_every_format(filled, "history", "trajectories")
    assert [h["version"] for h in history][-1] == 0 and all(isinstance(h["metrics"], dict) for h in history)
    assert {r["table"] for r in rows_in_every_format(filled, "history")} >= {"prompts", "trajectories"}
    stats = filled("stats", "--format", "json")
    assert json.loads(stats.stdout)["sources"][-1] == {"source": "human", "trajectories": 1, "prompts": 1,
                                                       "pass_rate": None}


@pytest.mark.parametrize("args", [("stats",), ("snapshot", "show", "v1"), ("doctor",)])
def test_a_verb_with_one_document_has_no_line_format(filled, args):
    result = filled(*args, "--format", "jsonl")
    assert result.exit_code == 2 and "--format" in result.stderr and "'jsonl' is not one of" in result.stderr
