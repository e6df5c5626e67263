"""The value stage of validation: column-wise rules over a type-checked `CheckedRows`, naming the first offending row.

Every rule has a fast vectorised check for the (usual) valid case; only a failing batch pays for locating the row.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from spo_lake.ingest.readers import IngestError, reject_constant
from spo_lake.ingest.records import PROMPT_REQUIRED, SOURCES, TRAJECTORY_REQUIRED, CheckedRows, field_name

TOKEN_ID_MAX = 2**31 - 1  # token ids are stored as int32
LOGPROB_MAX = 1e-4  # a log-probability is <= 0; a little slack for float error


def _first(mask: pa.ChunkedArray | pa.Array) -> int | None:
    """Index of the first true value of a boolean mask, or None."""
    idx = pc.index(pc.fill_null(mask, False), True).as_py()
    return None if idx < 0 else idx


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def require(batch: CheckedRows, fields: Iterable[str]) -> None:
    for f in fields:
        i = _first(pc.is_null(batch.table.column(f)))
        if i is not None:
            raise IngestError(f"{batch.where(i)}: missing required field {field_name(f)!r}")


def require_names(batch: CheckedRows, fields: Iterable[str]) -> None:
    """Ids and names hold text: an empty or blank one would be a row no one can name."""
    for f in fields:
        col = batch.table.column(f)
        i = _first(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(col)), 0))
        if i is not None:
            raise IngestError(f"{batch.where(i)}: field {field_name(f)!r}: empty")


def _in_range(values: pa.Array, lo: float, hi: float) -> bool:
    """All values finite and in [lo, hi]. numpy's min/max propagate NaN, so two SIMD passes decide it."""
    values = values.drop_null() if values.null_count else values
    if len(values) == 0:
        return True
    v = values.to_numpy(zero_copy_only=False)
    low, high = v.min(), v.max()
    return bool(np.isfinite(low) and np.isfinite(high) and low >= lo and high <= hi)


def _bounds(lo: float, hi: float, integers: bool) -> str:
    if lo == -math.inf and hi == math.inf:
        return "finite"
    show = lambda x: str(int(x)) if math.isfinite(x) and float(x).is_integer() else f"{x:g}"  # noqa: E731
    return f"{'' if integers else 'finite and '}in [{show(lo)}, {show(hi)}]"


def require_finite(batch: CheckedRows, field: str, lo: float = -math.inf, hi: float = math.inf) -> None:
    """Numbers (or every element of number lists) finite and within [lo, hi]; no null list elements."""
    col = batch.table.column(field)
    if not _is_list(col.type):
        if all(_in_range(chunk, lo, hi) for chunk in col.chunks):
            return
        bad = pc.or_(pc.invert(pc.is_finite(col)), pc.or_(pc.less(col, lo), pc.greater(col, hi)))
        i = _first(bad)
        assert i is not None  # _in_range saw a value that is not finite or out of bounds
        bounds = _bounds(lo, hi, pa.types.is_integer(col.type))
        raise IngestError(f"{batch.where(i)}: field {field_name(field)!r}: value {col[i].as_py()!r} is not {bounds}")
    elements = [chunk.flatten() for chunk in col.chunks]
    has_null = any(e.null_count for e in elements)
    if not has_null and all(_in_range(e, lo, hi) for e in elements):
        return
    arr = col.combine_chunks()
    values = arr.flatten()
    bad = pc.or_kleene(pc.is_null(values), pc.or_(pc.invert(pc.is_finite(values)),
                                                  pc.or_(pc.less(values, lo), pc.greater(values, hi))))
    j = _first(bad)
    row = pc.list_parent_indices(arr)[j].as_py()
    index = j - (arr.offsets[row].as_py() - arr.offsets[0].as_py())
    integers = pa.types.is_integer(values.type)
    problem = "is null" if values[j].as_py() is None else f"{values[j].as_py()!r} is not {_bounds(lo, hi, integers)}"
    raise IngestError(f"{batch.where(row)}: field {field_name(field)!r}: element {index} {problem}")


def require_in(batch: CheckedRows, field: str, allowed: Iterable[str]) -> None:
    col = batch.table.column(field)
    i = _first(pc.and_(pc.is_valid(col), pc.invert(pc.is_in(col, pa.array(list(allowed))))))
    if i is not None:
        raise IngestError(f"{batch.where(i)}: field {field_name(field)!r}: unknown value {col[i].as_py()!r} "
                          f"(one of {', '.join(allowed)})")


