"""`spolake view`: a static site of the lake (spo_lake.view) that opens from disk, no server, no network."""
from __future__ import annotations

from pathlib import Path

import typer

from spo_lake.cli.common import console, open_lake, user_errors


def register(app: typer.Typer) -> None:
    @app.command()
    @user_errors
    def view(out: Path = typer.Option(..., "--out", help="directory for the site (new, empty, or an earlier site)"),
             snapshot: str | None = typer.Option(None, help="show the lake at this snapshot (default: the head)"),
             tokenizer: Path | None = typer.Option(None, help="π0's model directory: places pivotal tokens on their "
                                                   "characters in the response text"),
             runs: list[Path] = typer.Option([Path("runs")], "--runs", help="where run directories are "
                                             "(metrics.jsonl, manifest.json); repeatable"),
             demo_report: Path | None = typer.Option(None, help="the demo's report.md, linked from the overview"),
             quiet: bool = typer.Option(False, "--quiet", help="no progress bar")) -> None:
        """Write an HTML site of the lake: overview (rows, snapshots, runs, coverage, first solver, hardest), one page
        per prompt (problem, tests, every trajectory with its verdict, pivotal tokens highlighted, two runs side by
        side) and per run (pass@k against step, loss/KL/grad-norm, rows read by stream, rollouts written)."""
        from spo_lake.view.site import build_site

        summary = build_site(open_lake(), out, snapshot, tokenizer, tuple(runs), demo_report,
                             show_progress=not quiet)
        console.print(f"site: {summary.out / 'index.html'} ({summary.pages} pages, {summary.prompts} prompts, "
                      f"{summary.trajectories} trajectories, {summary.runs} runs; largest page "
                      f"{summary.largest_page_bytes / 1e6:.2f} MB)")
