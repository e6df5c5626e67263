"""The lake: one Delta table per entity, named snapshots pinning a version of each, SQL over all of them.

Rows are immutable facts; every write is an append. A snapshot is a named map {table -> Delta version}; reads at a
snapshot see exactly those versions. Compaction and vacuum keep every version a snapshot pins, so a snapshot's
query results never change.
"""
from __future__ import annotations

import json
import os
import random
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import unquote

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, Field, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction

from spo_lake.lake.contracts import Contract, contract, table_names
from spo_lake.lake.writer import lake_lock, write_files

# Time travel must outlive any snapshot: never expire log entries, and let only our keep_versions-aware vacuum
# delete data files.
TABLE_CONFIGURATION = {
    "delta.logRetentionDuration": "interval 36500 days",
    "delta.deletedFileRetentionDuration": "interval 36500 days",
    "delta.enableExpiredLogCleanup": "false",
}
SNAPSHOTS = "snapshots"
Rows = pa.Table | pl.DataFrame | list[dict[str, Any]]


class LakeError(RuntimeError):
    """A lake-level problem the user must fix (no lake, unknown snapshot, name taken, ...)."""


@dataclass(frozen=True)
class Staged:
    """Rows of one table written but not committed (see `Lake.stage`)."""

    table: str
    num_rows: int
    actions: list[AddAction] | None = None  # local lakes: the data files already written
    data: pa.Table | None = None  # object stores: written by delta-rs at commit


@dataclass(frozen=True)
class Snapshot:
    name: str
    versions: dict[str, int]
    note: str | None
    created_at: datetime


def _is_uri(path: str) -> bool:
    """Object-store style roots (s3://, gs://, az://, file://...) go through delta-rs for writes and reads."""
    return "://" in path


def _local_root(path: str | os.PathLike) -> str:
    root = str(Path(path).resolve())
    if "%" in root:  # delta-rs percent-decodes local paths, so a literal '%' points elsewhere
        raise LakeError(f"{root}: a lake path cannot contain '%'")
    return root


