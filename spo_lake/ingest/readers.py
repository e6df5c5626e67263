"""Readers: turn an input (JSONL, JSONL.gz, Parquet, CSV, a Hugging Face dataset) into located records.

Every record carries its location ("file:line 3", "file:row 7") so validation errors can name it. Readers are strict:
invalid UTF-8, truncated JSON, non-object lines, oversized lines and empty inputs are errors, never skipped.
"""
from __future__ import annotations

import codecs
import csv
import gzip
import json
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from spo_lake.errors import UserError

DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_COLUMNS = 4096
MAX_DEPTH = 64  # JSON nesting: deeper values are refused (Python's parsers and printers recurse)


def _limit(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    if not value.strip().isdigit() or int(value) < 1:
        raise IngestError(f"environment variable {name}: expected a positive integer, got {value[:40]!r}")
    return int(value)


def max_line_bytes() -> int:
    """Largest accepted input line, CSV field or Parquet cell (bytes): ingest's memory stays bounded by its batch
    plus this (docs/security.md). Env SPOLAKE_MAX_LINE_BYTES overrides."""
    return _limit("SPOLAKE_MAX_LINE_BYTES", DEFAULT_MAX_LINE_BYTES)


def max_columns() -> int:
    """Most columns an input (Parquet, CSV, a dataset) may have; env SPOLAKE_MAX_COLUMNS overrides."""
    return _limit("SPOLAKE_MAX_COLUMNS", DEFAULT_MAX_COLUMNS)


def regular_input(path: Path) -> None:
    """Refuse, without opening it, an input that is not a regular file or directory (a FIFO would block the read
    forever, a device never ends). A symlink named on the command line is followed: that is the user's choice."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise IngestError(f"{path}: no such file") from None
    except OSError as exc:
        raise IngestError(f"{path}: cannot read: {exc.strerror}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise IngestError(f"{path}: not a regular file (a FIFO, socket or device); refused without reading it")


def too_many_columns(where: str, count: int) -> None:
    if count > max_columns():
        raise IngestError(f"{where}: {count} columns, more than {max_columns()} (SPOLAKE_MAX_COLUMNS)")


class IngestError(UserError, ValueError):
    """Bad input. The message is one line naming the file, the line/row and the field."""


@dataclass(frozen=True)
class Located:
    where: str  # "path:line N" or "path:row N"
    record: dict[str, Any]


def reject_constant(name: str) -> float:
    """`parse_constant` hook for JSON text stored in the lake: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return out


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # how surrogateescape decodes a byte that is not UTF-8
_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:')


def _field_at(text: str, pos: int) -> str:
    """"field 'k': " for the last key before `pos` (where a JSON error happened), or "" when there is none."""
    keys = _KEY.findall(text, 0, pos)
    return f"field {keys[-1]!r}: " if keys else ""


def _bad_utf8_field(raw: bytes) -> str:
    """Name the field holding invalid UTF-8 bytes, when the line parses with them escaped."""
    try:
        rec = json.loads(raw.decode("utf-8", "surrogateescape"))
    except ValueError:
        return ""
    for key, value in rec.items() if isinstance(rec, dict) else ():
        if _ESCAPED_BYTE.search(json.dumps(value, ensure_ascii=False) + key):
            return f"field {key!r}: "
    return ""


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def plain_json(where: str, text: str, value: Any) -> None:
    """Refuse a parsed JSON value nested deeper than MAX_DEPTH or holding a lone surrogate (\\ud800 alone is valid
    JSON but no valid text: storing it fails). Cheap for ordinary records: it looks only when the text could hold
    either."""
    if text.count("[") + text.count("{") > MAX_DEPTH:
        stack = [(value, 1)]
        while stack:
            item, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise IngestError(f"{where}: {_first_field(value)}JSON nested deeper than {MAX_DEPTH} levels")
            children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
            stack += [(c, depth + 1) for c in children if isinstance(c, (dict, list))]
    if _SURROGATE_ESCAPE.search(text):
        for key, item in value.items() if isinstance(value, dict) else [("", value)]:
            try:
                json.dumps([key, item], ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise IngestError(f"{where}: {f'field {key!r}: ' if key else ''}a lone surrogate "
                                  "(\\ud800-\\udfff without its pair) is not text") from None


def _first_field(value: Any) -> str:
    """"field 'k': " for the first field of `value` nested too deeply (or "")."""
    for key, item in value.items() if isinstance(value, dict) else ():
        depth, stack = 0, [(item, 1)]
        while stack:
            node, d = stack.pop()
            depth = max(depth, d)
            stack += [(c, d + 1) for c in (node.values() if isinstance(node, dict) else node
                                           if isinstance(node, list) else ()) if isinstance(c, (dict, list))]
            if depth >= MAX_DEPTH:
                return f"field {key!r}: "
    return ""


def read_jsonl(path: Path) -> Iterator[Located]:
    """JSON objects, one a line. NaN/Infinity parse as floats so the validator can name the field refusing them."""
    regular_input(path)
    limit = max_line_bytes()
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            yield from _jsonl_lines(path, fh, limit)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:  # truncated or corrupt gzip stream
        raise IngestError(f"{path}: cannot read: {exc}") from None


def _jsonl_lines(path: Path, fh: Any, limit: int) -> Iterator[Located]:
    lineno = 0
    while raw := fh.readline(limit + 1):
        lineno += 1
        where = f"{path}:line {lineno}"
        if lineno == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)  # as Windows tools write it; JSON parsers may ignore it
        if len(raw) > limit and not raw.endswith(b"\n"):
            raise IngestError(f"{where}: line longer than {limit} bytes (SPOLAKE_MAX_LINE_BYTES)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise IngestError(f"{where}: {_bad_utf8_field(raw)}invalid UTF-8 at byte {exc.start}") from None
        if not text.strip():
            continue
        try:
            rec = json.loads(text, object_pairs_hook=_no_duplicate_keys)
        except json.JSONDecodeError as exc:
            truncated = " (truncated?)" if exc.pos >= len(text.rstrip()) else ""
            raise IngestError(f"{where}: {_field_at(text, exc.pos)}invalid JSON{truncated}: {exc.msg} at character "
                              f"{exc.pos + 1}") from None
        except ValueError as exc:
            raise IngestError(f"{where}: invalid JSON: {exc}") from None
        except RecursionError:
            raise IngestError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels") from None
        if not isinstance(rec, dict):
            raise IngestError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        plain_json(where, text, rec)
        yield Located(where, rec)


def read_parquet(path: Path) -> pa.Table:
    """Parquet is read as a typed Arrow table: its column types are checked once, its values column-wise."""
    import pyarrow.parquet as pq

    regular_input(path)
    if path.stat().st_size == 0:
        raise IngestError(f"{path}: empty file, no records")
    parts = [path] if path.is_file() else sorted(p for p in path.rglob("*") if not p.is_dir())
    for part in parts:
        regular_input(part)
    try:  # a file or a directory of parts (what pq.read_table reads, through the same ParquetDataset)
        for part in parts:
            if part.name.endswith(".parquet") or part == path:
                parquet_limits(part, pq.ParquetFile(part).metadata)
        dataset = pq.ParquetDataset(path)
        # checked before reading, which fails on a column named twice in words about its own internals
        distinct_columns(str(path), dataset.schema.names)
        table = dataset.read()
        large_cells(str(path), table)
        return table
    except IngestError:
        raise
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise IngestError(f"{path}: not a readable Parquet file: {exc}") from None


def parquet_limits(path: Path, metadata: Any) -> None:
    """Refuse, from the footer alone, a Parquet file with too many columns or a cell larger than max_line_bytes:
    a column chunk averaging more than the limit per row holds such a cell."""
    too_many_columns(str(path), metadata.num_columns)
    limit = max_line_bytes()
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.total_uncompressed_size > limit * max(1, group.num_rows):
                raise IngestError(f"{path}:row group {g}: field {chunk.path_in_schema!r}: values larger than "
                                  f"{limit} bytes (SPOLAKE_MAX_LINE_BYTES)")


def large_cells(where: str, table: pa.Table, start: int = 0) -> None:
    """Refuse a string or binary cell larger than max_line_bytes (before it becomes a Python object)."""
    import pyarrow.compute as pc

    limit = max_line_bytes()
    for name, column in zip(table.column_names, table.columns):
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                or pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
            continue
        lengths = pc.binary_length(column)
        if lengths.null_count < len(lengths) and pc.max(lengths).as_py() > limit:
            row = pc.index(pc.greater(lengths, limit), True).as_py()
            raise IngestError(f"{where}:row {start + row + 1}: field {name!r}: larger than {limit} bytes "
                              "(SPOLAKE_MAX_LINE_BYTES)")


def distinct_columns(where: str, names: Sequence[str]) -> None:
    """A column named twice (CSV, Parquet allow it) is an error: which one would win is not the user's choice."""
    for name in sorted({n for n in names if names.count(n) > 1}):
        raise IngestError(f"{where}: column {name!r} appears twice")


def read_parquet_batches(path: Path, batch_rows: int) -> Iterator[pa.Table]:
    """A Parquet file as typed Arrow tables of at most `batch_rows` rows, read one at a time."""
    import pyarrow.parquet as pq

    regular_input(path)
    if path.stat().st_size == 0:
        raise IngestError(f"{path}: empty file, no records")
    try:
        # no pre-buffering (it keeps every row group read in memory); buffer_size streams a column chunk by pages
        reader = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
        parquet_limits(path, reader.metadata)
        if reader.metadata.num_rows == 0:
            raise IngestError(f"{path}: no records")
        distinct_columns(str(path), reader.schema_arrow.names)
        start = 0
        for batch in reader.iter_batches(batch_size=batch_rows):
            table = pa.Table.from_batches([batch])
            large_cells(str(path), table, start)
            start += table.num_rows
            yield table
    except IngestError:
        raise
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise IngestError(f"{path}: not a readable Parquet file: {' '.join(str(exc).split())}") from None


def read_csv(path: Path) -> Iterator[Located]:
    """CSV with a header row. Cells of list/object fields (token_ids, logprobs, tests, metadata) are JSON text;
    number fields are parsed strictly; an empty cell means "absent". Read a line at a time, each line and field at
    most max_line_bytes: memory stays bounded whatever the file holds."""
    regular_input(path)
    limit = max_line_bytes()
    csv.field_size_limit(limit)
    # Excel's "CSV UTF-8" starts with a BOM (utf-8-sig drops it); bad bytes are escaped to name the cell holding them
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as fh:
        lines = _bounded_lines(path, fh, limit)
        # strict: a quoted cell cut off by the end of the file (a truncated export) is an error, not a shorter value
        reader = csv.DictReader(lines, strict=True)
        try:
            header = reader.fieldnames or []
            if any(_ESCAPED_BYTE.search(h) for h in header):
                raise IngestError(f"{path}:line 1: invalid UTF-8 in the header")
            too_many_columns(f"{path}:line 1", len(header))
            distinct_columns(f"{path}:line 1", header)
            for rec in reader:
                where = f"{path}:line {reader.line_num}"
                if None in rec:
                    raise IngestError(f"{where}: more cells than header columns")
                for k, v in rec.items():
                    if v is not None and _ESCAPED_BYTE.search(v):
                        raise IngestError(f"{where}: field {k!r}: invalid UTF-8")
                yield Located(where, {k: _csv_cell(v, where, k) for k, v in rec.items() if v not in ("", None)})
        except csv.Error as exc:  # line_num counts the lines read before the bad record: it starts on the next one
            raise IngestError(f"{path}:line {reader.line_num + 1}: bad CSV: {exc}") from None


def _bounded_lines(path: Path, fh: Any, limit: int) -> Iterator[str]:
    number = 0
    while line := fh.readline(limit + 1):
        number += 1
        if len(line) > limit:
            raise IngestError(f"{path}:line {number}: line longer than {limit} characters (SPOLAKE_MAX_LINE_BYTES)")
        yield line


_CSV_JSON_FIELDS = {"token_ids", "logprobs", "tests", "metadata"}
_CSV_FLOAT_FIELDS = {"temperature", "top_p", "reward", "time_limit_s"}
_CSV_INT_FIELDS = {"policy_version", "memory_limit_mb"}


def _csv_cell(value: str, where: str, field: str) -> Any:
    try:
        if field in _CSV_JSON_FIELDS:
            parsed = json.loads(value)
            plain_json(where, value, {field: parsed})
            return parsed
        if field in _CSV_INT_FIELDS:
            return int(value)
        if field in _CSV_FLOAT_FIELDS:
            return float(value)
    except RecursionError:
        raise IngestError(f"{where}: field {field!r}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:
        kind = "JSON text" if field in _CSV_JSON_FIELDS else "an integer" if field in _CSV_INT_FIELDS else "a number"
        raise IngestError(f"{where}: field {field!r}: expected {kind}, got {value[:40]!r}") from None
    return value


def read_hf(name_or_path: str, split: str = "train") -> pa.Table:
    """A `datasets` dataset saved with save_to_disk (local dir) or loadable by name, as a typed Arrow table."""
    import datasets

    p = Path(name_or_path)
    try:
        if p.is_dir() and any((p / f).exists() for f in ("dataset_info.json", "state.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(str(p))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise IngestError(f"{name_or_path}: no split {split!r} (has {', '.join(ds)})")
                ds = ds[split]
        else:
            ds = datasets.load_dataset(name_or_path, split=split)
    except IngestError:
        raise
    except Exception as exc:  # datasets raises many types (missing files, hub unreachable, bad split)
        raise IngestError(f"{name_or_path}: cannot load dataset: {' '.join(str(exc).split())}") from None
    too_many_columns(name_or_path, len(ds.column_names))
    table = ds.with_format("arrow")[:]  # respects selections/shuffles, unlike ds.data
    large_cells(name_or_path, table)
    return table


def is_parquet(path: str) -> bool:
    return path.lower().endswith(".parquet")


def read_records(path: str) -> Iterator[Located]:
    """Records of a row-oriented input: JSONL (optionally gzipped) or CSV. Parquet and datasets are read typed."""
    p = Path(path)
    regular_input(p)
    if p.stat().st_size == 0:
        raise IngestError(f"{path}: empty file, no records")
    name = p.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".json", ".ndjson", ".ndjson.gz")):
        reader = read_jsonl(p)
    elif name.endswith(".csv"):
        reader = read_csv(p)
    else:
        raise IngestError(f"{path}: unknown format (expected .jsonl, .jsonl.gz, .parquet or .csv; --hf for datasets)")
    empty = True
    for located in reader:
        empty = False
        yield located
    if empty:
        raise IngestError(f"{path}: no records")
