"""Lake verbs through the CLI: init, sql, snapshot, history, stats, compact, vacuum, export."""
from __future__ import annotations

import csv
import io
import json

import pyarrow.parquet as pq
import pytest

from spo_lake.lake import Lake, table_names


def cells(stdout: str) -> list[list[str]]:
    """The rows of the tables printed on stdout (Markdown: stdout is not a terminal), as stripped cell texts."""
    return [[c.strip() for c in line.split("|")[1:-1]] for line in stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| ---")]


def test_init_is_idempotent(spolake, lake_dir):
    assert spolake("init").exit_code == 0
    assert spolake("init").exit_code == 0
    assert set(Lake.open(lake_dir).versions()) == set(table_names())


def test_sql_csv_goes_to_stdout_with_a_header_and_honours_snapshots(filled):
    result = filled("sql", "SELECT response_text, token_ids FROM trajectories ORDER BY 1", "--format", "csv")
    assert result.exit_code == 0, result.stderr
    table = list(csv.reader(io.StringIO(result.stdout)))
    assert table[0] == ["response_text", "token_ids"]
    assert table[1:] == [["x = 0", "[0, 7]"], ["x = 1", "[1, 7]"], ["x = 2", ""], ["x = 3", ""]]
    at_v1 = filled("sql", "SELECT count(*) AS n FROM trajectories", "--snapshot", "v1", "--format", "csv")
    assert at_v1.stdout.splitlines() == ['"n"', "3"]


def test_sql_json_and_parquet_outputs(filled, tmp_path):
    result = filled("sql", "SELECT prompt_id, task FROM prompts", "--format", "json")
    assert json.loads(result.stdout) == [{"prompt_id": "p1", "task": "countdown"}]
    out = tmp_path / "q.parquet"
    assert filled("sql", "SELECT * FROM evaluations", "--format", "parquet", "--out", out).exit_code == 0
    assert pq.read_table(out).num_rows == 2


@pytest.mark.parametrize("args, message", [
    (("sql", "SELECT * FROM nowhere"), "nowhere"),
    (("sql", "SELECT 1", "--snapshot", "nope"), "no snapshot named 'nope'"),
    (("snapshot", "create", "v1"), "already exists"),
    (("snapshot", "show", "nope"), "no snapshot named 'nope'"),
    (("history", "nope"), "no such table"),
    (("export", "--snapshot", "v1", "--query", "SELEC", "--out", "x.parquet"), "syntax error"),
])
def test_mistakes_are_one_line_errors(filled, args, message):
    result = filled(*args)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_snapshot_create_list_show_delete(filled, lake_dir):
    listed = filled("snapshot", "list")
    assert listed.exit_code == 0 and "v1" in listed.stdout and "three rows" in listed.stdout
    shown = filled("snapshot", "show", "v1")
    assert shown.exit_code == 0
    assert ["trajectories", "1", "3"] in cells(shown.stdout)
    assert filled("snapshot", "create", "v2").exit_code == 0
    assert filled("snapshot", "delete", "v1").exit_code == 0
    assert [s.name for s in Lake.open(lake_dir).snapshots()] == ["v2"]
    assert "v1" not in filled("snapshot", "list").stdout


def test_history_and_stats(filled):
    history = filled("history", "trajectories")
    assert history.exit_code == 0 and "WRITE" in history.stdout and "CREATE TABLE" in history.stdout
    versions = filled("history")
    assert all(t in versions.stdout for t in table_names())
    stats = filled("stats")
    assert stats.exit_code == 0
    rows = cells(stats.stdout)
    assert ["trajectories", "4"] in rows
    assert ["policy", "3", "1", "0.5"] in rows and ["human", "1", "1", "∅"] in rows
    assert ["countdown", "1", "4", "4.0"] in rows
    at_v1 = cells(filled("stats", "--snapshot", "v1").stdout)
    assert ["trajectories", "3"] in at_v1 and ["countdown", "1", "3", "3.0"] in at_v1
    assert not any(r and r[0] == "human" for r in at_v1)


def test_compact_and_vacuum_keep_snapshot_results(filled, lake_dir):
    query = "SELECT trajectory_id, response_text, token_ids FROM trajectories ORDER BY 1"
    before = {s: Lake.open(lake_dir).sql(query, snapshot=s) for s in ("v1", None)}
    assert filled("compact").exit_code == 0
    assert len(Lake.open(lake_dir).files("trajectories")) == 1
    result = filled("vacuum")
    assert result.exit_code == 0 and "deleted" in result.stderr
    assert {s: Lake.open(lake_dir).sql(query, snapshot=s) for s in ("v1", None)} == before


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "hf"])
def test_export_at_a_snapshot(filled, tmp_path, fmt):
    out = tmp_path / f"export.{fmt}"
    query = "SELECT t.trajectory_id, t.response_text AS completion, p.prompt FROM trajectories t JOIN prompts p USING (prompt_id)"
    result = filled("export", "--snapshot", "v1", "--query", query, "--format", fmt, "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "exported 3 rows" in result.stderr
    if fmt == "parquet":
        rows = pq.read_table(out).to_pylist()
    elif fmt == "jsonl":
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    else:
        import datasets

        rows = datasets.load_from_disk(str(out)).to_list()
    assert sorted(r["completion"] for r in rows) == ["x = 0", "x = 1", "x = 2"]
    assert {r["prompt"] for r in rows} == {"reach 10"}