class Lake:
    """A directory (or object-store URI) of Delta tables. Open with `Lake.open(path)` or create with `Lake.init`."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None):
        self.root = root
        self.storage_options = storage_options

    # ---- opening -------------------------------------------------------------------------------------------
    @classmethod
    def init(cls, path: str | os.PathLike, storage_options: dict[str, str] | None = None) -> "Lake":
        """Create the lake (idempotent): every table of `schemas/` plus the snapshot registry."""
        root = str(path)
        if not _is_uri(root):
            root = _local_root(root)
            Path(root).mkdir(parents=True, exist_ok=True)
        lake = cls(root, storage_options)
        for name in [*table_names(), SNAPSHOTS]:
            lake._ensure_table(contract(name))
        return lake

    @classmethod
    def open(cls, path: str | os.PathLike, storage_options: dict[str, str] | None = None,
             create: bool = False) -> "Lake":
        """Open the lake at `path` (a directory or object-store URI); `create` makes it if missing, else a missing
        lake is a LakeError. `storage_options` go to deltalake (credentials, endpoint, ...)."""
        root = str(path)
        if not _is_uri(root):
            root = _local_root(root)
        lake = cls(root, storage_options)
        if not DeltaTable.is_deltatable(lake.uri(SNAPSHOTS), storage_options):
            if create:
                return cls.init(root, storage_options)
            raise LakeError(f"{root}: not a lake (run `spolake init` or pass --lake)")
        for name in table_names():  # tables added by a newer contract set appear on open
            if not DeltaTable.is_deltatable(lake.uri(name), storage_options):
                lake._ensure_table(contract(name))
        return lake

    def uri(self, table: str) -> str:
        """Where `table`'s Delta table lives (a path or URI any Delta reader opens)."""
        return f"{self.root.rstrip('/')}/{table}"

    def _ensure_table(self, c: Contract) -> None:
        try:
            DeltaTable.create(
                self.uri(c.table), c.arrow_schema, mode="ignore", name=c.table,
                description=f"{c.description} (contract v{c.version})", configuration=TABLE_CONFIGURATION,
                storage_options=self.storage_options,
            )
        except CommitFailedError:
            pass  # another process created it first

    def _evolve(self, dt: DeltaTable, c: Contract) -> DeltaTable:
        """Add contract columns the table lacks (contracts only ever gain nullable columns)."""
        have = {f.name for f in dt.schema().fields}
        missing = [Field.from_arrow(f) for f in c.arrow_schema if f.name not in have]
        if missing:
            dt.alter.add_columns(missing)
            dt = self.delta(c.table)
        return dt

    def lock(self) -> AbstractContextManager[None]:
        """Cross-process lock for check-then-commit sections (local lakes; object stores have no such lock)."""
        return nullcontext() if _is_uri(self.root) else lake_lock(self.root)

    def delta(self, table: str, version: int | None = None) -> DeltaTable:
        """The deltalake DeltaTable of `table` at `version` (latest when None)."""
        try:
            return DeltaTable(self.uri(table), version=version, storage_options=self.storage_options)
        except TableNotFoundError:
            raise LakeError(f"{self.uri(table)}: no such table") from None
        except DeltaError as exc:
            raise LakeError(f"{table}: cannot load version {version}: {exc}") from None

    # ---- writing -------------------------------------------------------------------------------------------
    def stage(self, table: str, chunks: Iterable[Rows]) -> Staged:
        """Conform and write rows, chunk by chunk, without committing: nothing is visible until `commit`.

        `chunks` may be a generator: on a local lake each chunk's files are written on a thread pool while the
        next chunk is produced. Object-store lakes keep the rows in memory and let delta-rs write them at commit.
        """
        c = contract(table)
        conformed = (data for data in (c.conform(_to_arrow(rows)) for rows in chunks) if data.num_rows)
        if _is_uri(self.root):
            parts = list(conformed)
            data = pa.concat_tables(parts) if parts else c.arrow_schema.empty_table()
            return Staged(table, data.num_rows, data=data)
        written = 0

        def counted() -> Iterator[pa.Table]:
            nonlocal written
            for data in conformed:
                written += data.num_rows
                yield data

        actions = write_files(self.uri(table), counted())
        return Staged(table, written, actions=actions)

    def commit(self, staged: Staged, *, max_attempts: int = 30) -> int:
        """Commit staged rows as one Delta append; returns the table version after it.

        Commit conflicts with concurrent writers are retried with jittered exponential back-off.
        """
        if staged.num_rows == 0:
            return self.version(staged.table)
        for attempt in range(max_attempts):
            try:
                if staged.actions is None:
                    write_deltalake(self.uri(staged.table), staged.data, mode="append",
                                    storage_options=self.storage_options)
                else:
                    dt = self._evolve(self.delta(staged.table), contract(staged.table))
                    dt.create_write_transaction(staged.actions, mode="append", schema=dt.schema())
                return self.version(staged.table)
            except CommitFailedError:
                if attempt == max_attempts - 1:
                    raise
                time.sleep(min(2.0, 0.01 * 2**attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def append(self, table: str, rows: Rows) -> int:
        """Append rows (conformed to the table's contract) in one commit; returns the table version after it."""
        return self.commit(self.stage(table, [rows]))

    def append_many(self, batches: Mapping[str, Rows]) -> dict[str, int]:
        """Append to several tables, conforming and writing ALL of them before the first commit.

        Commits go in the given order, under the lake lock so no snapshot falls between them; callers put the
        table that makes the batch visible (e.g. trajectories) last, so a crash in between leaves only unreferenced
        facts that a retry re-uses.
        """
        staged = [self.stage(t, [rows]) for t, rows in batches.items()]
        with self.lock():
            return {s.table: self.commit(s) for s in staged if s.num_rows}

    # ---- versions and snapshots ----------------------------------------------------------------------------
    def version(self, table: str) -> int:
        """The latest Delta version of `table`."""
        return self.delta(table).version()

    def versions(self) -> dict[str, int]:
        """{table: latest Delta version} for every table (what a new snapshot would pin)."""
        return {t: self.version(t) for t in table_names()}

    def snapshot(self, name: str, note: str | None = None) -> Snapshot:
        """Pin the current version of every table under `name` (names are never reused)."""
        if not name or name != name.strip() or any(ch in name for ch in "\n\r\t"):
            raise LakeError(f"invalid snapshot name {name!r}")
        with self.lock():
            old = self._snapshot_rows().get(name)
            if old is not None:
                why = "was deleted; names are never reused" if old["deleted"] else "already exists"
                raise LakeError(f"snapshot {name!r} {why} (snapshots are immutable)")
            versions = self.versions()
            self.append(SNAPSHOTS, [{"name": name, "versions": json.dumps(versions), "note": note, "deleted": False}])
        return self.get_snapshot(name)

    def _snapshot_rows(self) -> dict[str, dict[str, Any]]:
        rows = self.delta(SNAPSHOTS).to_pyarrow_table().sort_by("created_at").to_pylist()
        latest: dict[str, dict[str, Any]] = {}
        for r in rows:  # the first row of a name is the snapshot; a later one is its tombstone
            latest.setdefault(r["name"], r)
            if r["deleted"]:
                latest[r["name"]] = r
        return latest

    def snapshots(self) -> list[Snapshot]:
        """Every snapshot not deleted, oldest first."""
        return [
            Snapshot(r["name"], json.loads(r["versions"]), r["note"], r["created_at"])
            for r in self._snapshot_rows().values() if not r["deleted"]
        ]

    def get_snapshot(self, name: str) -> Snapshot:
        """The snapshot called `name`; a LakeError when there is none."""
        for s in self.snapshots():
            if s.name == name:
                return s
        raise LakeError(f"no snapshot named {name!r} (see `spolake snapshot list`)")

    def delete_snapshot(self, name: str) -> None:
        """Tombstone a snapshot; its files are released to the next vacuum."""
        with self.lock():
            snap = self.get_snapshot(name)
            self.append(SNAPSHOTS, [{"name": name, "versions": json.dumps(snap.versions), "note": snap.note,
                                     "deleted": True}])

    def resolve(self, snapshot: str | Snapshot | None) -> dict[str, int | None]:
        """{table: version}; None means latest. Tables newer than the snapshot read as their empty version 0."""
        if snapshot is None:
            return {t: None for t in table_names()}
        snap = snapshot if isinstance(snapshot, Snapshot) else self.get_snapshot(snapshot)
        return {t: snap.versions.get(t, 0) for t in table_names()}

    # ---- reading -------------------------------------------------------------------------------------------
    def files(self, table: str, version: int | None = None) -> list[str]:
        """The data files of `table` at `version`: local paths for a local lake (delta-rs percent-encodes them)."""
        uris = self.delta(table, version).file_uris()
        return uris if _is_uri(self.root) else [unquote(u.removeprefix("file://")) for u in uris]

    def arrow_dataset(self, table: str, version: int | None = None):
        """A pyarrow dataset over `table` at `version` (latest when None), e.g. for DuckDB or Arrow scans."""
        return self.delta(table, version).to_pyarrow_dataset()

    def read(self, table: str, snapshot: str | Snapshot | None = None) -> pl.LazyFrame:
        """A polars LazyFrame over `table` at the snapshot's pinned version (latest when None)."""
        version = self.resolve(snapshot)[table] if table in table_names() else None
        files = self.files(table, version)
        if not files:
            return pl.LazyFrame(schema=pl.from_arrow(contract(table).arrow_schema.empty_table()).schema)
        if _is_uri(self.root):
            return pl.scan_delta(self.uri(table), version=version, storage_options=self.storage_options)
        return pl.scan_parquet(files, missing_columns="insert", extra_columns="ignore")

    def sql(self, query: str, snapshot: str | Snapshot | None = None,
            params: dict[str, Any] | list[Any] | None = None) -> pa.Table:
        """Run DuckDB SQL with every table visible as a view at the snapshot's versions; `params` bind `$name` (a
        dict) or `?` (a list) placeholders, so values never need quoting into the query."""
        from spo_lake.lake.sql import connect, referenced_tables

        con = connect(self, snapshot, tables=referenced_tables(query))
        try:
            rel = con.sql(query, params=params)
            return rel.to_arrow_table() if rel is not None else pa.table({})
        finally:
            con.close()

    def history(self, table: str) -> list[dict[str, Any]]:
        """`table`'s Delta commit history, newest first (version, timestamp, operation, metrics)."""
        return self.delta(table).history()

    def count(self, table: str, snapshot: str | Snapshot | None = None) -> int:
        """Rows of `table` at the snapshot's pinned version (latest when None)."""
        return self.delta(table, self.resolve(snapshot).get(table)).count()

    # ---- maintenance ---------------------------------------------------------------------------------------
    def pinned_versions(self) -> dict[str, set[int]]:
        """{table: every version some snapshot pins}: what compaction and vacuum must keep readable."""
        pinned: dict[str, set[int]] = {t: set() for t in table_names()}
        for snap in self.snapshots():
            for t, v in snap.versions.items():
                pinned.setdefault(t, set()).add(v)
        return pinned

    def compact(self, tables: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """Bin-pack small files into large ones. Old versions stay readable (their files are kept)."""
        out = {}
        for t in tables or [*table_names(), SNAPSHOTS]:
            out[t] = self.delta(t).optimize.compact()
        return out

    def vacuum(self, retention_hours: int = 0, dry_run: bool = False,
               orphan_age_hours: int | None = 24) -> dict[str, list[str]]:
        """Delete data files that neither the latest version nor any snapshot's pinned version references.

        Files removed (by compaction) longer than `retention_hours` ago go. Orphans — files of writers killed
        before their commit — go once older than `orphan_age_hours` (None keeps them); an orphan younger than that
        may belong to a commit still in flight, so do not set it near 0 while other processes write.
        """
        out = {}
        with self.lock():  # no snapshot can be created between reading the pins and deleting
            pinned = self.pinned_versions()
            for t in [*table_names(), SNAPSHOTS]:
                dt = self.delta(t)
                keep = sorted(pinned.get(t, set()) | {dt.version()})
                common = dict(dry_run=dry_run, enforce_retention_duration=False, keep_versions=keep)
                gone = set(dt.vacuum(retention_hours=int(retention_hours), full=False, **common))
                if orphan_age_hours is not None:
                    age = int(max(retention_hours, orphan_age_hours))
                    gone |= set(dt.vacuum(retention_hours=age, full=True, **common))
                out[t] = sorted(gone)
        return out


def _to_arrow(rows: Rows) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pl.DataFrame):
        return rows.to_arrow()
    if isinstance(rows, list):
        return pa.Table.from_pylist(rows) if rows else pa.table({})
    raise TypeError(f"rows must be a pyarrow Table, polars DataFrame or list of dicts, not {type(rows).__name__}")
