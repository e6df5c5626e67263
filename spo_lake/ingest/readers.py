"""Readers: turn an input (JSONL, JSONL.gz, Parquet, CSV, a Hugging Face dataset) into located records.

Every record carries its location ("file:line 3", "file:row 7") so validation errors can name it. Readers are strict:
invalid UTF-8, truncated JSON, non-object lines, oversized lines and empty inputs are errors, never skipped.
"""
from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

MAX_LINE_BYTES = 64 * 1024 * 1024


class IngestError(ValueError):
    """Bad input. The message is one line naming the file, the line/row and the field."""


@dataclass(frozen=True)
class Located:
    where: str  # "path:line N" or "path:row N"
    record: dict[str, Any]


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def read_jsonl(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Located]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        lineno = 0
        while True:
            raw = fh.readline(max_line_bytes + 1)
            if not raw:
                break
            lineno += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                raise IngestError(f"{path}:line {lineno}: line longer than {max_line_bytes} bytes")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise IngestError(f"{path}:line {lineno}: invalid UTF-8 at byte {exc.start}") from None
            if not text.strip():
                continue
            try:
                rec = json.loads(text, parse_constant=_reject_constant)
            except ValueError as exc:
                raise IngestError(f"{path}:line {lineno}: invalid JSON: {exc}") from None
            if not isinstance(rec, dict):
                raise IngestError(f"{path}:line {lineno}: expected a JSON object, got {type(rec).__name__}")
            yield Located(f"{path}:line {lineno}", rec)


def read_parquet(path: Path):
    """Parquet is read as a typed Arrow table: its column types are checked once, its values column-wise."""
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise IngestError(f"{path}: not a readable Parquet file: {exc}") from None


def read_csv(path: Path) -> Iterator[Located]:
    """CSV cells holding lists/objects (token_ids, logprobs, tests, metadata) are JSON text."""
    import csv

    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise IngestError(f"{path}:line {line}: invalid UTF-8") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    for rec in reader:
        line = reader.line_num
        if None in rec:
            raise IngestError(f"{path}:line {line}: more cells than header columns")
        yield Located(f"{path}:line {line}", {k: _csv_cell(v, path, line, k) for k, v in rec.items() if v not in ("", None)})


_CSV_JSON_FIELDS = {"token_ids", "logprobs", "tests", "metadata"}
_CSV_NUMBER_FIELDS = {"temperature", "top_p", "reward", "policy_version", "time_limit_s", "memory_limit_mb"}


def _csv_cell(value: str, path: Path, line: int, field: str) -> Any:
    if field in _CSV_JSON_FIELDS:
        try:
            return json.loads(value, parse_constant=_reject_constant)
        except ValueError:
            raise IngestError(f"{path}:line {line}: field {field!r}: invalid JSON text") from None
    if field in _CSV_NUMBER_FIELDS:
        try:
            number = float(value)
        except ValueError:
            raise IngestError(f"{path}:line {line}: field {field!r}: not a number: {value[:40]!r}") from None
        return int(number) if field in {"policy_version", "memory_limit_mb"} and number.is_integer() else number
    return value


def read_hf(name_or_path: str, split: str = "train") -> Iterator[Located]:
    """A `datasets` dataset saved with save_to_disk (local dir) or loadable by name (hub or a local script/dir)."""
    import datasets

    p = Path(name_or_path)
    if p.is_dir() and any((p / f).exists() for f in ("dataset_info.json", "state.json", "dataset_dict.json")):
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    else:
        ds = datasets.load_dataset(name_or_path, split=split)
    for i, rec in enumerate(ds):
        yield Located(f"{name_or_path}[{split}]:row {i + 1}", _drop_nulls(rec))


def _drop_nulls(rec: dict[str, Any]) -> dict[str, Any]:
    """A null cell means "field absent"; NaN is kept so the validator can reject it."""
    return {k: v for k, v in rec.items() if v is not None}


def is_parquet(path: str) -> bool:
    return path.lower().endswith(".parquet")


def read_records(path: str, hf_split: str | None = None) -> Iterator[Located]:
    """Records of a row-oriented input (Parquet goes through `read_parquet`). `hf_split` set means `path` is a
    Hugging Face dataset name or a directory saved by `save_to_disk`."""
    if hf_split is not None:
        yield from read_hf(path, hf_split)
        return
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
