"""`spolake report`: views over accumulated rollouts (SQL in spo_lake.pipelines.views, spo_lake.pipelines.report and
spo_lake.rl.batches). The whole group is defined and mounted here."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import typer

from spo_lake.cli.common import console, open_lake, parse_ks, user_errors
from spo_lake.cli.output import ROWS_FORMAT, RowsFormat, emit_rows
from spo_lake.errors import InputError

WHERE = typer.Option(None, help="SQL filter over trajectories t, e.g. \"t.source <> 'human'\"")
SNAPSHOT = typer.Option(None, help="read at this snapshot (default: the lake's head)")
PNG = typer.Option(None, "--png", help="also draw the view to this PNG file")


def _show(table: pa.Table, title: str, format: RowsFormat, png: Path | None = None,
          plot: Callable[[pa.Table, Path], None] | None = None) -> None:
    """The view in `format`; also drawn into `png` by `plot` when --png is given."""
    emit_rows(table, format, title=title)
    if png and plot:
        plot(table, png)
        console.print(f"plot: {png}")


def register(app: typer.Typer) -> None:
    report_app = typer.Typer(help="Reports over the lake.")

    @report_app.command("solves")
    @user_errors
    def solves(snapshots: str | None = typer.Option(None, help="comma-separated snapshots, in order (default: "
                                                       "the head); e.g. a chain's c-run-1,c-run-2,..."),
               where: str | None = WHERE,
               group_by: str = typer.Option("all", help="all|source|run_id"),
               per_prompt: bool = typer.Option(False, help="one row per prompt (at the last snapshot) instead"),
               png: Path | None = PNG, format: RowsFormat = ROWS_FORMAT) -> None:
        """Solve rate and distinct correct programs (dedup-normalised) per prompt, over snapshots."""
        from spo_lake.pipelines.views import plot_solves, prompt_solves, solves_over_snapshots

        lake = open_lake()
        names = [s.strip() for s in snapshots.split(",") if s.strip()] if snapshots else [None]
        if per_prompt:
            _show(prompt_solves(lake, names[-1], where, group_by), "per prompt", format)
            return
        _show(solves_over_snapshots(lake, names, where, group_by), "solves over snapshots", format, png, plot_solves)

    @report_app.command("coverage")
    @user_errors
    def coverage(snapshot: str | None = SNAPSHOT, where: str | None = WHERE, png: Path | None = PNG,
                 format: RowsFormat = ROWS_FORMAT) -> None:
        """Prompts with ≥1 correct solution per source and run, and how many each solved first."""
        from spo_lake.pipelines.views import coverage as view
        from spo_lake.pipelines.views import plot_coverage

        _show(view(open_lake(), snapshot, where), "coverage per source and run", format, png, plot_coverage)

    @report_app.command("first-solved")
    @user_errors
    def first_solved(snapshot: str | None = SNAPSHOT, where: str | None = WHERE,
                     format: RowsFormat = ROWS_FORMAT) -> None:
        """Per solved prompt: the source, run and trajectory that solved it first."""
        from spo_lake.pipelines.views import first_solved as view

        _show(view(open_lake(), snapshot, where), "first solved by", format)

    @report_app.command("hardest")
    @user_errors
    def hardest(snapshot: str | None = SNAPSHOT, where: str | None = WHERE,
                pi0: str | None = typer.Option(None, help="π0's model directory or hub name (default: any "
                                                  "model's prompt-level Q0 counts)"),
                limit: int = typer.Option(20, min=1, help="rows"), format: RowsFormat = ROWS_FORMAT) -> None:
        """Prompts some source solved, lowest Q0 (π0's Monte-Carlo success rate) first."""
        from spo_lake.models.identity import model_identity
        from spo_lake.pipelines.views import hardest_solved

        table = hardest_solved(open_lake(), snapshot, where, model_identity(pi0) if pi0 else None, limit)
        _show(table, "hardest prompts solved", format)

    @report_app.command("batch")
    @user_errors
    def batch(run_dir: Path = typer.Argument(..., help="the run's directory (runs/<run_id>)"),
              format: RowsFormat = ROWS_FORMAT) -> None:
        """How much of a run's batches came from which stream and source (rebuilt exactly: spo_lake.rl.batches)."""
        from spo_lake.rl.batches import batch_sources

        if not (run_dir / "manifest.json").exists():
            raise InputError(f"{run_dir}: not a run directory (no manifest.json)")
        _show(batch_sources(open_lake(), run_dir), f"batch sources of {run_dir.name}", format)

    @report_app.command("passk")
    @user_errors
    def passk(snapshot: str | None = SNAPSHOT,
              group_by: str = typer.Option("source", help="source|model|run_id|prompt|none"),
              k: str = typer.Option("1,10", help="comma-separated k values"),
              where: str | None = WHERE,
              format: RowsFormat = ROWS_FORMAT) -> None:
        """pass@k (unbiased estimator) over evaluated trajectories."""
        from spo_lake.pipelines.report import passk_counts, passk_table

        table = passk_table(passk_counts(open_lake(), group_by, snapshot, where), list(parse_ks(k)))
        _show(table, f"pass@k by {group_by}", format)

    app.add_typer(report_app, name="report")
