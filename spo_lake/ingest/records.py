"""Input record formats and the type stage of validation.

Validation has two stages, so the same rules serve row-oriented inputs (JSONL, CSV, datasets, Python lists) and
typed Arrow inputs (Parquet, in-memory tables):
1. types (here): per value for records (naming the line), per column for Arrow tables (the type is the column's);
2. values (`rules.py`): column-wise over Arrow (finite numbers, non-negative token ids, matching lengths, allowed
   sources), naming the first offending row.
Nothing is coerced: 1.0 is not an integer, "0.5" is not a number, and unknown fields are errors.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spo_lake.ingest.readers import IngestError, Located

SOURCES = ("human", "reference", "cot", "spo", "ppo", "grpo", "policy", "pts_rollout", "import", "trl-grpo", "verl",
           "prime-rl")

# field -> logical input type
TRAJECTORY_FIELDS: dict[str, str] = {
    "trajectory_id": "string", "prompt_id": "string", "response": "string", "prompt": "string", "task": "string",
    "source": "string", "token_ids": "list<int>", "logprobs": "list<float>", "tokenizer": "string", "model": "string",
    "run_id": "string", "policy_version": "int", "temperature": "float", "top_p": "float", "reward": "float",
    "metadata": "object",
}
TRAJECTORY_REQUIRED = ("prompt_id", "response")
# The schema's names for these fields: what `spolake ingest --help` documents and what error messages say. The input
# may use either name (see shapes.TRAJECTORY_ALIASES); inside ingest the short names are the columns.
SCHEMA_NAMES = {"response": "response_text", "model": "model_id", "tokenizer": "tokenizer_id",
                "logprobs": "behavior_logprobs"}
PROMPT_FIELDS: dict[str, str] = {
    "prompt_id": "string", "task": "string", "prompt": "string", "tests": "object", "time_limit_s": "float",
    "memory_limit_mb": "int", "metadata": "object",
}
PROMPT_REQUIRED = ("prompt_id", "task", "prompt")

# Scalars are cast to these; list columns keep their (checked) element type until the table contract casts them,
# which saves two copies of the biggest columns.
_ARROW: dict[str, pa.DataType] = {
    "string": pa.string(), "int": pa.int64(), "float": pa.float64(), "object": pa.string(),
    "list<int>": pa.list_(pa.int64()), "list<float>": pa.list_(pa.float64()),
}
_KIND_WORDS = {"string": "a string", "int": "an integer", "float": "a number", "object": "a JSON object",
               "list<int>": "a list of integers", "list<float>": "a list of numbers"}
_INT64 = (-(2**63), 2**63)


def field_name(field: str) -> str:
    """How messages name an input field: by its schema name."""
    return SCHEMA_NAMES.get(field, field)


@dataclass(frozen=True)
class CheckedRows:
    """A type-checked input: a table with the logical field types, and how to name row i in an error."""

    table: pa.Table
    where: Callable[[int], str]


# ---- row-oriented records ---------------------------------------------------------------------------------------
def _value_ok(kind: str, v: Any) -> bool:
    if kind == "string":
        return isinstance(v, str)
    if kind == "int":
        return type(v) is int and _INT64[0] <= v < _INT64[1]
    if kind == "float":  # Arrow converts an integer through int64
        return type(v) is float or type(v) is int and _INT64[0] <= v < _INT64[1]
    if kind == "object":
        return isinstance(v, dict)
    if kind == "list<int>":  # type() is exact: a bool is not an integer here
        return (isinstance(v, list) and all(type(x) is int for x in v)
                and (not v or _INT64[0] <= min(v) and max(v) < _INT64[1]))
    if kind == "list<float>":
        return isinstance(v, list) and all(_value_ok("float", x) for x in v)
    raise AssertionError(kind)


def from_records(records: Iterable[Located], fields: dict[str, str], what: str) -> CheckedRows:
    """Type-check located records field by field and build the logical-typed Arrow table."""
    located = list(records)
    columns: dict[str, list[Any]] = {f: [] for f in fields}
    for loc in located:
        unknown = set(loc.record) - set(fields)
        if unknown:
            raise IngestError(f"{loc.where}: unknown field(s) {sorted(unknown)} for {what} (rename with --map dst=src)")
        for f, kind in fields.items():
            v = loc.record.get(f)
            if v is not None and not _value_ok(kind, v):
                raise IngestError(f"{loc.where}: field {field_name(f)!r}: expected {_KIND_WORDS[kind]}, "
                                  f"got {_describe(kind, v)}")
            if kind == "object" and v is not None:
                v = json_text(v, loc.where, f)
            columns[f].append(v)
    table = pa.table({f: pa.array(columns[f], _ARROW[k]) for f, k in fields.items()})
    return CheckedRows(table, lambda i: located[i].where)


def _describe(kind: str, v: Any) -> str:
    if isinstance(v, list) and kind.startswith("list<"):
        element = kind[5:-1]
        pos, bad = next((j, x) for j, x in enumerate(v) if not _value_ok(element, x))
        return f"{_describe(element, bad)} at index {pos}"
    return f"{type(v).__name__} {str(v)[:40]!r}"


def json_text(v: dict, where: str, field: str) -> str:
    """Canonical JSON text of an object field (sorted keys); NaN/inf are refused, JSON cannot hold them."""
    try:
        return json.dumps(v, sort_keys=True, allow_nan=False, ensure_ascii=False)
    except (ValueError, TypeError) as exc:
        raise IngestError(f"{where}: field {field_name(field)!r}: not JSON-serialisable ({exc})") from None


# ---- typed Arrow tables -----------------------------------------------------------------------------------------
def from_arrow(table: pa.Table, fields: dict[str, str], origin: str, what: str, first_row: int = 0) -> CheckedRows:
    """Check an Arrow table's column types against the logical fields; scalars are cast (safely) to them. Row i is
    row `first_row + i + 1` of the input (a later batch of a streamed file)."""
    unknown = set(table.column_names) - set(fields)
    if unknown:
        raise IngestError(f"{origin}: unknown column(s) {sorted(unknown)} for {what} (rename with --map dst=src)")
    where = lambda i: f"{origin}:row {first_row + i + 1}"  # noqa: E731
    cols = {}
    for f, kind in fields.items():
        if f not in table.column_names:
            cols[f] = pa.nulls(table.num_rows, _ARROW[kind])
            continue
        col = table.column(f)
        if kind == "object" and (pa.types.is_struct(col.type) or pa.types.is_map(col.type)):
            col = pa.chunked_array([pa.array([None if v is None else json_text(dict(v), where(i), f)
                                              for i, v in enumerate(col.to_pylist())], pa.string())])
        if not _arrow_type_ok(kind, col.type):
            row = pc.index(pc.is_valid(col), True).as_py()
            raise IngestError(f"{where(max(row, 0))}: field {field_name(f)!r}: expected {_KIND_WORDS[kind]}, got a "
                              f"column of Arrow type {col.type}")
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            _check_utf8(col, where, f)
        cols[f] = _cast(col, kind, where, f)
    return CheckedRows(pa.table(cols), where)


def _arrow_type_ok(kind: str, t: pa.DataType) -> bool:
    if pa.types.is_null(t):
        return True
    if kind in ("string", "object"):
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    if kind == "int":
        return pa.types.is_integer(t)
    if kind == "float":
        return pa.types.is_integer(t) or pa.types.is_floating(t)
    if kind.startswith("list<"):
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            return False
        inner = t.value_type
        floats_ok = kind == "list<float>" and pa.types.is_floating(inner)
        return pa.types.is_integer(inner) or floats_ok or pa.types.is_null(inner)
    raise AssertionError(kind)


def _cast(col: pa.ChunkedArray, kind: str, where: Callable[[int], str], field: str) -> pa.ChunkedArray:
    if kind.startswith("list<") and not pa.types.is_null(col.type) and not pa.types.is_null(col.type.value_type):
        return col
    try:
        return col.cast(_ARROW[kind])
    except (pa.ArrowInvalid, OverflowError):  # e.g. a uint64 beyond int64; find the row to name
        for i, v in enumerate(col.to_pylist()):
            try:
                pa.array([v], _ARROW[kind])
            except (pa.ArrowInvalid, OverflowError):
                raise IngestError(f"{where(i)}: field {field_name(field)!r}: {v!r} does not fit "
                                  f"{_KIND_WORDS[kind]}") from None
        raise


def _check_utf8(col: pa.ChunkedArray, where: Callable[[int], str], field: str) -> None:
    """Parquet does not guarantee valid UTF-8 in string columns; Arrow checks it fast, Python finds the row."""
    offset = 0
    for chunk in col.chunks:
        try:
            chunk.validate(full=True)
        except pa.ArrowInvalid:
            raise IngestError(f"{where(offset + _first_bad_utf8(chunk))}: field {field_name(field)!r}: "
                              "invalid UTF-8") from None
        offset += len(chunk)


def _first_bad_utf8(chunk: pa.Array) -> int:
    for i, v in enumerate(chunk.cast(pa.binary()).to_pylist()):
        try:
            v is None or v.decode("utf-8")
        except UnicodeDecodeError:
            return i
    return 0


def rename(records: Iterable[Located], mapping: dict[str, str]) -> Iterable[Located]:
    """Apply --map dst=src renames to located records."""
    if not mapping:
        yield from records
        return
    inverse = {src: dst for dst, src in mapping.items()}
    for loc in records:
        yield Located(loc.where, {inverse.get(k, k): v for k, v in loc.record.items()})
