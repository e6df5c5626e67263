"""What a verb prints on stdout with `--format`, the same in every verb.

- table  a table for people (a missing value shows as ∅); messages go to stderr in every format.
- json   ONE JSON document: an array of row objects for a verb whose result is rows (`sql`, `report ...`, `history`,
         `snapshot list`), one object for the others; `json.load` reads the whole of stdout (as DuckDB's `-json`).
- jsonl  one row object per line (rows only; as DuckDB's `-jsonlines`).
- csv    a header and one line per row (rows only); a list or struct cell is JSON text, a missing value is empty.
- parquet  a Parquet file at `--out` (`sql` only).

A missing value is null in json and jsonl; values keep their JSON types: numbers stay numbers, lists and structs stay
arrays and objects, timestamps are ISO 8601 strings, NaN and infinity are null.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, TypeAlias

import pyarrow as pa
import typer

from spo_lake.console import console, print_table
from spo_lake.errors import InputError

DocumentFormat = Literal["table", "json"]
RowsFormat = Literal["table", "csv", "json", "jsonl"]
SqlFormat = Literal["table", "csv", "json", "jsonl", "parquet"]

DOCUMENT_HELP = "table (for people) or json (one JSON object on stdout)"
DOCUMENT_FORMAT = typer.Option("table", "--format", help=DOCUMENT_HELP)
_ROWS_HELP = ("table (for people), csv, json (one JSON array of row objects) or jsonl (one row object per line); "
              "a missing value is null (empty in csv)")
ROWS_FORMAT = typer.Option("table", "--format", help=_ROWS_HELP)
SQL_FORMAT = typer.Option("table", "--format", help=_ROWS_HELP + "; parquet needs --out")

Rows: TypeAlias = "pa.Table | list[dict[str, Any]]"


def plain(value: Any) -> Any:
    """`value` as JSON types: datetimes as ISO strings, decimals as numbers, NaN and infinity as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else plain(float(value))
    return value


def to_json(value: Any) -> str:
    return json.dumps(plain(value), default=str, ensure_ascii=False, allow_nan=False)


def emit_json(data: Any) -> None:
    """A verb's result as one JSON document on stdout (what `--format json` prints)."""
    sys.stdout.write(to_json(data) + "\n")


def show_report(report: Any, format: DocumentFormat) -> None:
    """A pipeline step's report: its summary line on stderr and, with --format json, its fields on stdout."""
    if format == "json":
        emit_json(dataclasses.asdict(report) | {"summary": report.summary()})
    console.print(report.summary())


def emit_rows(rows: Rows, format: SqlFormat, out: Path | None = None, title: str | None = None) -> None:
    """A verb's rows in `format`, on stdout or into `out`."""
    if format == "parquet":
        import pyarrow.parquet as pq

        if out is None:
            raise InputError("--format parquet needs --out PATH")
        pq.write_table(rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows), out)
        return
    if format == "table":
        show_table(_flat(rows), title)
        return
    if format == "csv":
        import pyarrow.csv as pcsv

        sink = pa.BufferOutputStream()
        pcsv.write_csv(_flat(rows), sink)
        data = sink.getvalue().to_pybytes()
    elif format in ("json", "jsonl"):
        records = rows.to_pylist() if isinstance(rows, pa.Table) else rows
        text = to_json(records) + "\n" if format == "json" else "".join(to_json(r) + "\n" for r in records)
        data = text.encode()
    else:
        raise InputError(f"--format {format!r}: table, csv, json, jsonl or parquet")
    out.write_bytes(data) if out else sys.stdout.buffer.write(data)


def _flat(rows: Rows) -> pa.Table:
    """Rows for a table or CSV, whose cells cannot hold lists or structs: those become JSON text (as `spolake ingest`
    reads them back)."""
    if not isinstance(rows, pa.Table):
        return pa.Table.from_pylist([{k: _flat_value(v) for k, v in r.items()} for r in rows])
    for i, field in enumerate(rows.schema):
        if pa.types.is_nested(field.type):
            text = [_flat_value(v) for v in rows.column(i).to_pylist()]
            rows = rows.set_column(i, field.name, pa.array(text, pa.string()))
    return rows


def _flat_value(v: Any) -> Any:
    return to_json(v) if isinstance(v, (dict, list, tuple)) else v


def show_table(t: pa.Table, title: str | None = None, limit: int = 50) -> None:
    """The first `limit` rows as a table for people: drawn on a terminal (long cells cut), Markdown elsewhere."""
    from rich.console import Console
    from rich.table import Table

    terminal = Console().is_terminal
    out = Table(title=title, show_lines=False)
    for name in t.column_names:
        out.add_column(name, overflow="fold")
    for row in t.slice(0, limit).to_pylist():
        out.add_row(*[_cell(v, cut=terminal) for v in row.values()])
    print_table(out)
    if t.num_rows > limit:
        console.print(f"[dim]… {t.num_rows - limit} more rows (use --format csv or --out)[/dim]")


def _cell(v: object, cut: bool) -> str:
    s = "∅" if v is None else str(v)
    return s if len(s) <= 120 or not cut else s[:117] + "…"
