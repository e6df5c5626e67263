"""A damaged lake and unsafe input through the CLI: one-line errors, exit 1, nothing lost; `spolake doctor`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spo_lake.lake import Lake


def one_line_error(result, *fragments: str) -> str:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr and "<unknown>" not in result.stderr  # no Python or Rust frames
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


@pytest.fixture
def filled(spolake, tmp_path):
    """One prompt, 20 trajectories with imported verdicts, snapshot 's1'."""
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt_id": "p1", "task": "countdown", "prompt": "reach 10"}) + "\n")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"prompt_id": "p1", "response": f"x = {i}", "reward": 0.0})
                                              + "\n" for i in range(20)))
    (tmp_path / "more.jsonl").write_text(json.dumps({"prompt_id": "p1", "response": "x = 99"}) + "\n")
    for args in [("prompts", "add", tmp_path / "p.jsonl"), ("ingest", tmp_path / "t.jsonl"),
                 ("snapshot", "create", "s1")]:
        assert spolake(*args).exit_code == 0
    return spolake


def test_a_deleted_log_stops_every_verb_and_nothing_is_recreated(filled, lake_dir, tmp_path):
    shutil.rmtree(lake_dir / "evaluations" / "_delta_log")
    for args in [("sql", "SELECT count(*) FROM evaluations"), ("stats",), ("ingest", tmp_path / "more.jsonl"),
                 ("vacuum", "--retention-hours", "0", "--orphan-age-hours", "0"), ("init",)]:
        one_line_error(filled(*args), "table 'evaluations' has 1 data files but no _delta_log", "restore")
    assert not (lake_dir / "evaluations" / "_delta_log").exists()
    assert len(list((lake_dir / "evaluations").glob("*.parquet"))) == 1  # vacuum deleted nothing
    doctor = filled("doctor")
    assert doctor.exit_code == 1 and doctor.stdout.startswith("evaluations: ") and len(doctor.stdout.splitlines()) == 1


def test_a_lost_registry_is_not_silently_recreated_by_ingest(filled, lake_dir, tmp_path):
    shutil.rmtree(lake_dir / "snapshots")
    one_line_error(filled("ingest", tmp_path / "more.jsonl"), "snapshot registry", "every snapshot would be lost")
    one_line_error(filled("snapshot", "list"), "snapshot registry")
    assert not (lake_dir / "snapshots").exists()
    assert filled("doctor").exit_code == 1  # reported; not repaired without --yes
    repaired = filled("doctor", "--yes")
    assert repaired.exit_code == 0 and "repaired snapshots: start an empty registry" in repaired.stderr
    assert filled("ingest", tmp_path / "more.jsonl").exit_code == 0
    assert Lake.open(lake_dir).count("trajectories") == 21


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_data_file_is_one_line_everywhere_and_never_pinned(filled, lake_dir, tmp_path):
    victim = next((lake_dir / "trajectories").glob("*.parquet"))
    truncate(victim)
    one_line_error(filled("ingest", tmp_path / "more.jsonl"), "spolake doctor")
    one_line_error(filled("sql", "SELECT count(*) FROM trajectories"), victim.name, "spolake doctor")
    one_line_error(filled("snapshot", "create", "s2"), "cannot pin trajectories@1", victim.name)
    assert [s.name for s in Lake.open(lake_dir).snapshots()] == ["s1"]
    doctor = filled("doctor", "--format", "json")
    assert doctor.exit_code == 1
    (problem,) = json.loads(doctor.stdout)["problems"]
    assert problem["where"] == f"trajectories/{victim.name}" and problem["repair"] is None


def test_doctor_drops_a_truncated_last_log_entry_only_with_yes(filled, lake_dir, tmp_path):
    assert filled("ingest", tmp_path / "more.jsonl").exit_code == 0  # trajectories@2, not pinned by s1
    entry = lake_dir / "trajectories" / "_delta_log" / "00000000000000000002.json"
    truncate(entry)
    line = one_line_error(filled("sql", "SELECT count(*) FROM trajectories"), "cannot load the latest version")
    assert "spolake doctor" in line
    report = filled("doctor")
    assert report.exit_code == 1 and "repairable: move it to _quarantine/" in report.stdout
    assert entry.exists()
    fixed = filled("doctor", "--yes")
    assert fixed.exit_code == 0 and "1 problems, 1 repaired, 0 left" in fixed.stderr
    assert Lake.open(lake_dir).count("trajectories") == 20 and Lake.open(lake_dir).count("trajectories", "s1") == 20
    assert filled("doctor").exit_code == 0
    assert filled("ingest", tmp_path / "more.jsonl").exit_code == 0  # the dropped commit is simply redone
    assert Lake.open(lake_dir).count("trajectories") == 21


@pytest.mark.parametrize("query", [
    "COPY (SELECT * FROM trajectories) TO '{out}'", "CREATE TABLE x AS SELECT 1", "ATTACH '{out}' AS other",
    "INSTALL httpfs", "LOAD httpfs", "SET threads = 1", "SELECT 1; COPY (SELECT 1) TO '{out}'",
])
def test_sql_is_read_only_unless_asked(filled, tmp_path, query):
    out = tmp_path / "written.csv"
    one_line_error(filled("sql", query.format(out=out)), "SQL is read-only", "--allow-writes")
    assert not out.exists()


def test_sql_writes_with_allow_writes_and_syntax_errors_are_one_line(filled, tmp_path):
    out = tmp_path / "written.csv"
    result = filled("sql", f"COPY (SELECT trajectory_id FROM trajectories) TO '{out}'", "--allow-writes")
    assert result.exit_code == 0, result.stderr
    assert len(out.read_text().splitlines()) == 21  # header + 20 rows
    one_line_error(filled("sql", "SELEC count(*) FROM trajectories"), "syntax error")


def test_snapshot_delete_refuses_a_snapshot_a_run_pinned(filled, lake_dir):
    Lake.open(lake_dir).append("runs", [{"run_id": "train-1", "kind": "train", "status": "done", "snapshot": "s1"}])
    one_line_error(filled("snapshot", "delete", "s1"), "pinned by run train-1", "--force")
    assert [s.name for s in Lake.open(lake_dir).snapshots()] == ["s1"]
    assert filled("snapshot", "delete", "s1", "--force").exit_code == 0
    assert Lake.open(lake_dir).snapshots() == []


def test_vacuum_warns_loudly_below_the_default_retention(filled):
    quiet, loud = filled("vacuum"), filled("vacuum", "--retention-hours", "0")
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr
    assert loud.exit_code == 0 and "warning: --retention-hours 0 deletes files" in loud.stderr
