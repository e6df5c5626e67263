"""Keeping a table fast after thousands of small commits: Delta log checkpoints and compaction of small files.

Each commit adds an entry to the table's Delta log and (usually) a small Parquet file, so without upkeep opening a
table after 1,000 appends replays 1,000 log entries and a query opens 1,000 files. `after_commit` runs after a
writer's commit: every `compact_every` versions it bin-packs the files under `compact_below` bytes (`Lake.compact`:
earlier versions keep their files, so every snapshot reads the same rows), and every `checkpoint_every` versions it
writes a Delta checkpoint, so a reader replays at most that many entries. It keys on the version the commit
produced, which exactly one commit lands on: of several writers running at once, one does each piece of upkeep.

Only the small files are compacted: a compaction rewrites at most ~`compact_below` bytes plus the files written
since the last one, so its cost stays flat however large the table grows (compacting everything under `spolake
compact`'s 16 MiB, `core.COMPACT_BELOW_BYTES`, made the 200th compaction of a write-back stream rewrite the whole
table). It leaves files of ~`compact_below` behind, one per MiB written; `spolake compact` merges those into large
files.
"""
from __future__ import annotations

from spo_lake.lake.core import Lake

COMPACT_EVERY = 50
CHECKPOINT_EVERY = 100
UPKEEP_COMPACT_BELOW_BYTES = 2**20  # what the compaction after commits merges (`spolake compact`: core's 16 MiB)


def after_commit(lake: Lake, table: str, version: int, *, compact_every: int = COMPACT_EVERY,
                 checkpoint_every: int = CHECKPOINT_EVERY, compact_below: int = UPKEEP_COMPACT_BELOW_BYTES) -> None:
    """Upkeep due after the commit that produced `version` of `table` (usually none)."""
    if version and version % compact_every == 0:
        lake.compact([table], below_bytes=compact_below)
    if version and version % checkpoint_every == 0:
        lake.delta(table).create_checkpoint()  # after compacting: the checkpoint lists the compacted files
