"""Lake verbs: init, sql, snapshot, history, stats, compact, vacuum, doctor."""
from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import typer

from spo_lake.cli.common import STATE, console, open_lake, user_errors
from spo_lake.cli.output import (
    DOCUMENT_FORMAT,
    ROWS_FORMAT,
    SQL_FORMAT,
    DocumentFormat,
    RowsFormat,
    SqlFormat,
    emit_json,
    emit_rows,
    show_table,
)
from spo_lake.errors import InputError
from spo_lake.lake import Lake, LakeError, table_names
from spo_lake.lake.core import DEFAULT_RETENTION_HOURS
from spo_lake.lake.doctor import diagnose

snapshot_app = typer.Typer(help="Named, immutable pins of every table's version.")


def _iso_ms(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _snapshot_json(snap) -> dict:
    return {"name": snap.name, "created_at": snap.created_at, "note": snap.note, "versions": snap.versions}


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
            format: SqlFormat = SQL_FORMAT,
            out: Path | None = typer.Option(None, help="write the result here"),
            allow_writes: bool = typer.Option(False, "--allow-writes",
                                              help="also run statements that write files or change the session "
                                                   "(COPY ... TO, CREATE, ATTACH, INSTALL/LOAD, SET); the lake's "
                                                   "tables stay read-only views")) -> None:
        """Run read-only SQL over the lake (at a snapshot, or latest): SELECT statements only unless --allow-writes."""
        emit_rows(open_lake().sql(query, snapshot=snapshot, writes=allow_writes), format, out)

    @snapshot_app.command("create")
    @user_errors
    def snapshot_create(name: str, note: str | None = typer.Option(None),
                        format: DocumentFormat = DOCUMENT_FORMAT) -> None:
        """Pin the current version of every table under NAME."""
        snap = open_lake().snapshot(name, note=note)
        if format == "json":
            emit_json(_snapshot_json(snap))
        console.print(f"snapshot {snap.name}: " + ", ".join(f"{t}@{v}" for t, v in snap.versions.items()))

    @snapshot_app.command("list")
    @user_errors
    def snapshot_list(format: RowsFormat = ROWS_FORMAT) -> None:
        """Every snapshot with its note and table versions."""
        emit_rows([_snapshot_json(s) for s in open_lake().snapshots()], format)

    @snapshot_app.command("show")
    @user_errors
    def snapshot_show(name: str, format: DocumentFormat = DOCUMENT_FORMAT) -> None:
        """Each table's Delta version and rows at the snapshot; with --format json also its path, so any Delta
        reader (polars, daft, Ray Data, DuckDB, Spark) can read the snapshot without spo-lake."""
        lake = open_lake()
        snap = lake.get_snapshot(name)
        if format == "json":
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
                        format: DocumentFormat = DOCUMENT_FORMAT) -> None:
        """Delete a snapshot; its files are released to the next vacuum. A snapshot a run trained or evaluated on
        is kept unless --force."""
        open_lake().delete_snapshot(name, force=force)
        if format == "json":
            emit_json({"deleted": name})
        console.print(f"deleted snapshot {name}")

    app.add_typer(snapshot_app, name="snapshot")

    @app.command()
    @user_errors
    def history(table: str | None = typer.Argument(None), format: RowsFormat = ROWS_FORMAT) -> None:
        """Delta commit history of one table (or every table's current version)."""
        lake = open_lake()
        if table is None:
            emit_rows([{"table": t, "version": v} for t, v in lake.versions().items()], format)
            return
        emit_rows([{"version": h.get("version"), "timestamp": _iso_ms(h.get("timestamp")),
                    "operation": h.get("operation"), "metrics": h.get("operationMetrics", {})}
                   for h in lake.history(table)], format, title=table)

    @app.command()
    @user_errors
    def stats(snapshot: str | None = typer.Option(None), format: DocumentFormat = DOCUMENT_FORMAT) -> None:
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
        if format == "json":
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
        for option, hours in (("--retention-hours", retention_hours), ("--orphan-age-hours", orphan_age_hours)):
            if hours < 0:
                raise InputError(f"{option} {hours}: must be 0 or more")
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
               format: DocumentFormat = DOCUMENT_FORMAT) -> None:
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
            if format == "table":
                print(p.line())
            if p.repair is None or not (yes or (sys.stdin.isatty() and typer.confirm(f"{p.where}: {p.fix}?"))):
                continue
            p.repair()
            repaired.append(p)
            console.print(f"repaired {p.where}: {p.fix}")
        left = [p for p in problems if p not in repaired]
        if format == "json":
            emit_json({"problems": [{"where": p.where, "problem": p.what, "repair": p.fix, "repaired": p in repaired}
                                    for p in problems]})
        fixable = sum(p.repair is not None for p in left)
        console.print("no problems found" if not problems else
                      f"{len(problems)} problems, {len(repaired)} repaired, {len(left)} left"
                      + (f" ({fixable} repairable: rerun with --yes)" if fixable else ""))
        if left:
            raise typer.Exit(1)
