"""A damaged or busy lake never loses data: no table is re-created over existing files, vacuum never deletes the
files of a write in flight, and `doctor` reports every fault and repairs what Delta allows."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spo_lake.lake import Lake, LakeError
from spo_lake.lake.contracts import table_names
from spo_lake.lake.doctor import diagnose
from tests.lake.rows import trajectory_rows

REPO = Path(__file__).parents[2]


def parquet_files(lake: Lake, table: str) -> set[Path]:
    return set(Path(lake.uri(table)).glob("*.parquet"))


@pytest.fixture
def filled(lake) -> Lake:
    for i in range(3):
        lake.append("trajectories", trajectory_rows(4, start=4 * i))
    lake.append("evaluations", [{"trajectory_id": "t00000", "verifier": "v", "passed": True, "reward": 0.0,
                                  "verdict": "ok"}])
    return lake


def test_a_deleted_log_is_an_error_naming_the_table_never_an_empty_table(filled):
    files = parquet_files(filled, "trajectories")
    shutil.rmtree(Path(filled.uri("trajectories")) / "_delta_log")
    for open_it in (Lake.open, Lake.init, lambda root: Lake.open(root, create=True)):
        with pytest.raises(LakeError, match=r"table 'trajectories' has 3 data files but no _delta_log.*restore"):
            open_it(filled.root)
    assert not (Path(filled.uri("trajectories")) / "_delta_log").exists()  # nothing written over the data
    assert parquet_files(filled, "trajectories") == files
    problems = diagnose(Lake.locate(filled.root), table_names())
    assert [(p.where, p.fix) for p in problems] == [("trajectories", None)]  # only a backup brings the log back


def test_a_lost_registry_is_an_error_while_other_tables_exist(filled):
    filled.snapshot("kept")
    shutil.rmtree(filled.uri("snapshots"))
    for open_it in (Lake.open, Lake.init, lambda root: Lake.open(root, create=True)):
        with pytest.raises(LakeError, match="snapshot registry .* is missing while tables .* exist"):
            open_it(filled.root)
    (problem,) = diagnose(Lake.locate(filled.root), table_names())
    assert problem.where == "snapshots" and problem.fix == "start an empty registry"
    problem.repair()  # what `spolake doctor --yes` does: the user accepts that the snapshots are gone
    assert Lake.open(filled.root).snapshots() == [] and Lake.open(filled.root).count("trajectories") == 12


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_truncated_last_log_entry_is_one_line_and_doctor_drops_it(filled):
    last = Path(filled.uri("trajectories")) / "_delta_log" / "00000000000000000003.json"
    truncate(last)
    with pytest.raises(LakeError) as err:
        Lake.open(filled.root).count("trajectories")
    message = str(err.value)
    assert "trajectories: cannot load the latest version" in message and "spolake doctor" in message
    assert "\n" not in message and "<unknown>" not in message and "pthread" not in message  # no Rust backtrace

    (problem,) = diagnose(Lake.locate(filled.root), table_names())
    assert problem.where == "trajectories/_delta_log/00000000000000000003.json" and "truncated" in problem.what
    problem.repair()
    assert not last.exists() and list(Path(filled.root, "_quarantine").rglob(last.name))  # moved, not deleted
    lake = Lake.open(filled.root)
    assert lake.version("trajectories") == 2 and lake.count("trajectories") == 8
    assert diagnose(lake, table_names()) == []


def test_a_truncated_log_entry_pinned_by_a_snapshot_is_not_dropped(filled):
    filled.snapshot("pins-v3")
    truncate(Path(filled.uri("trajectories")) / "_delta_log" / "00000000000000000003.json")
    problems = [p for p in diagnose(Lake.locate(filled.root), table_names()) if p.where.startswith("trajectories")]
    assert len(problems) == 1 and problems[0].fix is None and "pins-v3" in problems[0].what


def test_a_truncated_data_file_is_reported_and_never_pinned(filled):
    victim = sorted(parquet_files(filled, "trajectories"))[0]
    truncate(victim)
    (problem,) = diagnose(filled, table_names())
    assert problem.where == f"trajectories/{victim.name}" and problem.what.startswith("damaged:")
    assert problem.fix is None
    with pytest.raises(LakeError, match=f"cannot pin trajectories@3: trajectories/{victim.name} is damaged"):
        filled.snapshot("broken")
    assert filled.snapshots() == []
    victim.unlink()
    with pytest.raises(LakeError, match="is missing"):
        filled.snapshot("broken")


def test_a_corrupt_checkpoint_is_rebuilt_from_the_log(filled):
    filled.delta("trajectories").create_checkpoint()
    checkpoint = Path(filled.uri("trajectories")) / "_delta_log" / "00000000000000000003.checkpoint.parquet"
    truncate(checkpoint)
    with pytest.raises(LakeError, match="Parquet"):
        filled.count("trajectories")
    (problem,) = diagnose(filled, table_names())
    assert problem.where.endswith(checkpoint.name) and "rebuild" in problem.fix
    problem.repair()
    assert filled.count("trajectories") == 12 and diagnose(filled, table_names()) == []


WRITER = """
import sys
from spo_lake.lake import Lake
from tests.lake.rows import trajectory_rows
lake = Lake.open(sys.argv[1])
staged = lake.stage("trajectories", [trajectory_rows(5, start=100)])
print("staged", flush=True)
sys.stdin.readline()  # the test vacuums here, while this write is in flight
print(lake.commit(staged), flush=True)
"""


def test_vacuum_racing_a_write_in_flight_deletes_none_of_its_files(filled):
    writer = subprocess.Popen([sys.executable, "-c", WRITER, filled.root], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert writer.stdout.readline().strip() == "staged"
    filled.vacuum(retention_hours=0, orphan_age_hours=0)  # the most aggressive vacuum there is
    out, _ = writer.communicate("go\n", timeout=60)
    assert writer.returncode == 0 and out.strip() == "4"
    assert filled.count("trajectories") == 17
    assert filled.sql("SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 17}]  # every file is there


COMPACTOR = """
import sys
from spo_lake.lake import Lake

