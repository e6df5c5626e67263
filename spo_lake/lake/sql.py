"""DuckDB over the lake: each table is a view at a pinned Delta version.

Local lakes are read by DuckDB's native Parquet reader over exactly the files of that version (Delta-rs writes no
deletion vectors, so the file list *is* the table); object-store lakes go through the pyarrow dataset, which needs no
DuckDB extension.
"""
from __future__ import annotations

import duckdb

from spo_lake.lake.contracts import contract, table_names
from spo_lake.lake.core import Lake, Snapshot, _is_uri
from spo_lake.lake.errors import LakeError


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def require_read_only(query: str) -> None:
    """A LakeError unless every statement of `query` is a SELECT (DuckDB reports syntax errors itself)."""
    for statement in duckdb.extract_statements(query):
        if statement.type != duckdb.StatementType.SELECT:
            kind = statement.type.name
            raise LakeError(f"SQL is read-only: a {kind} statement ({' '.join(statement.query.split())[:60]!r}) "
                            "writes or changes the session; only SELECT runs (`spolake sql --allow-writes` to run it)")


def referenced_tables(query: str) -> list[str]:
    """Lake tables `query` names; every table when it names none or cannot be parsed (DuckDB then reports why)."""
    try:
        names = {n.lower() for n in duckdb.get_table_names(query)}
    except duckdb.Error:
        return table_names()
    return [t for t in table_names() if t in names] or table_names()


def connect(lake: Lake, snapshot: str | Snapshot | None = None, threads: int | None = None,
            tables: list[str] | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with `tables` (default: all) as views at the snapshot's versions."""
    con = duckdb.connect()
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    versions = lake.resolve(snapshot)
    for table in tables or table_names():
        version = versions[table]
        files = lake.files(table, version)
        if not files:
            con.register(f"_{table}_empty", contract(table).arrow_schema.empty_table())
            con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM "_{table}_empty"')
        elif _is_uri(lake.root):
            con.register(f"_{table}_ds", lake.arrow_dataset(table, version))
            con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM "_{table}_ds"')
        else:
            paths = ", ".join(_quote(f) for f in files)
            con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM read_parquet([{paths}], union_by_name = true)')
        _add_missing_columns(con, table)
    return con


def _add_missing_columns(con: duckdb.DuckDBPyConnection, table: str) -> None:
    """Columns a newer contract added (always nullable) read as NULL at versions written before them, so queries
    written against the contract work on every snapshot."""
    present = {row[0] for row in con.execute(f'DESCRIBE "{table}"').fetchall()}
    if all(c.name in present for c in contract(table).columns):
        return
    con.execute(f'ALTER VIEW "{table}" RENAME TO "_{table}_stored"')
    con.register(f"_{table}_contract", contract(table).arrow_schema.empty_table())
    con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM "_{table}_stored" '
                f'UNION ALL BY NAME SELECT * FROM "_{table}_contract"')
