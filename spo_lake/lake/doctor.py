"""Damage: what opening a lake refuses, what `snapshot create` checks, and `spolake doctor`.

A lake is damaged when a table's log is gone while its data files remain, a log entry or checkpoint is unreadable,
a file a version references is missing or not valid Parquet, or the snapshot registry is gone or names versions
that cannot be read. Nothing here re-creates a table over existing data or deletes a data file. Repairs are the ones
Delta allows: drop a truncated last log entry (its commit is lost, its data files stay), and rebuild a checkpoint
from the log entries it summarises. Damaged log files are moved to `_quarantine/`, never deleted.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from spo_lake.lake.errors import LakeError, delta_message
from spo_lake.lake.store import Store, data_files, escape, foreign_entries

SNAPSHOTS = "snapshots"
QUARANTINE = "_quarantine"


class Pin(Protocol):
    """A snapshot as the doctor reads it (`core.Snapshot` is one)."""
    @property
    def name(self) -> str: ...
    @property
    def versions(self) -> dict[str, int]: ...


class Examined(Protocol):
    """What the doctor examines of a lake (`core.Lake` is one; core uses this module, so this one names what it needs
    instead of importing core): where it is, its snapshots, and creating a missing table empty."""
    root: str
    storage_options: dict[str, str] | None

    def uri(self, table: str) -> str: ...
    def snapshots(self) -> Sequence[Pin]: ...
    def create_table(self, table: str) -> None: ...


@dataclass(frozen=True)
class Finding:
    """One thing wrong with a lake, and its repair when Delta allows one."""
    where: str  # a table, a file, or a snapshot
    what: str
    fix: str | None = None  # what the repair does; None when only a backup can help
    repair: Callable[[], None] | None = None

    def line(self) -> str:
        return f"{self.where}: {self.what}" + (f" [repairable: {self.fix}]" if self.fix else "")


# ---- what opening refuses --------------------------------------------------------------------------------------
def lost_log(lake: Examined, table: str) -> str | None:
    """Why `table` must not be created: it holds data files but no Delta log (None when it holds no data)."""
    files = data_files(Store(lake.root, lake.storage_options).list(table))
    if not files:
        return None
    what = "the snapshot registry" if table == SNAPSHOTS else f"table {table!r}"
    return (f"{lake.uri(table)}: {what} has {len(files)} data files but no _delta_log: its log was lost; restore "
            f"{table}/_delta_log from a backup (nothing was changed; `spolake doctor` lists the damage)")


def missing_registry(lake: Examined, tables: list[str]) -> str:
    return (f"{lake.root}: the snapshot registry ({SNAPSHOTS}/_delta_log) is missing while tables "
            f"{', '.join(tables)} exist: every snapshot would be lost; restore it from a backup, or run "
            "`spolake doctor --yes` to start an empty registry")


# ---- files of a version ----------------------------------------------------------------------------------------
def version_problems(lake: Examined, table: str, version: int | None, store: Store | None = None,
                     checked: dict[str, str | None] | None = None) -> list[Finding]:
    """Files `table` references at `version` (latest when None) that are missing, of the wrong size, or not valid
    Parquet. `checked` caches verdicts per file across versions."""
    store = store or Store(lake.root, lake.storage_options)
    checked = {} if checked is None else checked
    dt = DeltaTable(lake.uri(table), version=version, storage_options=lake.storage_options)
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    stored = {f.path: f.size for f in data_files(store.list(table))}
    out = []
    local = None if "://" in lake.root else lake.uri(table)
    for path, size in zip(actions["path"], actions["size_bytes"]):
        if escape(local, path):  # `escaping_paths` reports it; never read it
            continue
        key = f"{table}/{path}"
        if key not in checked:
            checked[key] = _file_problem(store, key, size, stored.get(key))
        if checked[key]:
            out.append(Finding(key, f"{checked[key]} (referenced by {table}@{dt.version()}; restore it from a backup)"))
    return out


def escaping_paths(lake: Examined, table: str) -> list[tuple[str, str, str]]:
    """(log file, path, why) for each add or remove action of `table`'s log (every entry and checkpoint, whether or
    not the table loads) whose path leads out of the table: reading it would read outside the lake, vacuuming it
    would delete outside."""
    store = Store(lake.root, lake.storage_options)
    local = None if "://" in lake.root else lake.uri(table)
    out = []
    for f in store.list(f"{table}/_delta_log"):
        paths: list[str] = []
        try:
            if f.path.endswith(".json"):
                for line in store.read(f.path).decode("utf-8", errors="replace").splitlines():
                    action = json.loads(line) if line.strip() else {}
                    for kind in ("add", "remove"):
                        if isinstance(action, dict) and isinstance(action.get(kind), dict):
                            paths.append(str(action[kind].get("path")))
            elif f.path.endswith(".checkpoint.parquet"):
                got = pq.read_table(store.handler.open_input_file(f.path), columns=["add", "remove"])
                for kind in ("add", "remove"):
                    paths += [p for p in pc.struct_field(got.column(kind), "path").to_pylist() if p]
        except (ValueError, RecursionError, KeyError, pa.ArrowException, OSError):
            continue  # an unreadable entry is the log's own finding
        out += [(f.path, p, why) for p in paths if (why := escape(local, p))]
    return out


def _file_problem(store: Store, path: str, size: int, stored_size: int | None) -> str | None:
    if stored_size is None:
        return "missing"
    if stored_size != size:
        return f"damaged: {stored_size} bytes where the log recorded {size}"
    try:
        store.parquet_rows(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt footer
        return f"not a valid Parquet file ({' '.join(str(exc).split())})"
    return None


def require_intact(lake: Examined, versions: dict[str, int]) -> None:
    """LakeError naming the first missing or invalid file of any table at `versions` (what a snapshot would pin)."""
    store = Store(lake.root, lake.storage_options)
    for table, version in versions.items():
        problems = version_problems(lake, table, version, store)
        if problems:
            raise LakeError(f"cannot pin {table}@{version}: {problems[0].where} is {problems[0].what.split(' (')[0]} "
                            f"({len(problems)} damaged files; run `spolake doctor`)")


# ---- the doctor --------------------------------------------------------------------------------------------------
def diagnose(lake: Examined, tables: list[str]) -> list[Finding]:
    """Every problem of every table, its pinned versions and the snapshot registry; one Finding each."""
    store = Store(lake.root, lake.storage_options)
    problems: list[Finding] = [
        Finding(entry, "a symlink or special file: a lake holds only directories and regular files; nothing reads, "
                       "writes or deletes through it (remove it by hand after checking where it leads)")
        for entry in ([] if "://" in lake.root else foreign_entries(lake.root))]
    if problems:
        return problems  # examining (or repairing) further would read and write through them
    present = [t for t in tables if t != SNAPSHOTS and DeltaTable.is_deltatable(lake.uri(t), lake.storage_options)]
    for t in [SNAPSHOTS, *tables]:
        problems += [Finding(entry, f"names data file {path!r}, {why}: refused by every reader, vacuum and "
                                    "compaction (restore the table from a backup)")
                     for entry, path, why in escaping_paths(lake, t)]
    loaded: dict[str, DeltaTable] = {}
    for t in [SNAPSHOTS, *tables]:  # the registry first: its pins decide which repairs are safe
        if not DeltaTable.is_deltatable(lake.uri(t), lake.storage_options):
            problems.append(_missing_table(lake, t, present))
            continue
        try:
            loaded[t] = DeltaTable(lake.uri(t), storage_options=lake.storage_options)
        except DeltaError as exc:
            problems += _log_problems(lake, store, t, exc, _pins(lake, loaded))
            continue
        problems += _checkpoint_pointer(lake, store, t)
    if SNAPSHOTS in loaded:
        try:
            lake.snapshots()
        except LakeError as exc:
            problems.append(Finding(SNAPSHOTS, str(exc).removeprefix("snapshot registry: ")))
    pins = _pins(lake, loaded)
    checked: dict[str, str | None] = {}
    for t, dt in loaded.items():
        for v in sorted({dt.version(), *(v for v, _ in pins.get(t, []))}):
            try:
                problems += version_problems(lake, t, v, store, checked)
            except DeltaError as exc:
                names = ", ".join(sorted({s for pv, s in pins.get(t, []) if pv == v}))
                problems.append(Finding(f"snapshot {names}", f"pins {t}@{v}, which cannot be read: "
                                                             f"{delta_message(exc)}"))
    return problems


def _missing_table(lake: Examined, table: str, present: list[str]) -> Finding:
    lost = lost_log(lake, table)
    if lost:
        return Finding(table, lost.split(": ", 1)[1])
    if table == SNAPSHOTS and present:
        return Finding(table, "the snapshot registry is missing (every snapshot is lost unless restored from a "
                              "backup)", "start an empty registry", partial(lake.create_table, table))
    return Finding(table, "table missing (it holds no data)", "create it empty",
                   partial(lake.create_table, table))


def _pins(lake: Examined, loaded: dict[str, DeltaTable]) -> dict[str, list[tuple[int, str]]]:
    """{table: [(version, snapshot name)]} from the registry; empty when the registry itself cannot be read."""
    if SNAPSHOTS not in loaded:
        return {}
    try:
        snaps = lake.snapshots()
    except (LakeError, DeltaError, OSError):
        return {}  # `registry_problems` reports it
    out: dict[str, list[tuple[int, str]]] = {}
    for s in snaps:
        for t, v in s.versions.items():
            out.setdefault(t, []).append((v, s.name))
    return out


def _parses_as_json_lines(data: bytes) -> bool:
    try:
        for line in data.decode("utf-8").splitlines():
            if line.strip():
                json.loads(line)
    except ValueError:
        return False
    return True


def _valid_parquet(store: Store, path: str) -> bool:
    try:
        store.parquet_rows(path)
    except Exception:  # pyarrow raises several types for a corrupt file
        return False
    return True


def _log_problems(lake: Examined, store: Store, table: str, exc: DeltaError,
                  pins: dict[str, list[tuple[int, str]]]) -> list[Finding]:
    """Why `table`'s log does not load, and the repair Delta allows for it, if any."""
    log = f"{table}/_delta_log"
    files = store.list(log)
    entries = {int(f.path.rsplit("/", 1)[1][:20]): f for f in files if f.path.endswith(".json")
               and f.path.rsplit("/", 1)[1][:20].isdigit()}
    checkpoints = {int(f.path.rsplit("/", 1)[1][:20]): f for f in files if f.path.endswith(".checkpoint.parquet")}
    bad = {v for v, f in entries.items() if not _parses_as_json_lines(store.read(f.path))}
    problems = []
    last = max(entries, default=None)
    if last in bad:
        pinned = sorted(s for v, s in pins.get(table, []) if v >= last)
        where = entries[last].path
        what = f"the last log entry (version {last}) is truncated or corrupt, so the table cannot be read"
        if pinned:
            problems.append(Finding(where, f"{what}; snapshot {', '.join(pinned)} pins it: restore it from a backup"))
        else:
            problems.append(Finding(where, what, f"move it to {QUARANTINE}/ (that commit is dropped: rerun its write)",
                                    lambda: _quarantine(store, [where])))
    for v, f in sorted(checkpoints.items()):
        if _valid_parquet(store, f.path):
            continue
        complete = all(u in entries and u not in bad for u in range(v + 1))
        if complete:
            moved = [f.path] + [p.path for p in files if p.path.endswith("/_last_checkpoint")]
            problems.append(Finding(f.path, f"checkpoint {v} is corrupt", "move it aside and rebuild the checkpoint "
                                    "from the log entries", partial(_rebuild_checkpoint, lake, store, table, moved)))
        else:
            problems.append(Finding(f.path, f"checkpoint {v} is corrupt and log entries before it are missing: "
                                            "restore it from a backup"))
    for v in sorted(bad - {last}):
        problems.append(Finding(entries[v].path, f"log entry {v} is corrupt: restore it from a backup"))
    return problems or [Finding(table, f"log cannot be read: {delta_message(exc)}")]


def _checkpoint_pointer(lake: Examined, store: Store, table: str) -> list[Finding]:
    """A readable table whose `_last_checkpoint` is corrupt (delta-rs then lists the whole log on every open)."""
    path = f"{table}/_delta_log/_last_checkpoint"
    if not store.exists(path) or _parses_as_json_lines(store.read(path)):
        return []
    return [Finding(path, "corrupt checkpoint pointer", "rebuild it from a new checkpoint",
                    lambda: _rebuild_checkpoint(lake, store, table, [path]))]


def _quarantine(store: Store, paths: list[str]) -> None:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    for p in paths:
        store.move(p, f"{QUARANTINE}/{stamp}/{p}")


def _rebuild_checkpoint(lake: Examined, store: Store, table: str, damaged: list[str]) -> None:
    _quarantine(store, damaged)
    DeltaTable(lake.uri(table), storage_options=lake.storage_options).create_checkpoint()
