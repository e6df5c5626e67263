"""The lake: one Delta table per entity, named snapshots pinning a version of each, SQL over all of them.

Rows are immutable facts; every write is an append. A snapshot is a named map {table -> Delta version}; reads at a
snapshot see exactly those versions. Compaction and vacuum keep every version a snapshot pins, so a snapshot's
query results never change.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeAlias, cast
from urllib.parse import unquote

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, Field, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.fs import DeltaStorageHandler
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction
from filelock import FileLock

from spo_lake.lake import doctor, inflight
from spo_lake.lake.contracts import Contract, contract, table_names
from spo_lake.lake.errors import LakeError, delta_message
from spo_lake.lake.inflight import Lease
from spo_lake.lake.sql import add_missing_columns, referenced_tables, require_read_only, sql_literal
from spo_lake.lake.store import Store, escape, foreign_entries
from spo_lake.lake.writer import write_files

# Time travel must outlive any snapshot: never expire log entries, and let only our keep_versions-aware vacuum
# delete data files.
TABLE_CONFIGURATION = {
    "delta.logRetentionDuration": "interval 36500 days",
    "delta.deletedFileRetentionDuration": "interval 36500 days",
    "delta.enableExpiredLogCleanup": "false",
}
SNAPSHOTS = "snapshots"
DEFAULT_RETENTION_HOURS = 168  # Delta's default: a reader of a version up to a week old keeps its files
Rows: TypeAlias = pa.Table | pl.DataFrame | list[dict[str, Any]]
# A fact's key: a commit adds only rows whose key the table does not hold yet (insert-if-absent). The contracts'
# keys, except where a table keeps successive rows of one thing: a `values` row is a count at some n (a new row
# when n grows), a snapshot name has its row and its tombstone, and `runs` rows are events (plain appends).
_KEY_OVERRIDES: dict[str, tuple[str, ...]] = {
    "values": ("prompt_id", "trajectory_id", "position", "model_id", "temperature", "top_p", "n", "n_success"),
    SNAPSHOTS: ("name", "deleted"),
    "runs": (),
}
# delta-rs re-tries a commit that lost the race for its version number (no back-off needed: each loss is another
# writer's commit landing), unless the winner conflicts with it (see `_lost_to`).
COMMIT_RETRIES = 30
LOCK_FILE = "_lake.lock"
# What `Lake.compact` (so `spolake compact`) merges by default: every Parquet file smaller than this. The compaction
# after commits merges only the files under upkeep.UPKEEP_COMPACT_BELOW_BYTES (1 MiB), so its cost stays flat.
COMPACT_BELOW_BYTES = 16 * 2**20
COMPACT_BIN_BYTES = 256 * 2**20  # Parquet bytes rewritten per compaction commit (bounds its memory)


def insert_key(table: str) -> tuple[str, ...]:
    """The columns that identify a fact of `table` (empty: plain appends)."""
    return _KEY_OVERRIDES.get(table, contract(table).key)


def _guard(table: str) -> str:
    """Delta app id every keyed commit to `table` carries: delta-rs rejects a commit whose app id another commit
    used after the version it read (ConcurrentTransaction), so a key check and its commit are one transaction."""
    return f"spolake/{table}"


class Replan(Exception):
    """Another copy of a pipeline committed work of the same scope since this one planned (see `Work`)."""


@dataclass
class Work:
    """A pipeline's claim on work planned from the lake (`Lake.claim`); `Lake.append_many(..., work=)` commits it.

    Copies of one pipeline that run at once plan the same work. Every commit of a scope carries the scope's Delta
    app id on `table` (the table whose rows claim the work, committed first), and lands only if no other commit of
    the scope came after the one this copy last saw; otherwise `replan` first drops the rows the other copies made
    unnecessary (e.g. samples beyond n), so two copies end with exactly the rows one would.
    """

    scope: str
    table: str
    replan: Callable[[dict[str, list[dict[str, Any]]]], dict[str, list[dict[str, Any]]]]
    seen: int | None = None

    @property
    def app_id(self) -> str:
        return f"spolake-work/{self.scope}"


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
        self._contained: set[tuple[str, int]] = set()  # (table, version) whose files were checked to stay inside

    # ---- opening -------------------------------------------------------------------------------------------
    @classmethod
    def locate(cls, path: str | os.PathLike, storage_options: dict[str, str] | None = None) -> Lake:
        """The lake at `path`, checking and creating nothing (what `spolake doctor` examines)."""
        root = str(path)
        return cls(root if _is_uri(root) else _local_root(root), storage_options)

    @classmethod
    def init(cls, path: str | os.PathLike, storage_options: dict[str, str] | None = None) -> Lake:
        """Create the lake (idempotent): every table of `schemas/` plus the snapshot registry. Never over existing
        data: a table whose log is lost, or a registry missing next to other tables, is a LakeError."""
        lake = cls.locate(path, storage_options)
        lake._refuse_links()
        if not _is_uri(lake.root):
            if Path(lake.root).is_file():
                raise LakeError(f"{lake.root}: a file is there; a lake is a directory")
            Path(lake.root).mkdir(parents=True, exist_ok=True)
        lake._require_registry()
        lake._create_missing([SNAPSHOTS, *table_names()])  # the registry first: tables without one mean it was lost
        return lake

    @classmethod
    def open(cls, path: str | os.PathLike, storage_options: dict[str, str] | None = None,
             create: bool = False) -> Lake:
        """Open the lake at `path` (a directory or object-store URI); `create` makes it if missing, else a missing
        lake is a LakeError. `storage_options` go to deltalake (credentials, endpoint, ...)."""
        lake = cls.locate(path, storage_options)
        lake._refuse_links()
        if not lake._is_table(SNAPSHOTS):
            if create:
                return cls.init(path, storage_options)
            lake._require_registry()
            lost = doctor.lost_log(lake, SNAPSHOTS)
            raise LakeError(lost or f"{lake.root}: not a lake (run `spolake init` or pass --lake)")
        lake._create_missing(table_names())  # tables added by a newer contract set appear on open
        return lake

    def _refuse_links(self) -> None:
        """A local lake's own directories (tables, their logs, leases) must not be symlinks: writing, vacuuming or
        quarantining through one changes files outside the lake."""
        if _is_uri(self.root):
            return
        for name in [SNAPSHOTS, *table_names(), inflight.LEASES, doctor.QUARANTINE, LOCK_FILE]:
            for path in (Path(self.root, name), Path(self.root, name, "_delta_log")):
                if path.is_symlink():
                    raise LakeError(f"{path}: is a symlink; a lake holds only its own files (refused, nothing "
                                    "changed; `spolake doctor` lists such entries)")
        for table in [SNAPSHOTS, *table_names()]:
            _plain_log(self.uri(table))

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
            self.create_table(t)

    def uri(self, table: str) -> str:
        """Where `table`'s Delta table lives (a path or URI any Delta reader opens)."""
        return f"{self.root.rstrip('/')}/{table}"

    def create_table(self, table: str) -> None:
        """Create `table` empty, with its contract's schema; nothing when it exists (also when another process creates
        it at the same moment). It does not check for a lost log over existing data files (`doctor.lost_log`): opening
        a lake checks that before creating the tables a newer contract set adds, and `spolake doctor` repairs a
        missing table with it."""
        c = contract(table)
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

    def lock(self) -> AbstractContextManager[Any]:
        """Exclusive lock for check-then-commit sections (ingest dedup, snapshot names, write leases and vacuum),
        never held around plain appends. Local lakes only: object stores have no such lock.

        An flock on `<lake>/_lake.lock` (the kernel drops it when the process dies). One FileLock per path
        (`is_singleton`) whose holds are counted per thread (`thread_local`): re-entrant within a thread, while
        another thread opens its own descriptor and waits like another process would.
        """
        if _is_uri(self.root):
            return nullcontext()
        return FileLock(os.path.join(self.root, LOCK_FILE), is_singleton=True, poll_interval=0.01)

    def delta(self, table: str, version: int | None = None) -> DeltaTable:
        """The deltalake DeltaTable of `table` at `version` (latest when None). Every data file of that version must
        lie inside the table's directory (docs/security.md): a log naming one outside is a LakeError."""
        local = None if _is_uri(self.root) else self.uri(table)
        if local is not None:
            _plain_log(local)
        try:
            dt = DeltaTable(self.uri(table), version=version, storage_options=self.storage_options)
        except TableNotFoundError:
            raise LakeError(f"{self.uri(table)}: no such table") from None
        except DeltaError as exc:
            at = "latest version" if version is None else f"version {version}"
            raise LakeError(f"{self.uri(table)}: cannot load the {at}: {delta_message(exc)} "
                            "(run `spolake doctor`)") from None
        if (table, dt.version()) not in self._contained:
            for path in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist():
                why = escape(local, path)
                if why:
                    raise LakeError(f"{self.uri(table)}@{dt.version()}: the log names data file {path!r}, {why}: "
                                    "refused, nothing read (run `spolake doctor`)")
            self._contained.add((table, dt.version()))
        return dt

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
            # A failure (a Ctrl-C) can land between a commit and its bookkeeping: what the log references stays.
            for table in lease.tables:
                lease.committed(table, [os.path.basename(unquote(f)) for f in self.files(table)])
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

    def commit(self, staged: Staged, *, work: Work | None = None) -> int:
        """Commit staged rows as one Delta append; returns the table version after it."""
        return self._commit(staged, work)[0]

    def commit_rows(self, staged: Staged) -> int:
        """Commit like `commit`; returns how many rows were added (rows whose key a concurrent writer committed
        first are not)."""
        return self._commit(staged)[1]

    def _commit(self, staged: Staged, work: Work | None = None) -> tuple[int, int]:
        """Commit `staged`: (table version after, rows added).

        The staged files must all still be there (checked with the lease marked `committing`). Rows whose key
        (`insert_key`) the table already holds are dropped, checked against the very version the commit is built
        on; delta-rs rejects the commit if another keyed commit (or, with `work`, another commit of the scope)
        landed after that version, and then the check is redone on the new version (past any other commit that
        landed first, delta-rs retries itself). Raises `Replan` when `work`'s scope moved on since the work was
        planned. Staged files not committed are deleted, and a lease the Staged took itself is released, whatever
        happens.
        """
        c, key = contract(staged.table), insert_key(staged.table)
        try:
            if staged.num_rows:
                self._committing(staged.lease, staged.table, [a.path for a in staged.actions or []])
            dt = self.delta(staged.table)
            while True:
                dt = self._evolve(dt, c)
                apps = [_guard(staged.table)] if key else []
                if work is not None:
                    if dt.transaction_version(work.app_id) != work.seen:
                        self._discard(staged)
                        raise Replan(work.scope)
                    apps.append(work.app_id)
                if key and staged.num_rows:
                    staged = self._without_present(dt, staged, key)
                if staged.num_rows == 0:
                    return dt.version(), 0
                txns = [Transaction(app, (dt.transaction_version(app) or 0) + 1) for app in apps]
                props = CommitProperties(max_commit_retries=COMMIT_RETRIES, app_transactions=txns or None)
                try:
                    if staged.actions is None:
                        assert staged.data is not None  # an object-store Staged carries its rows
                        write_deltalake(dt, staged.data, mode="append", commit_properties=props)
                    else:
                        dt.create_write_transaction(list[AddAction | RemoveAction](staged.actions), mode="append",
                                                    schema=dt.schema(), commit_properties=props)
                except CommitFailedError:
                    dt = self.delta(staged.table)
                    if not _lost_to(dt, txns):
                        self._discard(staged)
                        raise
                    continue  # delta-rs cannot redo our key check (nor `work`'s) on the winner's rows: re-plan here
                if staged.lease is not None:  # its discard must not delete these now
                    staged.lease.committed(staged.table, [a.path for a in staged.actions or []])
                if work is not None:
                    work.seen = txns[-1].version
                dt.update_incremental()  # reads only the log entries since `dt`: a full load grows with the table
                return dt.version(), staged.num_rows
        finally:
            if staged.owns_lease and staged.lease is not None:
                staged.lease.release()

    def _without_present(self, dt: DeltaTable, staged: Staged, key: tuple[str, ...]) -> Staged:
        """`staged` less the rows whose key the table holds at `dt`'s version (rewritten only if any is)."""
        if staged.actions is None:
            assert staged.data is not None  # an object-store Staged carries its rows
            data = staged.data
        else:
            data = pa.concat_tables(pq.read_table(os.path.join(self.uri(staged.table), a.path), columns=list(key))
                                    for a in staged.actions)
        keys = cast(pl.DataFrame, pl.from_arrow(data.select(list(key)))).with_row_index("_row")
        first = keys.get_column(key[0]).drop_nulls().unique().to_arrow()
        held = dt.to_pyarrow_dataset().to_table(columns=list(key), filter=pc.field(key[0]).isin(first))
        if held.num_rows == 0:
            return staged
        present = keys.join(cast(pl.DataFrame, pl.from_arrow(held)).unique(), on=list(key), how="semi",
                            nulls_equal=True)
        mask = pc.invert(pc.is_in(pa.array(range(data.num_rows), pa.uint32()), present.get_column("_row").to_arrow()))
        if staged.actions is None:
            kept = data.filter(mask)
            return replace(staged, num_rows=kept.num_rows, data=kept)
        full = pa.concat_tables(pq.read_table(os.path.join(self.uri(staged.table), a.path)) for a in staged.actions)
        self._discard(staged)
        # the rewrite stays under the same lease (already `committing`: its files are never deleted as a dead write's)
        return replace(self.stage(staged.table, [full.filter(mask)], staged.lease), owns_lease=staged.owns_lease)

    def _discard(self, staged: Staged) -> None:
        """Delete the files of staged rows that will not be committed (local lakes; nothing else wrote them)."""
        for a in staged.actions or []:
            Path(self.uri(staged.table), a.path).unlink(missing_ok=True)

    def _committing(self, lease: Lease | None, table: str, paths: list[str]) -> None:
        """Mark `lease` committing, then check the staged files `paths` of `table` are all still there."""
        if lease is not None:
            lease.committing()
        try:  # a file deleted since staging (a vacuum that ignored the lease) must not be referenced
            inflight.check_staged(self.store(), table, paths)
        except FileNotFoundError as exc:
            raise LakeError(str(exc)) from None

    def append(self, table: str, rows: Rows) -> int:
        """Append rows (conformed to the table's contract) in one commit; returns the table version after it."""
        with self.writing() as lease:
            return self.commit(self.stage(table, [rows], lease))

    def added(self, table: str, rows: Rows) -> int:
        """Append rows like `append`; returns how many were added (the others' keys were already there)."""
        with self.writing() as lease:
            return self.commit_rows(self.stage(table, [rows], lease))

    def claim(self, scope: str, table: str,
              replan: Callable[[dict[str, list[dict[str, Any]]]], dict[str, list[dict[str, Any]]]]) -> Work:
        """Claim work of `scope` before planning it from the lake (see `Work`)."""
        work = Work(scope, table, replan)
        work.seen = self.delta(table).transaction_version(work.app_id)
        return work

    def append_many(self, batches: Mapping[str, Rows], *, work: Work | None = None) -> dict[str, int]:
        """Append to several tables, conforming and writing ALL of them before the first commit.

        Commits go in the given order, under the lake lock so no snapshot falls between them; callers put the
        table that makes the batch visible (e.g. trajectories) last, so a crash in between leaves only unreferenced
        facts that a retry re-uses. With `work` (rows as lists of dicts), its `replan` runs first whenever another
        copy committed work of the scope, and the claimed table commits first, carrying the scope's guard: a copy
        that loses the race commits nothing of the batch (a crash after that first commit leaves, e.g., a
        trajectory without its verdict, which `evaluate` supplies).
        """
        remaining = _first(dict(batches), work.table) if work is not None else dict(batches)
        with self.writing() as lease:
            while True:
                if work is not None:
                    seen = self.delta(work.table).transaction_version(work.app_id)
                    if seen != work.seen:
                        planned = cast(dict[str, list[dict[str, Any]]], remaining)  # `work` rows are dict lists
                        remaining = _first({t: rows for t, rows in work.replan(planned).items() if len(rows)},
                                           work.table)
                        work.seen = seen
                staged = [self.stage(t, [rows], lease) for t, rows in remaining.items()]
                try:
                    with self.lock():
                        return {s.table: self.commit(s, work=work if work is not None and s.table == work.table
                                                     else None)
                                for s in staged if s.num_rows}
                except Replan:  # raised by the first commit only, so nothing of the batch landed
                    for s in staged:
                        self._discard(s)

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
            row = {"name": name, "versions": json.dumps(versions), "note": note, "deleted": False}
            if not self.added(SNAPSHOTS, [row]):  # a concurrent writer took the name after the check above
                raise LakeError(f"snapshot {name!r} already exists (snapshots are immutable)")
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
        """Every snapshot not deleted, oldest first. A registry row that is not a snapshot (a name, and versions as
        a JSON object of table → non-negative version) is a LakeError naming it: pins decide what vacuum keeps."""
        return [Snapshot(r["name"], _pinned_versions(r), r["note"], r["created_at"])
                for r in self._snapshot_rows().values() if not r["deleted"]]

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
            empty = cast(pl.DataFrame, pl.from_arrow(contract(table).arrow_schema.empty_table()))
            return pl.LazyFrame(schema=empty.schema)
        if _is_uri(self.root):
            return pl.scan_delta(self.uri(table), version=version, storage_options=self.storage_options)
        return pl.scan_parquet(files, missing_columns="insert", extra_columns="ignore")

    def connect(self, snapshot: str | Snapshot | None = None, threads: int | None = None,
                tables: list[str] | None = None) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with `tables` (default: all) as views at the snapshot's versions."""
        con = duckdb.connect()
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        versions = self.resolve(snapshot)
        for table in tables or table_names():
            version = versions[table]
            files = self.files(table, version)
            if not files:
                con.register(f"_{table}_empty", contract(table).arrow_schema.empty_table())
                con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM "_{table}_empty"')
            elif _is_uri(self.root):
                con.register(f"_{table}_ds", self.arrow_dataset(table, version))
                con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM "_{table}_ds"')
            else:  # a view cannot take parameters: the file list is quoted into it
                paths = ", ".join(sql_literal(f) for f in files)
                con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM read_parquet([{paths}], union_by_name = true)')
            add_missing_columns(con, table)
        return con

    def sql(self, query: str, snapshot: str | Snapshot | None = None,
            params: dict[str, Any] | list[Any] | None = None, writes: bool = False) -> pa.Table:
        """Run DuckDB SQL with every table visible as a view at the snapshot's versions; `params` bind `$name` (a
        dict) or `?` (a list) placeholders, so values never need quoting into the query. Only SELECT statements
        run unless `writes` (COPY ... TO, CREATE, ATTACH, INSTALL/LOAD, SET write files or change the session)."""
        if not writes:
            require_read_only(query)
        try:
            con = self.connect(snapshot, tables=referenced_tables(query))
            try:
                rel = con.sql(query, params=params)
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

    def compact(self, tables: Iterable[str] | None = None, *,
                below_bytes: int = COMPACT_BELOW_BYTES) -> dict[str, dict[str, Any]]:
        """Bin-pack the files smaller than `below_bytes` into large ones. Old versions stay readable (their files
        are kept).

        Each commit removes exactly the files it rewrote, from the version it read, and carries the table's guard:
        delta-rs rejects it when another compaction (or keyed commit) landed after that version, and the loser
        re-plans from the new version. (delta-rs's own OPTIMIZE lets two concurrent runs both land, duplicating
        every row.) The new files are written under a write lease, so no vacuum deletes them before their commit.
        """
        return {t: self._compact(t, below_bytes) for t in tables or [*table_names(), SNAPSHOTS]}

    def _compact(self, table: str, below_bytes: int) -> dict[str, int]:
        c, fs = contract(table), self._filesystem(table)
        done = {"numFilesRemoved": 0, "numFilesAdded": 0}
        written: set[str] = set()
        while True:
            dt = self._evolve(self.delta(table), c)
            files = pa.table(dt.get_add_actions(flatten=True)).select(["path", "size_bytes"]).to_pylist()
            small = [f for f in files if f["size_bytes"] < below_bytes and f["path"] not in written]
            if len(small) < 2:
                return done
            rewrite: list[dict[str, Any]] = []
            total = 0
            for f in small:  # one bin per commit bounds memory; the loop takes the next bin
                if rewrite and total + f["size_bytes"] > COMPACT_BIN_BYTES:
                    break
                rewrite.append(f)
                total += f["size_bytes"]
            data = pa.concat_tables([c.conform(pq.read_table(unquote(f["path"]), filesystem=fs)) for f in rewrite])
            with self.writing() as lease:  # one bin's write and commit (an object-store lease lasts an hour)
                lease.staging(table)
                adds = write_files(self.uri(table), [data], prefix=lease.prefix, filesystem=fs, data_change=False)
                now = int(time.time() * 1000)
                removes = [RemoveAction(f["path"], False, now, f["size_bytes"]) for f in rewrite]
                # delta-rs 1.6 does not reject a second removal of the same file (ConcurrentDeleteDelete), so the
                # commit also carries the table's guard: any keyed commit or compaction since `dt`'s version
                # rejects it.
                guard = Transaction(_guard(table), (dt.transaction_version(_guard(table)) or 0) + 1)
                self._committing(lease, table, [a.path for a in adds])
                props = CommitProperties(max_commit_retries=COMMIT_RETRIES, app_transactions=[guard])
                try:
                    dt.create_write_transaction([*adds, *removes], mode="append", schema=dt.schema(),
                                                commit_properties=props)
                except CommitFailedError:
                    for a in adds:
                        fs.delete_file(a.path)
                    if not _lost_to(self.delta(table), [guard]):
                        raise
                    continue  # another commit may have removed some of these files: re-plan from the new version
                lease.committed(table, [a.path for a in adds])
            written |= {a.path for a in adds}
            done["numFilesRemoved"] += len(removes)
            done["numFilesAdded"] += len(adds)

    def _filesystem(self, table: str) -> pafs.FileSystem:
        """A pyarrow filesystem rooted at `table`'s directory (delta-rs's object store for URI lakes)."""
        if _is_uri(self.root):
            return pafs.PyFileSystem(DeltaStorageHandler(self.uri(table), self.storage_options))
        return pafs.SubTreeFileSystem(self.uri(table), pafs.LocalFileSystem())

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
            self._refuse_links()
            foreign = [] if _is_uri(self.root) else foreign_entries(self.root)
            escaping = [f"{where}: {path}" for t in tables for where, path, _ in doctor.escaping_paths(self, t)]
            if foreign or escaping:  # delta-rs would list through a symlink and delete what it finds there
                raise LakeError(f"{self.root}: vacuum refused, nothing deleted: {(foreign + escaping)[0]} "
                                f"({len(foreign + escaping)} entries a lake must not hold; run `spolake doctor`)")
            loaded = {t: self.delta(t) for t in tables}  # every log must load before a file is deleted
            since, killed = inflight.live_since(self.store(), None if _is_uri(self.root) else self.root, tables,
                                                clean=not dry_run)
            pinned = self.pinned_versions()
            for t, dt in loaded.items():
                keep = sorted(pinned.get(t, set()) | {dt.version()})
                common: dict[str, Any] = dict(dry_run=dry_run, enforce_retention_duration=False, keep_versions=keep)
                gone = set(dt.vacuum(retention_hours=int(retention_hours), full=False, **common))
                if orphan_age_hours is not None:
                    age = max(int(retention_hours), int(orphan_age_hours),
                              inflight.protected_hours(since, _is_uri(self.root)))
                    gone |= set(dt.vacuum(retention_hours=age, full=True, **common))
                out[t] = sorted(gone | {p.split("/", 1)[1] for p in killed if p.startswith(f"{t}/")})
        return out


