"""Writes in flight: leases that keep vacuum away from files staged but not yet committed.

A writer takes a lease (`_writers/<id>.lease`) before it writes its first data file, names its files after the lease
(`part-<id>-...`), marks the lease `committing` just before its commit and drops it after. Vacuum (`live_since`)
keeps every file written since the oldest live lease began, and a commit checks its staged files are all still there
(`check_staged`), so no vacuum can delete a file a commit is about to reference.

- Local lakes: the writer holds an flock on its lease file; the lease is live exactly while that lock is held (the
  kernel drops it when the writer dies). Taking a lease and vacuuming both hold the lake lock, so a vacuum never
  falls between a lease's start and its first file.
- Object stores (no lock): a lease is live for LEASE_TIMEOUT_S after it was taken (object-store writers hold their
  rows in memory and write them at commit, and compaction takes a lease per bin it rewrites, so that is the whole
  write), and vacuum keeps one extra hour of files, so a lease taken while a vacuum runs is covered too.

A dead lease that never reached `committing` belongs to a writer killed while staging: its files were never
committed, so vacuum deletes them at once. One that reached `committing` may have committed: its files are left
to the ordinary orphan rule (unreferenced and older than the orphan age).
"""
from __future__ import annotations

import fcntl
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO

from spo_lake.lake.store import Store, data_files

LEASES = "_writers"
LEASE_TIMEOUT_S = 3600
COMMITTING = b"committing\n"


@dataclass
class Lease:
    """One writer's claim; `prefix` starts the name of every data file it stages."""

    store: Store
    local_root: str | None  # the lake directory of a local lake; None on an object store
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    tables: set[str] = field(default_factory=set)  # where it stages files
    done: set[str] = field(default_factory=set)  # files it committed ("table/file")
    _fh: IO[bytes] | None = None

    @property
    def path(self) -> str:
        return f"{LEASES}/{self.id}.lease"

    @property
    def prefix(self) -> str:
        return f"part-{self.id}"

    def take(self) -> Lease:
        if self.local_root is None:
            self.store.write(self.path, b"staging\n")
            return self
        os.makedirs(os.path.join(self.local_root, LEASES), exist_ok=True)
        self._fh = open(os.path.join(self.local_root, self.path), "ab")
        fcntl.flock(self._fh, fcntl.LOCK_EX)
        self._fh.write(b"staging\n")
        self._fh.flush()
        return self

    def staging(self, table: str) -> None:
        self.tables.add(table)

    def committed(self, table: str, paths: list[str]) -> None:
        self.done.update(f"{table}/{p}" for p in paths)

    def discard(self) -> None:
        """Delete every file it staged and did not commit (the write failed, maybe half way through a staging)."""
        for table in self.tables:
            for f in data_files(self.store.list(table)):
                if os.path.basename(f.path).startswith(self.prefix) and f.path not in self.done:
                    self.store.delete(f.path)

    def committing(self) -> None:
        """From here on the files may be committed: a dead lease in this state must not have its files deleted."""
        if self._fh is not None:
            self._fh.write(COMMITTING)
            self._fh.flush()
        elif self.local_root is None:
            self.store.write(self.path, b"staging\n" + COMMITTING)

    def release(self) -> None:
        try:
            self.store.delete(self.path)
        except (FileNotFoundError, OSError):
            pass
        if self._fh is not None:
            self._fh.close()  # releases the flock
            self._fh = None


def _alive(store: Store, local_root: str | None, path: str, mtime: datetime) -> bool:
    if local_root is None:
        return time.time() - mtime.timestamp() < LEASE_TIMEOUT_S
    try:
        with open(os.path.join(local_root, path), "rb") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # only a dead writer's lease can be locked
    except BlockingIOError:
        return True
    except FileNotFoundError:  # released meanwhile
        return False
    return False


def live_since(store: Store, local_root: str | None, tables: list[str],
               clean: bool = True) -> tuple[datetime | None, list[str]]:
    """When the oldest live lease began (None when no write is in flight), and the staged files of writers killed
    before their commit. With `clean`, those files and the dead leases are deleted."""
    oldest, dead_files = None, []
    for lease in store.list(LEASES):
        if _alive(store, local_root, lease.path, lease.mtime):
            oldest = lease.mtime if oldest is None else min(oldest, lease.mtime)
            continue
        if COMMITTING not in store.read(lease.path):
            prefix = f"part-{os.path.basename(lease.path).removesuffix('.lease')}"
            dead_files += [f.path for t in tables for f in data_files(store.list(t))
                           if os.path.basename(f.path).startswith(prefix)]
        if clean:
            store.delete(lease.path)
    if clean:
        for path in dead_files:
            store.delete(path)
    return oldest, dead_files


def protected_hours(since: datetime | None, object_store: bool) -> int:
    """The orphan age (whole hours, as delta-rs takes it) that keeps every file written since `since`."""
    if since is None:
        return 1 if object_store else 0
    age_h = (datetime.now(UTC) - since).total_seconds() / 3600
    return math.ceil(age_h) + 1


def check_staged(store: Store, table: str, paths: list[str]) -> None:
    """Raise FileNotFoundError naming the first staged file that is gone (a commit must not reference it)."""
    for p in paths:
        if not store.exists(f"{table}/{p}"):
            raise FileNotFoundError(f"{table}: staged file {p} was deleted before the commit (a vacuum with "
                                    "--orphan-age-hours 0 while writing?); nothing was committed, run the write again")
