"""Input record formats and their validation.

Validation has two stages, so the same rules serve row-oriented inputs (JSONL, CSV, datasets, Python lists) and
typed Arrow inputs (Parquet, in-memory tables):
1. types: per value for records (naming the line), per column for Arrow tables (the type is the column's);
2. values: column-wise over Arrow (finite numbers, non-negative token ids, matching lengths, allowed sources),
   naming the first offending row.
Nothing is coerced: 1.0 is not an integer, "0.5" is not a number, and unknown fields are errors.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from spo_lake.ingest.readers import IngestError, Located

SOURCES = ("human", "reference", "cot", "spo", "ppo", "policy", "pts_rollout", "import")

# field -> logical input type
TRAJECTORY_FIELDS: dict[str, str] = {
    "trajectory_id": "string", "prompt_id": "string", "response": "string", "prompt": "string", "task": "string",
    "source": "string", "token_ids": "list<int>", "logprobs": "list<float>", "tokenizer": "string", "model": "string",
    "run_id": "string", "policy_version": "int", "temperature": "float", "top_p": "float", "reward": "float",
    "metadata": "object",
}
TRAJECTORY_REQUIRED = ("prompt_id", "response")
PROMPT_FIELDS: dict[str, str] = {
    "prompt_id": "string", "task": "string", "prompt": "string", "tests": "object", "time_limit_s": "float",
    "memory_limit_mb": "int", "metadata": "object",
}
PROMPT_REQUIRED = ("prompt_id", "task", "prompt")

_ARROW: dict[str, pa.DataType] = {
    "string": pa.string(), "int": pa.int64(), "float": pa.float64(), "object": pa.string(),
    "list<int>": pa.list_(pa.int64()), "list<float>": pa.list_(pa.float64()),
}


@dataclass(frozen=True)
class Batch:
    """A validated input: a table with the logical field types, and how to name row i in an error."""

    table: pa.Table
    where: Callable[[int], str]


def _value_ok(kind: str, v: Any) -> bool:
    if kind == "string":
        return isinstance(v, str)
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63
    if kind == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == "object":
        return isinstance(v, dict)
    if kind == "list<int>":
        return isinstance(v, list) and all(_value_ok("int", x) for x in v)
    if kind == "list<float>":
        return isinstance(v, list) and all(_value_ok("float", x) for x in v)
    raise AssertionError(kind)


_KIND_WORDS = {"string": "a string", "int": "an integer", "float": "a number", "object": "a JSON object",
               "list<int>": "a list of integers", "list<float>": "a list of numbers"}


def from_records(records: Iterable[Located], fields: dict[str, str], what: str) -> Batch:
    """Type-check located records field by field and build the logical-typed Arrow table."""
    located = list(records)
    columns: dict[str, list[Any]] = {f: [] for f in fields}
    for i, loc in enumerate(located):
        unknown = set(loc.record) - set(fields)
        if unknown:
            raise IngestError(f"{loc.where}: unknown field(s) {sorted(unknown)} for {what} (rename with --map dst=src)")
        for f, kind in fields.items():
            v = loc.record.get(f)
            if v is not None and not _value_ok(kind, v):
                raise IngestError(f"{loc.where}: field {f!r}: expected {_KIND_WORDS[kind]}, got {_describe(kind, v)}")
            if kind == "object" and v is not None:
                v = _json_text(v, loc.where, f)
            columns[f].append(v)
    table = pa.table({f: pa.array(columns[f], _ARROW[k]) for f, k in fields.items()})
    return Batch(table, lambda i: located[i].where)


def from_arrow(table: pa.Table, fields: dict[str, str], origin: str, what: str) -> Batch:
    """Check an Arrow table's column types against the logical fields and cast (safely) to them."""
    unknown = set(table.column_names) - set(fields)
    if unknown:
        raise IngestError(f"{origin}: unknown column(s) {sorted(unknown)} for {what} (rename with --map dst=src)")
    cols = {}
    for f, kind in fields.items():
        if f not in table.column_names:
            cols[f] = pa.nulls(table.num_rows, _ARROW[kind])
            continue
        col = table.column(f)
        if kind == "object" and (pa.types.is_struct(col.type) or pa.types.is_map(col.type)):
            col = pa.array([None if v is None else _json_text(dict(v), f"{origin}:row {i + 1}", f)
                            for i, v in enumerate(col.to_pylist())], pa.string())
        if not _arrow_type_ok(kind, col.type):
            raise IngestError(f"{origin}: column {f!r}: expected {_KIND_WORDS[kind]}, got Arrow type {col.type}")
        cols[f] = col.cast(_ARROW[kind])
    batch = Batch(pa.table(cols), lambda i: f"{origin}:row {i + 1}")
    if "metadata" in fields:
        _check_json_objects(batch, "metadata")
    if "tests" in fields:
        _check_json_objects(batch, "tests")
    return batch


def _arrow_type_ok(kind: str, t: pa.DataType) -> bool:
    if kind in ("string", "object"):
        return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)
    if kind == "int":
        return pa.types.is_integer(t) or pa.types.is_null(t)
    if kind == "float":
        return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t)
    if kind.startswith("list<"):
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            return pa.types.is_null(t)
        inner = t.value_type
        return pa.types.is_integer(inner) or (kind == "list<float>" and pa.types.is_floating(inner)) or pa.types.is_null(inner)
    raise AssertionError(kind)


