"""The lake's files below the Delta level: list, read, write, move and delete, on a local disk or an object store.

Delta (delta-rs) only sees tables through their logs. The damage checks (`doctor.py`) and the write leases
(`inflight.py`) need to see what is really stored: data files a missing log no longer lists, log entries one by one,
lease files. deltalake's own object-store layer (`DeltaStorageHandler`, given the lake's storage options) serves
both kinds of lake with the same credentials the tables use.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from urllib.parse import unquote

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.exceptions import TableNotFoundError
from deltalake.fs import DeltaStorageHandler


@dataclass(frozen=True)
class StoredFile:
    path: str  # relative to the lake root, '/'-separated
    size: int
    mtime: datetime


class Store:
    """The files under a lake root (a directory or an object-store URI); paths are relative to the root."""

    def __init__(self, root: str, storage_options: dict[str, str] | None = None):
        self.root, self.storage_options = root, storage_options

    @cached_property
    def handler(self) -> DeltaStorageHandler:
        return DeltaStorageHandler(self.root, self.storage_options)

    def _missing_root(self) -> bool:
        """A local lake directory that does not exist (yet): it holds no files."""
        if "://" not in self.root:
            return not os.path.isdir(self.root)
        try:
            return self.handler is None
        except TableNotFoundError:  # a file:// root that does not exist
            return True

    def list(self, prefix: str) -> list[StoredFile]:
        """Every file under `prefix` (recursively); none when it does not exist."""
        if self._missing_root():
            return []
        selector = pafs.FileSelector(prefix, recursive=True, allow_not_found=True)
        return [StoredFile(i.path, i.size, i.mtime) for i in self.handler.get_file_info_selector(selector)
                if i.type == pafs.FileType.File]

    def exists(self, path: str) -> bool:
        return not self._missing_root() and self.handler.get_file_info([path])[0].type == pafs.FileType.File

    def read(self, path: str) -> bytes:
        return self.handler.open_input_file(path).read()

    def write(self, path: str, data: bytes) -> None:
        # deltalake 1.6's pyarrow wrapper hands the Rust stream a pyarrow Buffer it refuses; write to the stream itself.
        stream = self.handler._handler.open_output_stream(path, None)
        stream.write(data)
        stream.close()  # type: ignore[attr-defined]  # deltalake's stub omits it; the Rust stream has close()

    def move(self, src: str, dst: str) -> None:
        self.handler.move(src, dst)

    def delete(self, path: str) -> None:
        self.handler.delete_file(path)

    def parquet_rows(self, path: str) -> int:
        """Rows of a Parquet file, from its footer; raises when the file is not valid Parquet."""
        return pq.read_metadata(self.handler.open_input_file(path)).num_rows


def data_files(files: list[StoredFile]) -> list[StoredFile]:
    """The Parquet data files among `files` (not the log's checkpoints)."""
    return [f for f in files if f.path.endswith(".parquet") and "/_delta_log/" not in f"/{f.path}"]



# ---- containment: nothing a lake names may lead out of it (docs/security.md) -----------------------------------
def unsafe_path(path: str) -> str | None:
    """Why a data-file path of a Delta log (relative to its table, percent-encoded) would leave the table: absolute,
    a URI, or a `..` segment. None when it stays inside (as a string: `escape` also follows symlinks)."""
    plain = unquote(path)
    if not plain or "://" in plain or plain.startswith("/") or "\0" in plain:
        return "an absolute path or URI"
    if ".." in plain.split("/"):
        return "a path with '..'"
    return None


def escape(table_dir: str | None, path: str) -> str | None:
    """Why `path` (a log's data-file path) leads out of the table at `table_dir` (a local directory; None for an
    object store, where only the string is checked): `unsafe_path`, a symlink out, or not a regular file."""
    why = unsafe_path(path)
    if why or table_dir is None:
        return why
    full = os.path.join(table_dir, unquote(path))
    try:
        mode = os.lstat(full).st_mode
    except OSError:  # missing: the doctor's other finding
        return None
    # The common case, one lstat: a regular file directly in the table directory (not a symlink, checked by callers)
    if "/" in unquote(path) or stat.S_ISLNK(mode):
        if not os.path.realpath(full).startswith(os.path.realpath(table_dir) + os.sep):
            return "a symlink leading out of the table"
        try:
            mode = os.stat(full).st_mode
        except OSError:
            return None
    return None if stat.S_ISREG(mode) else "not a regular file (reading a FIFO or device would never end)"


def foreign_entries(root: str) -> list[str]:
    """Symlinks and special files (FIFOs, sockets, devices) anywhere under the local lake directory `root`, relative
    to it: a lake holds only directories and regular files, and nothing reads, writes or deletes through these."""
    out = []
    for top, dirs, files in os.walk(root):  # does not follow symlinked directories: they are reported, not entered
        for name in dirs + files:
            full = os.path.join(top, name)
            mode = os.lstat(full).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                kind = "a symlink" if stat.S_ISLNK(mode) else "a special file"
                out.append(f"{os.path.relpath(full, root)} ({kind})")
    return sorted(out)
