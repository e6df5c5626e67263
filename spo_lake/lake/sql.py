"""SQL over the lake: checks on user queries, quoting, and the queries several layers share.

`Lake.connect` makes each table a view at a pinned Delta version.

Local lakes are read by DuckDB's native Parquet reader over exactly the files of that version (Delta-rs writes no
deletion vectors, so the file list *is* the table); object-store lakes go through the pyarrow dataset, which needs no
DuckDB extension.
"""
from __future__ import annotations

import re

import duckdb

from spo_lake.lake.contracts import contract, table_names
from spo_lake.lake.errors import LakeError


def sql_literal(value: str | None) -> str:
    """`value` as a SQL string literal: only for what DuckDB cannot bind as a parameter (a view definition, such as
    `Lake.connect`'s file lists); every value a query uses goes through `Lake.sql(..., params=...)`."""
    return "NULL" if value is None else "'" + value.replace("'", "''") + "'"


def where_clause(where: str | None) -> str:
    return f"WHERE ({where})" if where else ""


# A trajectory's outcome: a real verifier's verdict wins over an imported one; the latest wins among equals.
VERDICT_SQL = """
SELECT trajectory_id, arg_max(reward, (verifier <> 'imported', created_at)) AS reward,
       arg_max(passed, (verifier <> 'imported', created_at)) AS passed,
       arg_max(verdict, (verifier <> 'imported', created_at)) AS verdict
FROM evaluations GROUP BY trajectory_id
"""

DEDUP_METHOD = "python-tokens-v1"  # the normalisation `spolake dedup` hashes programs under

# One row per (prompt, program): the earliest trajectory is canonical; `sources` lists every source that produced it.
CANONICAL_SQL = f"""
SELECT d.prompt_id, d.code_hash,
       arg_min(t.trajectory_id, (t.created_at, t.trajectory_id)) AS canonical_trajectory_id,
       list(DISTINCT t.source ORDER BY t.source) AS sources,
       count(*) AS group_size
FROM duplicates d JOIN trajectories t USING (trajectory_id)
WHERE d.method = '{DEDUP_METHOD}'
GROUP BY d.prompt_id, d.code_hash
"""


def require_read_only(query: str) -> None:
    """A LakeError unless every statement of `query` is a SELECT (DuckDB reports syntax errors itself)."""
    for statement in duckdb.extract_statements(query):
        if statement.type != duckdb.StatementType.SELECT:
            kind = statement.type.name
            raise LakeError(f"SQL is read-only: a {kind} statement ({' '.join(statement.query.split())[:60]!r}) "
                            "writes or changes the session; only SELECT runs (`spolake sql --allow-writes` to run it)")


def referenced_tables(query: str) -> list[str]:
    """Lake tables `query` names; every table when it names none or cannot be parsed (DuckDB then reports why)."""
    try:  # (DuckDB's parser refuses `$name` parameters here; a NULL in their place names the same tables)
        names = {n.lower() for n in duckdb.get_table_names(re.sub(r"\$\w+", "NULL", query))}
    except duckdb.Error:
        return table_names()
    return [t for t in table_names() if t in names] or table_names()


def add_missing_columns(con: duckdb.DuckDBPyConnection, table: str) -> None:
    """Columns a newer contract added (always nullable) read as NULL at versions written before them, so queries
    written against the contract work on every snapshot."""
    present = {row[0] for row in con.execute(f'DESCRIBE "{table}"').fetchall()}
    if all(c.name in present for c in contract(table).columns):
        return
    con.execute(f'ALTER VIEW "{table}" RENAME TO "_{table}_stored"')
    con.register(f"_{table}_contract", contract(table).arrow_schema.empty_table())
    con.execute(f'CREATE VIEW "{table}" AS SELECT * FROM "_{table}_stored" '
                f'UNION ALL BY NAME SELECT * FROM "_{table}_contract"')
