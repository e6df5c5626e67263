from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spo_lake.lake import Lake, LakeError, contract, table_names
from tests.lake.rows import trajectory_rows

ALL = "SELECT trajectory_id, prompt_id, token_ids, behavior_logprobs FROM trajectories ORDER BY trajectory_id"


def parquet_files(root: str) -> set[str]:
    return {str(p) for p in Path(root).rglob("*.parquet")}


def test_init_creates_every_table_and_open_finds_them(tmp_path):
    root = tmp_path / "lake"
    with pytest.raises(LakeError, match="not a lake"):
        Lake.open(root)
    Lake.init(root)
    lake = Lake.open(root)
    assert set(lake.versions()) == set(table_names())
    assert all(v == 0 for v in lake.versions().values())
    assert Lake.init(root).versions() == lake.versions()  # idempotent
    for t in table_names():
        assert DeltaTable(lake.uri(t)).metadata().configuration["delta.enableExpiredLogCleanup"] == "false"
    (tmp_path / "notes.txt").write_text("mine")  # a file where the lake should go ("[Errno 17] File exists" before)
    with pytest.raises(LakeError, match=r"notes\.txt: a file is there; a lake is a directory"):
        Lake.init(tmp_path / "notes.txt")


@pytest.mark.parametrize("kind", ["dicts", "arrow", "polars"])
def test_append_round_trips_through_read_and_sql(lake, kind):
    rows = trajectory_rows(3)
    data = {"dicts": rows, "arrow": pa.Table.from_pylist(rows), "polars": pl.DataFrame(rows)}[kind]
    version = lake.append("trajectories", data)
    assert version == lake.version("trajectories") == 1
    got = lake.read("trajectories").sort("trajectory_id").collect()
    assert got["trajectory_id"].to_list() == [r["trajectory_id"] for r in rows]
    assert got["token_ids"].to_list() == [r["token_ids"] for r in rows]
    assert got["behavior_logprobs"].to_list() == [r["behavior_logprobs"] for r in rows]
    assert got["schema_version"].to_list() == [contract("trajectories").version] * 3
    assert lake.sql(ALL).to_pylist() == [{k: r[k] for k in ("trajectory_id", "prompt_id", "token_ids",
                                                               "behavior_logprobs")} for r in rows]
    assert lake.count("trajectories") == 3


def test_dict_rows_keep_every_field_whichever_row_first_names_it(lake):
    rows = trajectory_rows(3)
    rows[2]["run_id"] = "r-2"  # only the last row names it (pyarrow's from_pylist would drop it)
    lake.append("trajectories", rows)
    got = lake.sql("SELECT trajectory_id, run_id FROM trajectories ORDER BY trajectory_id").to_pylist()
    assert [r["run_id"] for r in got] == [None, None, "r-2"]


def test_empty_tables_read_and_query_with_their_contract_schema(lake):
    assert lake.read("values").collect().columns == contract("values").names
    assert lake.sql("SELECT count(*) AS n FROM values").to_pylist() == [{"n": 0}]
    shown = {r["name"] for r in lake.sql("SHOW TABLES").to_pylist()}
    assert set(table_names()) <= shown


def test_time_travel_and_snapshot_isolation(lake):
    lake.append("trajectories", trajectory_rows(2))
    snap = lake.snapshot("first", note="two rows")
    before = lake.sql(ALL, snapshot="first")
    lake.append("trajectories", trajectory_rows(3, start=2))
    lake.append("prompts", [{"prompt_id": "p0", "task": "countdown", "prompt": "x"}])
    assert lake.sql(ALL, snapshot="first").equals(before)
    assert lake.sql(ALL, snapshot=snap).num_rows == 2
    assert lake.read("trajectories", snapshot="first").collect().height == 2
    assert lake.sql("SELECT count(*) AS n FROM prompts", snapshot="first").to_pylist() == [{"n": 0}]
    assert lake.sql(ALL).num_rows == 5
    assert lake.get_snapshot("first").versions["trajectories"] == 1
    assert lake.get_snapshot("first").note == "two rows"


