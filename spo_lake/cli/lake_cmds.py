"""Lake verbs: init, sql, snapshot, history, stats, compact, vacuum, doctor."""
from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path

import pyarrow as pa
import typer
from rich.table import Table

from spo_lake.cli.common import FORMAT_OPTION, STATE, OutputFormat, console, emit_json, open_lake, user_errors
from spo_lake.errors import InputError
from spo_lake.lake import Lake, LakeError, table_names
from spo_lake.lake.core import DEFAULT_RETENTION_HOURS
from spo_lake.lake.doctor import diagnose

snapshot_app = typer.Typer(help="Named, immutable pins of every table's version.")


class SqlFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


def _iso_ms(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def show_table(t: pa.Table, title: str | None = None, limit: int = 50) -> None:
    from rich.console import Console

    out = Table(title=title, show_lines=False)
    for name in t.column_names:
        out.add_column(name, overflow="fold")
    for row in t.slice(0, limit).to_pylist():
        out.add_row(*[_cell(v) for v in row.values()])
    Console().print(out)
    if t.num_rows > limit:
        console.print(f"[dim]… {t.num_rows - limit} more rows (use --format csv or --out)[/dim]")


def _cell(v: object) -> str:
    s = "∅" if v is None else str(v)
    return s if len(s) <= 120 else s[:117] + "…"


def _nested_as_json(t: pa.Table) -> pa.Table:
    """CSV cells cannot hold lists or structs: write those as JSON text (as `spolake ingest` reads them back)."""
    for i, field in enumerate(t.schema):
        if pa.types.is_nested(field.type):
            text = [None if v is None else json.dumps(v, default=str) for v in t.column(i).to_pylist()]
            t = t.set_column(i, field.name, pa.array(text, pa.string()))
    return t


def write_arrow(t: pa.Table, fmt: str, out: Path | None) -> None:
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    if fmt == "parquet":
        if out is None:
            raise InputError("--format parquet needs --out PATH")
        pq.write_table(t, out)
    elif fmt == "csv":
        sink = pa.BufferOutputStream()
        pcsv.write_csv(_nested_as_json(t), sink)
        data = sink.getvalue().to_pybytes()
        out.write_bytes(data) if out else sys.stdout.buffer.write(data)
    elif fmt in ("json", "jsonl"):
        text = "".join(json.dumps(r, default=str, ensure_ascii=False) + "\n" for r in t.to_pylist())
        out.write_text(text) if out else sys.stdout.write(text)
    elif fmt == "table":
        show_table(t)
    else:
        raise InputError(f"unknown format {fmt!r}")


def _snapshot_json(snap) -> dict:
    return {"name": snap.name, "created_at": str(snap.created_at), "note": snap.note, "versions": snap.versions}


def register(app: typer.Typer) -> None:
    @app.command()
    @user_errors
    def init() -> None:
        """Create a lake (idempotent) at --lake."""
        lake = Lake.init(STATE.lake_path)
        console.print(f"lake ready at {lake.root} ({len(table_names())} tables)")

    @app.command()
    @user_errors
    def sql(query: str = typer.Argument(..., help="DuckDB SQL; every table is a view"),
            snapshot: str | None = typer.Option(None, help="read every table at this snapshot"),
            format: SqlFormat = typer.Option(SqlFormat.table, "--format"),
            out: Path | None = typer.Option(None, help="write the result here"),
            allow_writes: bool = typer.Option(False, "--allow-writes",
                                              help="also run statements that write files or change the session "
                                                   "(COPY ... TO, CREATE, ATTACH, INSTALL/LOAD, SET); the lake's "
                                                   "tables stay read-only views")) -> None:
        """Run read-only SQL over the lake (at a snapshot, or latest): SELECT statements only unless --allow-writes."""
        write_arrow(open_lake().sql(query, snapshot=snapshot, writes=allow_writes), format.value, out)

    @snapshot_app.command("create")
    @user_errors
    def snapshot_create(name: str, note: str | None = typer.Option(None),
                        format: OutputFormat = FORMAT_OPTION) -> None:
        """Pin the current version of every table under NAME."""
        snap = open_lake().snapshot(name, note=note)
        if format is OutputFormat.json:
            emit_json(_snapshot_json(snap))
        console.print(f"snapshot {snap.name}: " + ", ".join(f"{t}@{v}" for t, v in snap.versions.items()))

    @snapshot_app.command("list")
    @user_errors
    def snapshot_list(format: OutputFormat = FORMAT_OPTION) -> None:
        """Every snapshot with its note and table versions."""
        snaps = open_lake().snapshots()
        if format is OutputFormat.json:
            emit_json([_snapshot_json(s) for s in snaps])
            return
        write_arrow(pa.Table.from_pylist([{"name": s.name, "created_at": str(s.created_at), "note": s.note,
                                           "versions": json.dumps(s.versions)} for s in snaps],
                                         schema=pa.schema([("name", pa.string()), ("created_at", pa.string()),
                                                           ("note", pa.string()), ("versions", pa.string())])),
                    "table", None)

    @snapshot_app.command("show")
    @user_errors
    def snapshot_show(name: str, format: OutputFormat = FORMAT_OPTION) -> None:
        """Each table's Delta version and rows at the snapshot; with --format json also its path, so any Delta
        reader (polars, daft, Ray Data, DuckDB, Spark) can read the snapshot without spo-lake."""
        lake = open_lake()
        snap = lake.get_snapshot(name)
        if format is OutputFormat.json:
            tables = {t: {"path": lake.uri(t), "version": v, "rows": lake.count(t, snap)}
                      for t, v in lake.resolve(snap).items()}
            emit_json(_snapshot_json(snap) | {"lake": lake.root, "tables": tables})
            return
        rows = [{"table": t, "version": v, "rows": lake.count(t, snap)} for t, v in snap.versions.items()]
        show_table(pa.Table.from_pylist(rows), title=f"snapshot {name} ({snap.created_at}) {snap.note or ''}")

    @snapshot_app.command("delete")
    @user_errors
    def snapshot_delete(name: str, force: bool = typer.Option(False, "--force",
                                                              help="delete it even if a run records it"),
                        format: OutputFormat = FORMAT_OPTION) -> None:
        """Delete a snapshot; its files are released to the next vacuum. A snapshot a run trained or evaluated on
        is kept unless --force."""
        open_lake().delete_snapshot(name, force=force)
        if format is OutputFormat.json:
            emit_json({"deleted": name})
        console.print(f"deleted snapshot {name}")

    app.add_typer(snapshot_app, name="snapshot")

    @app.command()
    @user_errors
    def history(table: str | None = typer.Argument(None), format: OutputFormat = FORMAT_OPTION) -> None:
        """Delta commit history of one table (or every table's current version)."""
        lake = open_lake()
        if table is None:
            rows = [{"table": t, "version": v} for t, v in lake.versions().items()]
            emit_json(rows) if format is OutputFormat.json else show_table(pa.Table.from_pylist(rows))
            return
        rows = [{"version": h.get("version"), "timestamp": _iso_ms(h.get("timestamp")), "operation": h.get("operation"),
                 "metrics": h.get("operationMetrics", {})} for h in lake.history(table)]
        if format is OutputFormat.json:
            emit_json(rows)
            return
        show_table(pa.Table.from_pylist([r | {"metrics": json.dumps(r["metrics"])} for r in rows]), title=table)

    @app.command()
    @user_errors
    def stats(snapshot: str | None = typer.Option(None), format: OutputFormat = FORMAT_OPTION) -> None:
        """Rows by table, trajectories by source, and by prompt."""
        lake = open_lake()
        sections = {  # JSON key -> (title, rows)
            "tables": ("rows by table",
                       pa.Table.from_pylist([{"table": t, "rows": lake.count(t, snapshot)} for t in table_names()])),
            "sources": ("trajectories by source", lake.sql("""
                SELECT t.source, count(*) AS trajectories, count(DISTINCT t.prompt_id) AS prompts,
                       avg(CASE WHEN e.passed THEN 1.0 ELSE 0.0 END) FILTER (WHERE e.passed IS NOT NULL) AS pass_rate
                FROM trajectories t LEFT JOIN (SELECT trajectory_id, bool_and(passed) AS passed
                                               FROM evaluations GROUP BY 1) e USING (trajectory_id)
                GROUP BY 1 ORDER BY 2 DESC""", snapshot)),
            "tasks": ("by prompt (per task)", lake.sql("""
                SELECT p.task, count(DISTINCT p.prompt_id) AS prompts, count(t.trajectory_id) AS trajectories,
                       count(t.trajectory_id) / greatest(count(DISTINCT p.prompt_id), 1) AS per_prompt
                FROM prompts p LEFT JOIN trajectories t USING (prompt_id) GROUP BY 1 ORDER BY 1""", snapshot)),
        }
        if format is OutputFormat.json:
            emit_json({key: rows.to_pylist() for key, (_, rows) in sections.items()})
            return
        for title, rows in sections.values():
            show_table(rows, title)

    @app.command()
    @user_errors
    def compact() -> None:
        """Bin-pack small files; every snapshot stays readable."""
        with console.status("compacting"):
            res = open_lake().compact()
        for t, m in res.items():
            console.print(f"{t}: {m.get('numFilesRemoved', 0)} files -> {m.get('numFilesAdded', 0)}")

    @app.command()
    @user_errors
    def vacuum(retention_hours: int = typer.Option(
                   DEFAULT_RETENTION_HOURS, help="keep every file a version newer than this many hours references "
                                                 "(what running queries, exports and pipelines read)"),
               orphan_age_hours: int = typer.Option(24, help="delete never-committed files once older than this and "
                                                    "--retention-hours (those of writers killed before their commit "
                                                    "go at once; writes in flight are always kept)"),
               dry_run: bool = typer.Option(False)) -> None:
        """Delete files that no snapshot and no version younger than the retention window references."""
        lake = open_lake()
        if retention_hours < DEFAULT_RETENTION_HOURS:
            console.print(f"[bold red]warning:[/] --retention-hours {retention_hours} deletes files of versions "
                          f"younger than {DEFAULT_RETENTION_HOURS} h: a query, export or pipeline still reading one of "
                          "them fails (snapshots stay readable)")
        with console.status("vacuuming"):
            res = lake.vacuum(retention_hours=retention_hours, dry_run=dry_run,
                                     orphan_age_hours=orphan_age_hours)
        console.print(f"{'would delete' if dry_run else 'deleted'} {sum(map(len, res.values()))} files")

    @app.command()
    @user_errors
    def doctor(yes: bool = typer.Option(False, "--yes", help="make every repair without asking"),
               format: OutputFormat = FORMAT_OPTION) -> None:
        """Check every table and snapshot: logs readable, every referenced file present and valid Parquet, the
        snapshot registry consistent. One line per problem; repairs what Delta allows (drop a truncated last log
        entry, rebuild a checkpoint, start a lost registry empty) after confirmation, deleting no data file.
        Exits 1 while problems remain."""
        lake = Lake.locate(STATE.lake_path, STATE.storage_options)
        problems = diagnose(lake, table_names())
        if len(problems) == len(table_names()) + 1 and all(p.what.startswith("table missing") for p in problems):
            raise LakeError(f"{lake.root}: not a lake (run `spolake init` or pass --lake)")
        repaired = []
        for p in problems:
            if format is OutputFormat.table:
                print(p.line())
            if p.repair is None or not (yes or (sys.stdin.isatty() and typer.confirm(f"{p.where}: {p.fix}?"))):
                continue
            p.repair()
            repaired.append(p)
            console.print(f"repaired {p.where}: {p.fix}")
        left = [p for p in problems if p not in repaired]
        if format is OutputFormat.json:
            emit_json({"problems": [{"where": p.where, "problem": p.what, "repair": p.fix, "repaired": p in repaired}
                                    for p in problems]})
        fixable = sum(p.repair is not None for p in left)
        console.print("no problems found" if not problems else
                      f"{len(problems)} problems, {len(repaired)} repaired, {len(left)} left"
                      + (f" ({fixable} repairable: rerun with --yes)" if fixable else ""))
        if left:
            raise typer.Exit(1)
