"""Writing data files for a Delta append.

Local lakes write Parquet with pyarrow (snappy, like delta-rs; encodings chosen per column for trajectory data),
several files at once on a thread pool, and commit them as one Delta transaction of `add` actions. Until that
commit the files are invisible, so a killed writer leaves only orphan files (removed by `vacuum` once old enough).
"""
from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

TARGET_FILE_BYTES = 128 * 2**20  # in-memory Arrow bytes per data file (Parquet files come out smaller)
ROW_GROUP_ROWS = 128 * 1024
COMPRESSION = "snappy"  # delta-rs's default for appends too
# Delta-rs names list elements "item"; writing the same names keeps every file of a table schema-identical.
PARQUET_OPTIONS = {"compression": COMPRESSION, "row_group_size": ROW_GROUP_ROWS, "use_compliant_nested_type": False}


def write_files(table_dir: str, chunks: Iterable[pa.Table], threads: int | None = None, *, prefix: str = "part",
                filesystem: pafs.FileSystem | None = None, data_change: bool = True) -> list[AddAction]:
    """Write each chunk as Parquet file(s) of about TARGET_FILE_BYTES under `table_dir` (or at the root of
    `filesystem`, e.g. an object-store table's), named `prefix`-<uuid>; returns their Delta `add` actions (nothing
    is committed). `data_change=False` marks a rewrite of rows already in the table (compaction).

    Files are written on a thread pool (pyarrow releases the GIL) while the caller's generator produces the next
    chunk, so per-row Python work upstream overlaps with encoding. At most 2 x threads files wait in memory.
    """
    threads = threads or os.cpu_count() or 1
    with ThreadPoolExecutor(threads) as pool:
        pending: list[Future[AddAction]] = []
        for chunk in chunks:
            for part in _split(chunk):
                pending.append(pool.submit(_write_file, table_dir, part, prefix, filesystem, data_change))
            while len(running := [f for f in pending if not f.done()]) > 2 * threads:
                wait(running, return_when=FIRST_COMPLETED)
        return [f.result() for f in pending]


def _split(chunk: pa.Table) -> list[pa.Table]:
    n_files = max(1, math.ceil(chunk.nbytes / TARGET_FILE_BYTES))
    step = max(1, math.ceil(chunk.num_rows / n_files))
    return [chunk.slice(start, step) for start in range(0, chunk.num_rows, step)]


def _write_file(table_dir: str, chunk: pa.Table, prefix: str, filesystem: pafs.FileSystem | None = None,
                data_change: bool = True) -> AddAction:
    name = f"{prefix}-{uuid.uuid4()}-c000.{COMPRESSION}.parquet"
    path = name if filesystem else os.path.join(table_dir, name)
    scalars = [f.name for f in chunk.schema if not pa.types.is_list(f.type)]
    # Lists: no dictionary (log-probs are nearly all distinct; token ids are delta-encoded instead) and no min/max
    # statistics (nothing prunes on a token id); those two would be most of the encoding time.
    pq.write_table(chunk, path, use_dictionary=scalars, write_statistics=scalars,
                   column_encoding=delta_encoded_columns(chunk.schema), filesystem=filesystem, **PARQUET_OPTIONS)
    size, mtime = _size_and_mtime(path, filesystem)
    # Exact row and null counts; no min/max (nothing prunes on them, and wrong bounds would silently drop rows).
    null_count = {f.name: chunk.column(i).null_count for i, f in enumerate(chunk.schema)
                  if not pa.types.is_nested(f.type)}
    stats = json.dumps({"numRecords": chunk.num_rows, "nullCount": null_count})
    return AddAction(name, size, {}, mtime, data_change, stats)


def _leaf(f: pa.Field) -> str:
    return f"{f.name}.list.{f.type.value_field.name}" if pa.types.is_list(f.type) else f.name


def delta_encoded_columns(schema: pa.Schema) -> dict[str, str]:
    """Integer lists (token ids) use DELTA_BINARY_PACKED: about the size of a dictionary (half of plain) at two
    thirds of its encoding time, and every Parquet reader decodes it."""
    return {_leaf(f): "DELTA_BINARY_PACKED" for f in schema
            if pa.types.is_list(f.type) and pa.types.is_integer(f.type.value_type)}


def _size_and_mtime(path: str, filesystem: pafs.FileSystem | None = None) -> tuple[int, int]:
    if filesystem is None:
        st = os.stat(path)
        return st.st_size, int(st.st_mtime * 1000)
    info = filesystem.get_file_info(path)
    return info.size, int(info.mtime.timestamp() * 1000) if info.mtime else int(time.time() * 1000)