def test_snapshot_names_are_unique_and_never_reused(lake):
    lake.snapshot("s")
    with pytest.raises(LakeError, match="already exists"):
        lake.snapshot("s")
    lake.delete_snapshot("s")
    assert [s.name for s in lake.snapshots()] == []
    with pytest.raises(LakeError, match="never reused"):
        lake.snapshot("s")
    with pytest.raises(LakeError, match="no snapshot named"):
        lake.sql("SELECT 1", snapshot="s")
    with pytest.raises(LakeError, match="invalid"):
        lake.snapshot(" padded ")


def snapshot_results(lake: Lake) -> dict[str, pa.Table]:
    return {s.name: lake.sql(ALL, snapshot=s.name) for s in lake.snapshots()}


def test_compact_and_vacuum_keep_every_snapshot_and_deleting_one_releases_its_files(lake):
    for i in range(4):
        lake.append("trajectories", trajectory_rows(2, start=2 * i))
        lake.snapshot(f"s{i}")
    expected = snapshot_results(lake)
    data_files = lambda: parquet_files(lake.uri("trajectories"))  # noqa: E731

    lake.compact()
    assert len(lake.files("trajectories")) == 1
    removed = lake.vacuum(retention_hours=0)
    assert removed["trajectories"] == []  # every old file is pinned by some snapshot
    assert snapshot_results(lake) == expected
    assert lake.sql(ALL).equals(expected["s3"])

    assert len(data_files()) == 5  # four appends, one compacted file

    for name in ["s0", "s1", "s2"]:
        lake.delete_snapshot(name)
    assert lake.vacuum(retention_hours=0)["trajectories"] == []  # s3 still pins all four appended files
    lake.delete_snapshot("s3")
    assert len(lake.vacuum(retention_hours=0)["trajectories"]) == 4
    assert data_files() == set(lake.files("trajectories"))
    assert lake.sql(ALL).equals(expected["s3"])


KILLED_WRITER = """
import os, sys
from spo_lake.lake import Lake
from tests.lake.rows import trajectory_rows
staged = Lake.open(sys.argv[1]).stage("trajectories", [trajectory_rows(2, start=2)])
print(staged.actions[0].path, flush=True)
os._exit(0 if sys.argv[2] == "staging" else staged.lease.committing() or 0)
"""


@pytest.mark.parametrize("died", ["staging", "committing"])
def test_vacuum_removes_files_of_a_writer_killed_before_its_commit(lake, died):
    lake.append("trajectories", trajectory_rows(2))
    out = subprocess.run([sys.executable, "-c", KILLED_WRITER, lake.root, died], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2])
    orphan = Path(lake.uri("trajectories")) / out.stdout.strip()
    assert orphan.exists() and lake.count("trajectories") == 2
    if died == "staging":  # it never reached its commit: its files are garbage at once
        assert lake.vacuum()["trajectories"] == [orphan.name]
        assert not orphan.exists()
    else:  # it may have committed: its files go by the orphan rule (older than retention and orphan age)
        assert lake.vacuum()["trajectories"] == []
        assert lake.vacuum(retention_hours=0, orphan_age_hours=0)["trajectories"] == [orphan.name]
    assert lake.count("trajectories") == 2 and not list(Path(lake.root, "_writers").iterdir())


def test_staged_rows_are_invisible_until_committed(lake):
    staged = lake.stage("trajectories", [trajectory_rows(2), trajectory_rows(3, start=2)])
    assert staged.num_rows == 5 and lake.count("trajectories") == 0
    assert lake.commit(staged) == 1
    assert lake.count("trajectories") == 5


def test_append_many_conforms_everything_before_the_first_commit(lake):
    with pytest.raises(Exception, match="unknown column"):
        lake.append_many({"prompts": [{"prompt_id": "p", "task": "t", "prompt": "x"}],
                          "trajectories": [{"bogus": 1}]})
    assert lake.versions() == {t: 0 for t in table_names()}


