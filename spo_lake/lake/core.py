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
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import unquote

import duckdb
import polars as pl
import pyarrow as pa
from deltalake import DeltaTable, Field, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction

from spo_lake.lake import doctor, inflight
from spo_lake.lake.contracts import Contract, contract, table_names
from spo_lake.lake.errors import LakeError, delta_message
from spo_lake.lake.inflight import Lease
from spo_lake.lake.store import Store
from spo_lake.lake.writer import lake_lock, write_files

# Time travel must outlive any snapshot: never expire log entries, and let only our keep_versions-aware vacuum
# delete data files.
TABLE_CONFIGURATION = {
    "delta.logRetentionDuration": "interval 36500 days",
    "delta.deletedFileRetentionDuration": "interval 36500 days",
    "delta.enableExpiredLogCleanup": "false",
}
SNAPSHOTS = "snapshots"
DEFAULT_RETENTION_HOURS = 168  # Delta's default: a reader of a version up to a week old keeps its files
Rows = pa.Table | pl.DataFrame | list[dict[str, Any]]


@dataclass(frozen=True)
class Staged:
    """Rows of one table written but not committed (see `Lake.stage`)."""

    table: str
    num_rows: int
    actions: list[AddAction] | None = None  # local lakes: the data files already written
    data: pa.Table | None = None  # object stores: written by delta-rs at commit
    lease: Lease | None = None  # keeps vacuum off the staged files (see `Lake.writing`)
    owns_lease: bool = False  # `commit` releases it


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
    def locate(cls, path: str | os.PathLike, storage_options: dict[str, str] | None = None) -> "Lake":
        """The lake at `path`, checking and creating nothing (what `spolake doctor` examines)."""
        root = str(path)
        return cls(root if _is_uri(root) else _local_root(root), storage_options)

    @classmethod
    def init(cls, path: str | os.PathLike, storage_options: dict[str, str] | None = None) -> "Lake":
        """Create the lake (idempotent): every table of `schemas/` plus the snapshot registry. Never over existing
        data: a table whose log is lost, or a registry missing next to other tables, is a LakeError."""
        lake = cls.locate(path, storage_options)
        if not _is_uri(lake.root):
            Path(lake.root).mkdir(parents=True, exist_ok=True)
        lake._require_registry()
        lake._create_missing([SNAPSHOTS, *table_names()])  # the registry first: tables without one mean it was lost
        return lake

    @classmethod
    def open(cls, path: str | os.PathLike, storage_options: dict[str, str] | None = None,
             create: bool = False) -> "Lake":
        """Open the lake at `path` (a directory or object-store URI); `create` makes it if missing, else a missing
        lake is a LakeError. `storage_options` go to deltalake (credentials, endpoint, ...)."""
        lake = cls.locate(path, storage_options)
        if not lake._is_table(SNAPSHOTS):
            if create:
                return cls.init(path, storage_options)
            lake._require_registry()
            lost = doctor.lost_log(lake, SNAPSHOTS)
            raise LakeError(lost or f"{lake.root}: not a lake (run `spolake init` or pass --lake)")
        lake._create_missing(table_names())  # tables added by a newer contract set appear on open
        return lake

    def _is_table(self, table: str) -> bool:
        return DeltaTable.is_deltatable(self.uri(table), self.storage_options)

    def _require_registry(self) -> None:
        """No registry while other tables exist means the registry was lost: creating one would drop every snapshot."""
        if not self._is_table(SNAPSHOTS):
            present = [t for t in table_names() if self._is_table(t)]
            if present:
                raise LakeError(doctor.missing_registry(self, present))

    def _create_missing(self, tables: list[str]) -> None:
        """Create the tables that do not exist yet; a table directory holding data files but no log is a LakeError."""
        for t in tables:
            if self._is_table(t):
                continue
            lost = doctor.lost_log(self, t)
            if lost:
                raise LakeError(lost)
            self._ensure_table(contract(t))

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
            at = "latest version" if version is None else f"version {version}"
            raise LakeError(f"{self.uri(table)}: cannot load the {at}: {delta_message(exc)} "
                            "(run `spolake doctor`)") from None

    # ---- writing -------------------------------------------------------------------------------------------
    def store(self) -> Store:
        """The lake's files below the Delta level (listing, leases, damage checks)."""
        return Store(self.root, self.storage_options)

    @contextmanager
    def writing(self) -> Iterator[Lease]:
        """A write lease for staging rows (of one or several tables) and committing them: vacuum deletes none of its
        files meanwhile. Files staged but not committed when the block fails are deleted."""
        with self.lock():  # serialised with vacuum, which must see the lease before the first staged file
            lease = Lease(self.store(), None if _is_uri(self.root) else self.root).take()
        try:
            yield lease
        except BaseException:
            lease.discard()
            raise
        finally:
            lease.release()

    def stage(self, table: str, chunks: Iterable[Rows], lease: Lease | None = None) -> Staged:
        """Conform and write rows, chunk by chunk, without committing: nothing is visible until `commit`.

        `chunks` may be a generator: on a local lake each chunk's files are written on a thread pool while the
        next chunk is produced. Object-store lakes keep the rows in memory and let delta-rs write them at commit.
        Without a `lease` (from `writing`) the Staged takes its own, released by `commit`.
        """
        owns = lease is None
        if lease is None:
            with self.lock():
                lease = Lease(self.store(), None if _is_uri(self.root) else self.root).take()
        c = contract(table)
        conformed = (data for data in (c.conform(_to_arrow(rows)) for rows in chunks) if data.num_rows)
        if _is_uri(self.root):
            parts = list(conformed)
            data = pa.concat_tables(parts) if parts else c.arrow_schema.empty_table()
            return Staged(table, data.num_rows, data=data, lease=lease, owns_lease=owns)
        written = 0

        def counted() -> Iterator[pa.Table]:
            nonlocal written
            for data in conformed:
                written += data.num_rows
                yield data

        lease.staging(table)
        actions = write_files(self.uri(table), counted(), prefix=lease.prefix)
        return Staged(table, written, actions=actions, lease=lease, owns_lease=owns)

    def commit(self, staged: Staged, *, max_attempts: int = 30) -> int:
        """Commit staged rows as one Delta append; returns the table version after it.

        Commit conflicts with concurrent writers are retried with jittered exponential back-off.
        """
        if staged.num_rows == 0:
            self._done(staged)
            return self.version(staged.table)
        paths = [a.path for a in staged.actions or []]
        if staged.lease is not None:
            staged.lease.committing()
        try:  # a file deleted since staging (a vacuum that ignored the lease) must not be referenced
            inflight.check_staged(self.store(), staged.table, paths)
        except FileNotFoundError as exc:
            raise LakeError(str(exc)) from None
        for attempt in range(max_attempts):
            try:
                if staged.actions is None:
                    write_deltalake(self.uri(staged.table), staged.data, mode="append",
                                    storage_options=self.storage_options)
                else:
                    dt = self._evolve(self.delta(staged.table), contract(staged.table))
                    dt.create_write_transaction(staged.actions, mode="append", schema=dt.schema())
                self._done(staged)
                return self.version(staged.table)
            except CommitFailedError:
                if attempt == max_attempts - 1:
                    raise
                time.sleep(min(2.0, 0.01 * 2**attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def _done(self, staged: Staged) -> None:
        if staged.lease is not None:
            staged.lease.committed(staged.table, [a.path for a in staged.actions or []])
            if staged.owns_lease:
                staged.lease.release()

    def append(self, table: str, rows: Rows) -> int:
        """Append rows (conformed to the table's contract) in one commit; returns the table version after it."""
        with self.writing() as lease:
            return self.commit(self.stage(table, [rows], lease))

    def append_many(self, batches: Mapping[str, Rows]) -> dict[str, int]:
        """Append to several tables, conforming and writing ALL of them before the first commit.

        Commits go in the given order, under the lake lock so no snapshot falls between them; callers put the
        table that makes the batch visible (e.g. trajectories) last, so a crash in between leaves only unreferenced
        facts that a retry re-uses.
        """
        with self.writing() as lease:
            staged = [self.stage(t, [rows], lease) for t, rows in batches.items()]
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
            doctor.require_intact(self, versions)  # a pin must read back: refuse one over missing or broken files
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

    def delete_snapshot(self, name: str, force: bool = False) -> None:
        """Tombstone a snapshot; its files are released to the next vacuum. A snapshot some run records (it trained
        or evaluated on it) is only deleted with `force`: the run could no longer be reproduced."""
        with self.lock():
            snap = self.get_snapshot(name)
            runs = (self.read("runs").filter(pl.col("snapshot") == name).select("run_id").unique()
                    .collect().get_column("run_id").sort().to_list())
            if runs and not force:
                raise LakeError(f"snapshot {name!r} is pinned by run {', '.join(runs[:3])}"
                                f"{f' and {len(runs) - 3} more' if len(runs) > 3 else ''}: deleting it releases "
                                "the data those runs read (pass --force to delete it anyway)")
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

    def sql(self, query: str, snapshot: str | Snapshot | None = None, writes: bool = False) -> pa.Table:
        """Run DuckDB SQL with every table visible as a view at the snapshot's versions. Only SELECT statements
        run unless `writes` (COPY ... TO, CREATE, ATTACH, INSTALL/LOAD, SET write files or change the session)."""
        from spo_lake.lake.sql import connect, referenced_tables, require_read_only

        if not writes:
            require_read_only(query)
        try:
            con = connect(self, snapshot, tables=referenced_tables(query))
            try:
                rel = con.sql(query)
                return rel.to_arrow_table() if rel is not None else pa.table({})
            finally:
                con.close()
        except (duckdb.IOException, duckdb.InvalidInputException) as exc:
            if self.root not in str(exc):
                raise
            first = str(exc).splitlines()[0]  # not the view definition listing every file
            raise LakeError(f"{first} (a damaged lake file: run `spolake doctor`)") from None

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
            with self.writing():  # its new files are uncommitted until optimize commits: keep vacuum off them
                out[t] = self.delta(t).optimize.compact()
        return out

    def vacuum(self, retention_hours: int = DEFAULT_RETENTION_HOURS, dry_run: bool = False,
               orphan_age_hours: int | None = 24) -> dict[str, list[str]]:
        """Delete data files that neither a version newer than `retention_hours` nor any snapshot references.

        Files removed (by compaction) longer than `retention_hours` ago go, so a reader of any version younger than
        that (a long query, an export, a pipeline) keeps its files; the default is Delta's 7 days. Orphans — files
        of writers killed before their commit — go once older than `orphan_age_hours` (None keeps them). Files of
        writes in flight are never deleted (see `inflight.py`), nor anything while a table's log cannot be read.
        """
        out = {}
        tables = [*table_names(), SNAPSHOTS]
        with self.lock():  # no snapshot and no write lease can start between reading them and deleting
            loaded = {t: self.delta(t) for t in tables}  # every log must load before a file is deleted
            since, killed = inflight.live_since(self.store(), None if _is_uri(self.root) else self.root, tables,
                                                clean=not dry_run)
            pinned = self.pinned_versions()
            for t, dt in loaded.items():
                keep = sorted(pinned.get(t, set()) | {dt.version()})
                common = dict(dry_run=dry_run, enforce_retention_duration=False, keep_versions=keep)
                gone = set(dt.vacuum(retention_hours=int(retention_hours), full=False, **common))
                if orphan_age_hours is not None:
                    age = max(int(retention_hours), int(orphan_age_hours),
                              inflight.protected_hours(since, _is_uri(self.root)))
                    gone |= set(dt.vacuum(retention_hours=age, full=True, **common))
                out[t] = sorted(gone | {p.split("/", 1)[1] for p in killed if p.startswith(f"{t}/")})
        return out


def _to_arrow(rows: Rows) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pl.DataFrame):
        return rows.to_arrow()
    if isinstance(rows, list):
        return pa.Table.from_pylist(rows) if rows else pa.table({})
    raise TypeError(f"rows must be a pyarrow Table, polars DataFrame or list of dicts, not {type(rows).__name__}")
