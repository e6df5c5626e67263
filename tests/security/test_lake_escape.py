"""A lake copied from someone else stays inside its root: log paths out of a table, symlinked table, log and lease
directories, symlinks and FIFOs inside a table. Readers refuse, vacuum and compaction refuse before deleting or
writing anything, and `doctor` reports the entries as damage (never "missing", never repaired through them)."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spo_lake.lake import Lake
from tests.security.conftest import one_line_error

VERBS = [("sql", "SELECT count(*) AS n FROM trajectories"), ("compact",), ("stats",),
         ("vacuum",)]


def commit_add(lake_dir, table: str, path: str, size: int, action: str = "add") -> None:
    """Append a log entry adding (or removing) `path`, as a hostile lake's author would write it."""
    log = lake_dir / table / "_delta_log"
    version = len(list(log.glob("*.json")))
    body = {"path": path, "size": size, "partitionValues": {}, "modificationTime": 0, "dataChange": True}
    if action == "remove":
        body = {"path": path, "deletionTimestamp": 0, "dataChange": True, "size": size}
    (log / f"{version:020d}.json").write_text(json.dumps({action: body}) + "\n"
                                              + json.dumps({"commitInfo": {"operation": "WRITE"}}) + "\n")


@pytest.fixture
def outside_parquet(world):
    """Rows outside the lake that a reader following the log out would read (and compact would copy in)."""
    path = world.outside / "rows.parquet"
    lake = Lake.open(world.lake)
    schema = lake.delta("trajectories").schema().to_arrow()
    pq.write_table(pa.Table.from_pylist([], schema=pa.schema(schema)), path)
    return path


@pytest.mark.parametrize("form", ["relative", "absolute", "uri"])
def test_a_log_path_out_of_the_table_is_refused_by_every_reader_and_reported_by_doctor(filled, world, form,
                                                                                        outside_parquet):
    path = {"relative": "../../outside/rows.parquet", "absolute": str(outside_parquet),
            "uri": f"file://{outside_parquet}"}[form]
    commit_add(world.lake, "trajectories", path, outside_parquet.stat().st_size)
    before = world.snapshot()
    for verb in VERBS:
        one_line_error(filled(*verb), "refused")
    world.contained(before)
    doctor = filled("doctor")
    assert doctor.exit_code == 1 and "missing" not in doctor.stdout
    assert f"names data file {path!r}" in doctor.stdout
    filled("doctor", "--yes")
    world.contained(before)


def test_a_removed_path_out_of_the_table_is_never_vacuumed(filled, world):
    commit_add(world.lake, "trajectories", "../../outside/keep.parquet", 9, action="remove")
    before = world.snapshot()
    one_line_error(filled("vacuum",), "vacuum refused")
    world.contained(before)
    assert "keep.parquet" in filled("doctor").stdout


@pytest.mark.parametrize("entry", ["trajectories", "trajectories/_delta_log", "_writers"])
def test_a_symlinked_table_log_or_lease_directory_is_refused(filled, world, entry):
    real = world.lake / entry
    moved = world.outside / "victim" / "moved"
    if real.exists():
        os.rename(real, moved)
    else:
        moved.mkdir()
    os.symlink(moved, real)
    before = world.snapshot()
    for verb in VERBS + [("ingest", world.tmp / "t.jsonl")]:
        one_line_error(filled(*verb), "symlink")
    world.contained(before)
    doctor = filled("doctor")
    assert doctor.exit_code == 1 and f"{entry} (a symlink)" in doctor.stdout
    filled("doctor", "--yes")
    world.contained(before)


def test_a_symlink_inside_a_table_stops_vacuum_and_doctor_repairs_nothing_through_it(filled, world):
    (world.outside / "victim" / "part-0-old.parquet").write_bytes(b"orphan-looking")
    os.symlink(world.outside / "victim", world.lake / "trajectories" / "sub")
    os.utime(world.outside / "victim" / "part-0-old.parquet", (0, 0))
    before = world.snapshot()
    one_line_error(filled("vacuum",), "trajectories/sub")
    world.contained(before)
    assert "trajectories/sub (a symlink)" in filled("doctor", "--yes").stdout
    world.contained(before)


def test_a_fifo_named_by_the_log_is_refused_without_opening_it(filled, world):
    fifo = world.lake / "trajectories" / "part-fifo.parquet"
    os.mkfifo(fifo)
    commit_add(world.lake, "trajectories", "part-fifo.parquet", 100)
    before = world.snapshot()
    one_line_error(filled("sql", "SELECT count(*) FROM trajectories"), "not a regular file")
    one_line_error(filled("vacuum"), "special file")
    world.contained(before)


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_fifo_or_symlink_in_a_delta_log_is_refused_without_opening_it(filled, world, kind):
    entry = world.lake / "trajectories" / "_delta_log" / f"{9:020d}.json"
    if kind == "fifo":
        os.mkfifo(entry)
    else:
        os.symlink(world.outside / "victim" / "keep.txt", entry)
    before = world.snapshot()
    for verb in [("sql", "SELECT count(*) FROM trajectories"), ("stats",), ("vacuum",)]:
        one_line_error(filled(*verb), "_delta_log/00000000000000000009.json")
    world.contained(before)
    assert "00000000000000000009.json (a" in filled("doctor").stdout
