"""Readers: turn an input (JSONL, JSONL.gz, Parquet, CSV, a Hugging Face dataset) into located records.

Every record carries its location ("file:line 3", "file:row 7") so validation errors can name it. Readers are strict:
invalid UTF-8, truncated JSON, non-object lines, oversized lines and empty inputs are errors, never skipped.
"""
from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from spo_lake.errors import UserError

DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024


def max_line_bytes() -> int:
    """Longest accepted input line (JSONL line or CSV record); env SPOLAKE_MAX_LINE_BYTES overrides."""
    return int(os.environ.get("SPOLAKE_MAX_LINE_BYTES", DEFAULT_MAX_LINE_BYTES))


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


def read_jsonl(path: Path) -> Iterator[Located]:
    """JSON objects, one a line. NaN/Infinity parse as floats so the validator can name the field refusing them."""
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
        if not isinstance(rec, dict):
            raise IngestError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        yield Located(where, rec)


def read_parquet(path: Path) -> pa.Table:
    """Parquet is read as a typed Arrow table: its column types are checked once, its values column-wise."""
    import pyarrow.parquet as pq

    if not path.exists():
        raise IngestError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise IngestError(f"{path}: empty file, no records")
    try:  # a file or a directory of parts (what pq.read_table reads, through the same ParquetDataset)
        dataset = pq.ParquetDataset(path)
        # checked before reading, which fails on a column named twice in words about its own internals
        distinct_columns(str(path), dataset.schema.names)
        return dataset.read()
    except IngestError:
        raise
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise IngestError(f"{path}: not a readable Parquet file: {exc}") from None


def distinct_columns(where: str, names: Sequence[str]) -> None:
    """A column named twice (CSV, Parquet allow it) is an error: which one would win is not the user's choice."""
    for name in sorted({n for n in names if names.count(n) > 1}):
        raise IngestError(f"{where}: column {name!r} appears twice")


def read_parquet_batches(path: Path, batch_rows: int) -> Iterator[pa.Table]:
    """A Parquet file as typed Arrow tables of at most `batch_rows` rows, read one at a time."""
    import pyarrow.parquet as pq

    if not path.exists():
        raise IngestError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise IngestError(f"{path}: empty file, no records")
    try:
        reader = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering keeps every row group read in memory
        if reader.metadata.num_rows == 0:
            raise IngestError(f"{path}: no records")
        distinct_columns(str(path), reader.schema_arrow.names)
        for batch in reader.iter_batches(batch_size=batch_rows):
            yield pa.Table.from_batches([batch])
    except IngestError:
        raise
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise IngestError(f"{path}: not a readable Parquet file: {' '.join(str(exc).split())}") from None


def read_csv(path: Path) -> Iterator[Located]:
    """CSV with a header row. Cells of list/object fields (token_ids, logprobs, tests, metadata) are JSON text;
    number fields are parsed strictly; an empty cell means "absent"."""
    raw = path.read_bytes().removeprefix(codecs.BOM_UTF8)  # Excel's "CSV UTF-8" starts with one
    try:
        text, bad_utf8 = raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:  # parse anyway, with the bad bytes escaped, to name the cell holding them
        text, bad_utf8 = raw.decode("utf-8", "surrogateescape"), exc
    csv.field_size_limit(max_line_bytes())
    # strict: a quoted cell cut off by the end of the file (a truncated export) is an error, not a shorter value
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    try:
        header = reader.fieldnames or []
        distinct_columns(f"{path}:line 1", header)
        for rec in reader:
            where = f"{path}:line {reader.line_num}"
            if None in rec:
                raise IngestError(f"{where}: more cells than header columns")
            if bad_utf8 is not None:
                for k, v in rec.items():
                    if v is not None and _ESCAPED_BYTE.search(v):
                        raise IngestError(f"{where}: field {k!r}: invalid UTF-8")
            yield Located(where, {k: _csv_cell(v, where, k) for k, v in rec.items() if v not in ("", None)})
    except csv.Error as exc:  # line_num counts the lines read before the bad record: it starts on the next one
        raise IngestError(f"{path}:line {reader.line_num + 1}: bad CSV: {exc}") from None
    if bad_utf8 is not None:  # in the header
        line = raw[: bad_utf8.start].count(b"\n") + 1
        raise IngestError(f"{path}:line {line}: invalid UTF-8 at byte {bad_utf8.start}")


_CSV_JSON_FIELDS = {"token_ids", "logprobs", "tests", "metadata"}
_CSV_FLOAT_FIELDS = {"temperature", "top_p", "reward", "time_limit_s"}
_CSV_INT_FIELDS = {"policy_version", "memory_limit_mb"}


def _csv_cell(value: str, where: str, field: str) -> Any:
    try:
        if field in _CSV_JSON_FIELDS:
            return json.loads(value)
        if field in _CSV_INT_FIELDS:
            return int(value)
        if field in _CSV_FLOAT_FIELDS:
            return float(value)
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
    return ds.with_format("arrow")[:]  # respects selections/shuffles, unlike ds.data


def is_parquet(path: str) -> bool:
    return path.lower().endswith(".parquet")


def read_records(path: str) -> Iterator[Located]:
    """Records of a row-oriented input: JSONL (optionally gzipped) or CSV. Parquet and datasets are read typed."""
    p = Path(path)
    if not p.exists():
        raise IngestError(f"{path}: no such file")
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
