"""Upkeep after many small commits: compaction and Delta checkpoints keep the file count and the log replay short,
and every snapshot taken in between reads exactly what it read before."""
from __future__ import annotations

from pathlib import Path

from spo_lake.lake import Lake
from spo_lake.lake.appender import BufferedAppender
from spo_lake.lake.upkeep import COMPACT_EVERY, after_commit
from tests.lake.rows import trajectory_rows

ALL = "SELECT trajectory_id, prompt_id, token_ids, behavior_logprobs FROM trajectories ORDER BY trajectory_id"


def checkpoints(lake: Lake, table: str) -> list[Path]:
    return sorted((Path(lake.uri(table)) / "_delta_log").glob("*.checkpoint.parquet"))


def test_snapshots_taken_between_compactions_and_checkpoints_read_identically(lake):
    seen = {}
    for i in range(24):
        version = lake.append("trajectories", trajectory_rows(2, start=2 * i))
        after_commit(lake, "trajectories", version, compact_every=5, checkpoint_every=7)
        if i % 4 == 3:
            name = f"s{i}"
            lake.snapshot(name)
            seen[name] = (lake.sql(ALL, snapshot=name), lake.read("trajectories", name).collect().sort("trajectory_id"))

    assert checkpoints(lake, "trajectories")
    assert len(lake.files("trajectories")) < 5  # 24 appends: compacted down to the last few
    for name, (rows, frame) in seen.items():
        assert lake.sql(ALL, snapshot=name).equals(rows)
        assert lake.read("trajectories", name).collect().sort("trajectory_id").equals(frame)
        assert lake.count("trajectories", name) == rows.num_rows
    assert lake.sql(ALL).column("trajectory_id").to_pylist() == [f"t{i:05d}" for i in range(48)]


def test_a_buffered_appender_compacts_as_it_commits(lake):
    appender = BufferedAppender(lake, flush_rows=1)
    for i in range(COMPACT_EVERY):
        appender.add("trajectories", trajectory_rows(1, start=i))
    assert lake.version("trajectories") == COMPACT_EVERY + 1  # the appends, then the compaction
    assert len(lake.files("trajectories")) == 1
    assert lake.count("trajectories") == COMPACT_EVERY
    assert len(lake.files("trajectories", version=COMPACT_EVERY)) == COMPACT_EVERY  # the old version is intact


def test_upkeep_compacts_only_the_small_files(lake):
    """A compaction's cost must not grow with the table: the files already over the threshold are left as they are,
    and only the small ones written since are merged (without losing or duplicating a row)."""
    big_version = lake.append("trajectories", trajectory_rows(2000))
    big = set(lake.files("trajectories"))
    size = (Path(lake.uri("trajectories")) / next(iter(big))).stat().st_size
    version = big_version
    for i in range(4):
        version = lake.append("trajectories", trajectory_rows(1, start=2000 + i))
    after_commit(lake, "trajectories", version, compact_every=version, compact_below=size)

    files = set(lake.files("trajectories"))
    assert big < files and len(files - big) == 1  # the big file untouched, the 4 small ones merged into 1
    assert lake.version("trajectories") == version + 1
    assert lake.sql(ALL).column("trajectory_id").to_pylist() == [f"t{i:05d}" for i in range(2004)]
    after_commit(lake, "trajectories", version, compact_every=version, compact_below=size + 1)
    assert len(lake.files("trajectories")) == 1  # with the big file under the threshold, it is merged too
    assert lake.count("trajectories") == 2004
