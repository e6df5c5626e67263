"""DuckDB over the lake: each table is a view at a pinned Delta version.

Local lakes are read by DuckDB's native Parquet reader over exactly the files of that version (Delta-rs writes no
deletion vectors, so the file list *is* the table); object-store lakes go through the pyarrow dataset, which needs no
DuckDB extension.
"""
from __future__ import annotations

import duckdb

from spo_lake.lake.contracts import contract, table_names
from spo_lake.lake.core import Lake, Snapshot, _is_uri


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def connect(lake: Lake, snapshot: str | Snapshot | None = None, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    for table, version in lake.resolve(snapshot).items():
        files = lake.files(table, version)
        if not files:
            con.register(f"_{table}_empty", contract(table).arrow_schema.empty_table())
            con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM "_{table}_empty"')
        elif _is_uri(lake.root):
            con.register(f"_{table}_ds", lake.arrow_dataset(table, version))
            con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM "_{table}_ds"')
        else:
            paths = ", ".join(_quote(f.removeprefix("file://")) for f in files)
            con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM read_parquet([{paths}], union_by_name = true)')
    return con


def table_columns() -> dict[str, list[str]]:
    return {t: contract(t).names for t in table_names()}