def _check_json_objects(batch: Batch, field: str) -> None:
    for i, v in enumerate(batch.table.column(field).to_pylist()):
        if v is None:
            continue
        try:
            ok = isinstance(json.loads(v), dict)
        except ValueError:
            ok = False
        if not ok:
            raise IngestError(f"{batch.where(i)}: field {field!r}: expected a JSON object")


def _json_text(v: dict, where: str, field: str) -> str:
    try:
        return json.dumps(v, sort_keys=True, allow_nan=False, ensure_ascii=False)
    except (ValueError, TypeError) as exc:
        raise IngestError(f"{where}: field {field!r}: not JSON-serialisable ({exc})") from None


def _describe(kind: str, v: Any) -> str:
    if isinstance(v, list) and kind.startswith("list<"):
        element = kind[5:-1]
        pos, bad = next((j, x) for j, x in enumerate(v) if not _value_ok(element, x))
        return f"{_describe(element, bad)} at index {pos}"
    return f"{type(v).__name__} {str(v)[:40]!r}"


# ---- value rules (column-wise) ----------------------------------------------------------------------------------
def _first(mask: pa.ChunkedArray | pa.Array) -> int | None:
    """Index of the first true value of a boolean mask, or None."""
    idx = pc.index(pc.fill_null(mask, False), True).as_py()
    return None if idx < 0 else idx


def require(batch: Batch, fields: Iterable[str]) -> None:
    for f in fields:
        i = _first(pc.is_null(batch.table.column(f)))
        if i is not None:
            raise IngestError(f"{batch.where(i)}: missing required field {f!r}")


def require_finite(batch: Batch, field: str, lo: float = -math.inf, hi: float = math.inf) -> None:
    col = batch.table.column(field)
    values = pc.list_flatten(col) if pa.types.is_list(col.type) else col
    bad = pc.or_(pc.invert(pc.is_finite(values)), pc.or_(pc.less(values, lo), pc.greater(values, hi)))
    j = _first(bad)
    if j is None:
        return
    row = j if not pa.types.is_list(col.type) else pc.list_parent_indices(col)[j].as_py()
    what = "finite" if lo == -math.inf and hi == math.inf else f"finite and in [{lo}, {hi}]"
    raise IngestError(f"{batch.where(row)}: field {field!r}: value {values[j].as_py()!r} is not {what}")


def require_in(batch: Batch, field: str, allowed: Iterable[str]) -> None:
    col = batch.table.column(field)
    i = _first(pc.invert(pc.is_in(col, pa.array(list(allowed)))))
    if i is not None and col[i].is_valid:
        raise IngestError(f"{batch.where(i)}: field {field!r}: unknown value {col[i].as_py()!r} (one of {', '.join(allowed)})")


def validate_trajectories(batch: Batch) -> None:
    t = batch.table
    require(batch, (*TRAJECTORY_REQUIRED, "source"))
    require_in(batch, "source", SOURCES)
    require_finite(batch, "reward")
    require_finite(batch, "temperature", 0.0)
    require_finite(batch, "top_p", 0.0, 1.0)
    require_finite(batch, "logprobs", hi=1e-4)  # a log-probability is <= 0 (small slack for float error)
    require_finite(batch, "token_ids", 0, 2**31 - 1)
    ids, lps = t.column("token_ids"), t.column("logprobs")
    i = _first(pc.and_(pc.is_null(ids), pc.is_valid(lps)))
    if i is not None:
        raise IngestError(f"{batch.where(i)}: field 'logprobs': given without 'token_ids'")
    i = _first(pc.not_equal(pc.list_value_length(ids), pc.list_value_length(lps)))
    if i is not None:
        raise IngestError(f"{batch.where(i)}: field 'logprobs': length {len(lps[i])} != len(token_ids) {len(ids[i])}")
    i = _first(pc.less(t.column("policy_version"), 0))
    if i is not None:
        raise IngestError(f"{batch.where(i)}: field 'policy_version': negative")


def validate_prompts(batch: Batch) -> None:
    require(batch, PROMPT_REQUIRED)
    require_finite(batch, "time_limit_s", 1e-9)
    i = _first(pc.less_equal(batch.table.column("memory_limit_mb"), 0))
    if i is not None:
        raise IngestError(f"{batch.where(i)}: field 'memory_limit_mb': must be positive")
    ids = batch.table.column("prompt_id").to_pylist()
    seen: dict[str, int] = {}
    for i, pid in enumerate(ids):
        if pid in seen:
            raise IngestError(f"{batch.where(i)}: field 'prompt_id': duplicate {pid!r} (first at {batch.where(seen[pid])})")
        seen[pid] = i


def rename(records: Iterable[Located], mapping: dict[str, str]) -> Iterable[Located]:
    """Apply --map dst=src renames to located records."""
    if not mapping:
        yield from records
        return
    inverse = {src: dst for dst, src in mapping.items()}
    for loc in records:
        yield Located(loc.where, {inverse.get(k, k): v for k, v in loc.record.items()})
