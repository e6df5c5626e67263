"""The lake's files below the Delta level: list, read, write, move and delete, on a local disk or an object store.

Delta (delta-rs) only sees tables through their logs. The damage checks (`doctor.py`) and the write leases
(`inflight.py`) need to see what is really stored: data files a missing log no longer lists, log entries one by one,
lease files. deltalake's own object-store layer (`DeltaStorageHandler`, given the lake's storage options) serves
both kinds of lake with the same credentials the tables use.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

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

