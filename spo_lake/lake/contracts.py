"""Table contracts: the JSON files in `schemas/` are the single definition of every lake table.

A contract lists columns with a logical type; `json` columns are stored as UTF-8 strings holding a JSON object,
so every engine (DuckDB, polars, Spark) can read them and DuckDB's `->>` operators can query them.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spo_lake.errors import UnknownName, UserError

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"

_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "json": pa.string(),
    "bool": pa.bool_(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "list<int32>": pa.list_(pa.int32()),
    "list<float32>": pa.list_(pa.float32()),
    "list<string>": pa.list_(pa.string()),
}


class ContractError(UserError, ValueError):
    """Rows that do not satisfy a table contract. The message names the table, row and field."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool
    description: str

    @property
    def arrow_type(self) -> pa.DataType:
        return _TYPES[self.type]


@dataclass(frozen=True)
class Contract:
    table: str
    version: int
    description: str
    key: tuple[str, ...]
    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow_type, nullable=c.nullable) for c in self.columns])

    def conform(self, data: pa.Table) -> pa.Table:
        """Cast `data` to this contract: fill created_at/schema_version, check types and nulls, reject extras.

        Casting is safe (no silent truncation or float->int coercion). JSON columns are taken as given: callers
        serialise them with `to_json_text` (ingest validates user-supplied JSON text before it gets here).
        """
        n = data.num_rows
        extra = set(data.column_names) - set(self.names)
        if extra:
            raise ContractError(f"{self.table}: unknown column(s) {sorted(extra)}")
        arrays = []
        for col in self.columns:
            if col.name in data.column_names:
                arr = data.column(col.name)
            elif col.name == "created_at":
                arr = pa.repeat(pa.scalar(datetime.now(UTC), pa.timestamp("us", tz="UTC")), n)
            elif col.name == "schema_version":
                arr = pa.repeat(pa.scalar(self.version, pa.int32()), n)
            elif col.nullable:
                arr = pa.nulls(n, col.arrow_type)
            else:
                raise ContractError(f"{self.table}: missing required column {col.name!r}")
            try:
                arr = arr.cast(col.arrow_type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ContractError(f"{self.table}: column {col.name!r} cannot be {col.type}: {exc}") from None
            if not col.nullable and arr.null_count:
                row = _first_null(arr)
                raise ContractError(f"{self.table}: row {row}: field {col.name!r} is required")
            arrays.append(arr)
        return pa.Table.from_arrays(arrays, schema=self.arrow_schema)


def _first_null(arr: pa.ChunkedArray | pa.Array) -> int:
    return pc.index(pc.is_null(arr), True).as_py()


@cache
def contract(table: str) -> Contract:
    path = SCHEMA_DIR / f"{table}.json"
    if not path.exists():
        raise UnknownName(f"no contract for table {table!r} (looked in {SCHEMA_DIR})")
    raw = json.loads(path.read_text())
    return Contract(
        table=raw["table"],
        version=int(raw["version"]),
        description=raw["description"],
        key=tuple(raw["key"]),
        columns=tuple(Column(c["name"], c["type"], bool(c["nullable"]), c.get("description", ""))
                      for c in raw["columns"]),
    )


def table_names() -> list[str]:
    """Every contract in `schemas/` except the lake's internal snapshot registry."""
    return sorted(p.stem for p in SCHEMA_DIR.glob("*.json") if p.stem != "snapshots")


def to_json_text(value: Any) -> str | None:
    """Serialise a JSON column value; refuses NaN/inf, which JSON cannot hold."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, allow_nan=False)


def finite(x: float) -> bool:
    return not (math.isnan(x) or math.isinf(x))