def test_history_lists_commits(lake):
    lake.append("trajectories", trajectory_rows(1))
    lake.append("trajectories", trajectory_rows(1, start=1))
    history = lake.history("trajectories")
    assert [h["version"] for h in history][:3] == [2, 1, 0]
    assert history[0]["operation"] == "WRITE" and history[-1]["operation"] == "CREATE TABLE"


def test_a_lake_in_a_path_with_spaces(tmp_path):
    lake = Lake.init(tmp_path / "my lake")
    lake.append("trajectories", trajectory_rows(2))
    assert lake.sql(ALL).num_rows == 2
    assert lake.read("trajectories").collect().height == 2
    assert all(os.path.exists(f) for f in lake.files("trajectories"))
    with pytest.raises(LakeError, match="cannot contain '%'"):  # delta-rs would decode it into another path
        Lake.init(tmp_path / "50%20off")


def test_tables_gain_columns_added_to_their_contract(lake):
    runs = contract("runs")
    old = pa.schema([f for f in runs.arrow_schema if f.name != "metrics"])
    DeltaTable.create(lake.uri("runs"), old, mode="overwrite")  # as if written under an older contract
    lake.append("runs", [{"run_id": "r", "kind": "sample", "status": "done", "metrics": '{"n": 1}'}])
    assert "metrics" in [f.name for f in DeltaTable(lake.uri("runs")).schema().fields]
    assert lake.sql("SELECT metrics FROM runs").to_pylist() == [{"metrics": '{"n": 1}'}]


def test_lock_is_reentrant_within_a_process(lake):
    with lake.lock():
        with lake.lock():
            lake.snapshot("inside")  # takes the lock again
    assert [s.name for s in lake.snapshots()] == ["inside"]


def _enter_lock(root: str) -> None:
    with Lake.locate(root).lock():
        Path(root, "child-entered").touch()


def test_lock_keeps_out_other_threads_and_processes_forked_meanwhile(lake):
    """While a thread holds the lock, another thread and a process forked meanwhile wait, then both take it. (The
    child inherits the holder's descriptor: releasing by closing it would leave the flock held by the child, and
    a threading lock copied into the child held by no thread would hang it.)"""
    held, release, entered = threading.Event(), threading.Event(), []

    def hold() -> None:
        with lake.lock():
            held.set()
            release.wait()

    def enter() -> None:
        with lake.lock():
            entered.append("thread")

    threads = [threading.Thread(target=hold), threading.Thread(target=enter)]
    threads[0].start()
    held.wait()
    threads[1].start()
    child = multiprocessing.get_context("fork").Process(target=_enter_lock, args=(lake.root,))
    child.start()
    try:
        time.sleep(1)
        assert entered == [] and not Path(lake.root, "child-entered").exists()
        release.set()
        for t in threads:
            t.join(timeout=30)
        child.join(timeout=30)
        assert entered == ["thread"] and child.exitcode == 0 and Path(lake.root, "child-entered").exists()
    finally:
        release.set()
        child.kill()


def test_a_uri_lake_goes_through_delta_rs_for_writes_and_reads(tmp_path):
    lake = Lake.init((tmp_path / "remote").as_uri())  # file:// takes the object-store code path
    lake.append("trajectories", trajectory_rows(2))
    lake.snapshot("two")
    lake.append("trajectories", trajectory_rows(1, start=2))
    assert lake.sql(ALL, snapshot="two").num_rows == 2 and lake.sql(ALL).num_rows == 3
    assert lake.read("trajectories", snapshot="two").collect().height == 2
    lake.compact()
    lake.vacuum()
    assert lake.sql(ALL, snapshot="two").num_rows == 2
    assert Lake.open((tmp_path / "remote").as_uri()).count("trajectories") == 3