def _plain_log(table_dir: str) -> None:
    """A local table's directory and Delta log are real directories holding only files and directories: delta-rs
    opens every log entry, and a FIFO there blocks forever, a symlink reads outside the lake."""
    log = os.path.join(table_dir, "_delta_log")
    if os.path.islink(table_dir) or os.path.islink(log):
        raise LakeError(f"{table_dir}: the table directory or its _delta_log is a symlink; a lake holds only its own "
                        "files (refused; run `spolake doctor`)")
    if not os.path.isdir(log):
        return
    with os.scandir(log) as entries:  # d_type only: no stat per entry
        odd = next((e.name for e in entries if not (e.is_file(follow_symlinks=False)
                                                    or e.is_dir(follow_symlinks=False))), None)
    if odd is not None:
        raise LakeError(f"{log}/{odd}: a symlink or special file in a Delta log (refused; run `spolake doctor`)")


def _pinned_versions(row: dict[str, Any]) -> dict[str, int]:
    try:
        versions = json.loads(row["versions"]) if isinstance(row["versions"], str) else None
    except (ValueError, RecursionError):
        versions = None
    if not isinstance(row["name"], str) or not isinstance(versions, dict) or not all(
            isinstance(t, str) and type(v) is int and 0 <= v < 2**63 for t, v in versions.items()):
        shown = (row["versions"] or "")[:80] if isinstance(row["versions"], str) else row["versions"]
        raise LakeError(f"snapshot registry: row {str(row['name'])[:80]!r}: field `versions`: {shown!r} is not a "
                        "JSON object of table -> version (a damaged registry: restore it from a backup)")
    return versions


def _lost_to(dt: DeltaTable, txns: list[Transaction]) -> bool:
    """Whether `dt` (read after a failed commit) holds another commit of one of `txns`' app ids: delta-rs rejects
    a commit outright when one landed since its read version (ConcurrentTransaction), so each such failure is
    another writer's progress and the commit is re-planned from `dt`; any other failure is raised."""
    return any((dt.transaction_version(t.app_id) or 0) >= t.version for t in txns)


def _first(batches: dict[str, Any], table: str) -> dict[str, Any]:
    """`batches` with `table` (if present) moved to the front."""
    return {**({table: batches[table]} if table in batches else {}), **batches}


def _to_arrow(rows: Rows) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pl.DataFrame):
        return rows.to_arrow()
    if isinstance(rows, list):  # the union of the rows' keys: pyarrow's from_pylist keeps only the first row's
        keys = list(dict.fromkeys(k for row in rows for k in row))
        return pa.table({k: [row.get(k) for row in rows] for k in keys})
    raise TypeError(f"rows must be a pyarrow Table, polars DataFrame or list of dicts, not {type(rows).__name__}")