def require_json_objects(batch: CheckedRows, field: str) -> None:
    """Every value is the text of one JSON object (strict JSON: no NaN/Infinity).

    Fast path: Arrow's JSON reader parses the values as newline-delimited JSON in one call; values it cannot
    decide alone (embedded newlines, NaN/Infinity spelled out, anything it rejects) go through Python's parser.
    """
    col = batch.table.column(field)
    if col.null_count == len(col) or _arrow_says_objects(col.drop_null()):
        return
    for i, v in enumerate(col.to_pylist()):
        if v is None:
            continue
        try:
            ok = isinstance(json.loads(v, parse_constant=reject_constant), dict)
        except ValueError:
            ok = False
        if not ok:
            raise IngestError(f"{batch.where(i)}: field {field_name(field)!r}: expected the text of a JSON object, "
                              f"got {v[:40]!r}")


def _arrow_says_objects(values: pa.ChunkedArray) -> bool:
    values = values.cast(pa.string())
    if pc.any(pc.match_substring_regex(values, r"\n|NaN|Infinity")).as_py():
        return False
    lines = pc.binary_join_element_wise(values, "", "\n").combine_chunks()  # "value\n" each
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset: lines.offset + len(lines) + 1]
    data = lines.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    options = pa_json.ParseOptions(explicit_schema=pa.schema([]), unexpected_field_behavior="ignore")
    try:
        parsed = pa_json.read_json(pa.BufferReader(data), parse_options=options)
    except pa.ArrowInvalid:
        return False
    return parsed.num_rows == len(values)  # blank values or two objects on one line change the count


def require_lake_rewards(batch: CheckedRows) -> None:
    """The lake's reward contract: 0 for a pass, -1 otherwise. Other conventions need an explicit map."""
    col = batch.table.column("reward")
    i = _first(pc.and_(pc.is_valid(col), pc.invert(pc.is_in(col, pa.array([0.0, -1.0])))))
    if i is not None:
        raise IngestError(f"{batch.where(i)}: field 'reward': value {col[i].as_py()!r} is not 0 (pass) or -1 (fail); "
                          "map another convention with --reward-map 1=0,0=-1 (or binary; >=0.5 for float scores)")


# ---- the rules of each record kind ------------------------------------------------------------------------------
def validate_trajectories(batch: CheckedRows) -> None:
    t = batch.table
    require(batch, (*TRAJECTORY_REQUIRED, "source"))
    require_names(batch, ("prompt_id",))
    require_in(batch, "source", SOURCES)
    require_finite(batch, "reward")
    require_lake_rewards(batch)
    require_finite(batch, "temperature", 0.0)
    require_finite(batch, "top_p", 0.0, 1.0)
    require_finite(batch, "logprobs", hi=LOGPROB_MAX)
    require_finite(batch, "token_ids", 0, TOKEN_ID_MAX)
    require_json_objects(batch, "metadata")
    ids, lps = t.column("token_ids"), t.column("logprobs")
    i = _first(pc.and_(pc.is_null(ids), pc.is_valid(lps)))
    if i is not None:
        raise IngestError(f"{batch.where(i)}: field 'behavior_logprobs': given without 'token_ids'")
    i = _first(pc.not_equal(pc.list_value_length(ids), pc.list_value_length(lps)))
    if i is not None:
        raise IngestError(f"{batch.where(i)}: field 'behavior_logprobs': length {len(lps[i])} != "
                          f"len(token_ids) {len(ids[i])}")
    i = _first(pc.less(t.column("policy_version"), 0))
    if i is not None:
        raise IngestError(f"{batch.where(i)}: field 'policy_version': negative")


def validate_prompts(batch: CheckedRows) -> None:
    require(batch, PROMPT_REQUIRED)
    require_names(batch, ("prompt_id", "task"))
    require_finite(batch, "time_limit_s", 1e-9)
    i = _first(pc.less_equal(batch.table.column("memory_limit_mb"), 0))
    if i is not None:
        raise IngestError(f"{batch.where(i)}: field 'memory_limit_mb': must be positive")
    require_json_objects(batch, "tests")
    require_json_objects(batch, "metadata")
    ids = batch.table.column("prompt_id")
    if pc.count_distinct(ids).as_py() == len(ids):
        return
    seen: dict[str, int] = {}
    for i, pid in enumerate(ids.to_pylist()):
        if pid in seen:
            raise IngestError(f"{batch.where(i)}: field 'prompt_id': duplicate {pid!r} "
                              f"(first at {batch.where(seen[pid])})")
        seen[pid] = i