class Paused(Lake):  # stops a real compaction between writing its new file and committing it
    def _committing(self, lease, table, paths):
        print("written", flush=True)
        sys.stdin.readline()  # the test vacuums here
        super()._committing(lease, table, paths)

print(Paused.open(sys.argv[1]).compact(["trajectories"])["trajectories"]["numFilesAdded"], flush=True)
"""


def test_vacuum_racing_a_compaction_in_flight_deletes_none_of_its_files(filled):
    compactor = subprocess.Popen([sys.executable, "-c", COMPACTOR, filled.root], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert compactor.stdout.readline().strip() == "written"
    filled.vacuum(retention_hours=0, orphan_age_hours=0)
    out, _ = compactor.communicate("go\n", timeout=60)
    assert compactor.returncode == 0 and out.strip() == "1"
    assert len(filled.files("trajectories")) == 1
    assert filled.sql("SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 12}]


def test_a_commit_whose_staged_files_are_gone_commits_nothing(filled):
    staged = filled.stage("trajectories", [trajectory_rows(2, start=50)])
    (Path(filled.uri("trajectories")) / staged.actions[0].path).unlink()  # as an old, lease-blind vacuum would
    with pytest.raises(LakeError, match="was deleted before the commit .*; nothing was committed"):
        filled.commit(staged)
    assert filled.version("trajectories") == 3 and filled.count("trajectories") == 12


def test_a_failed_write_leaves_no_staged_files(filled):
    before = parquet_files(filled, "trajectories")
    with pytest.raises(RuntimeError, match="boom"):
        with filled.writing() as lease:
            filled.stage("trajectories", [trajectory_rows(3, start=70)], lease)
            raise RuntimeError("boom")
    assert parquet_files(filled, "trajectories") == before


def test_a_write_of_rows_already_committed_keeps_only_its_rewrite_of_the_new_ones(filled):
    before = parquet_files(filled, "trajectories")
    with pytest.raises(RuntimeError, match="boom"):
        with filled.writing() as lease:  # t00010..t00013, of which t00010 and t00011 are in the lake already
            assert filled.commit_rows(filled.stage("trajectories", [trajectory_rows(4, start=10)], lease)) == 2
            raise RuntimeError("boom")  # a later table's commit fails: the lease discards what it did not commit
    got = filled.sql("SELECT count(*) AS n, count(DISTINCT trajectory_id) AS d FROM trajectories").to_pylist()
    assert got == [{"n": 14, "d": 14}]  # the rewrite the commit referenced survived the discard
    assert len(parquet_files(filled, "trajectories") - before) == 1  # the first staging was deleted


def test_vacuum_by_default_keeps_files_a_reader_of_a_recent_version_uses(filled):
    reader_files = filled.files("trajectories")  # a long reader resolved latest before the compaction
    filled.compact(["trajectories"])
    assert filled.vacuum()["trajectories"] == []  # removed minutes ago: within the 7-day retention
    assert all(Path(f).exists() for f in reader_files)
    assert len(filled.vacuum(retention_hours=0)["trajectories"]) == 3  # asked for explicitly
