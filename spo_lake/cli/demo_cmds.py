"""`spolake demo`: the main job, end to end on CPU."""
from __future__ import annotations

from pathlib import Path

import typer

from spo_lake.cli.common import console, user_errors


def register(app: typer.Typer) -> None:
    @app.command()
    @user_errors
    def demo(out: Path = typer.Option(Path("demo-out"), help="where the lake, models, runs, report and plots go"),
             quick: bool = typer.Option(False, "--quick", help="smaller everything (~3 min instead of ~15)"),
             seed: int = typer.Option(0, help="seed of problems, models, sampling and training")) -> None:
        """Build a lake with the quickstart recipe, train PPO and three SPO variants from its snapshot, compare
        pass@1/pass@10 on held-out prompts, and write a report with plots. Re-running continues where it stopped."""
        from spo_lake.cli.train_cmds import quiet_transformers
        from spo_lake.demo.run import run_demo

        quiet_transformers()
        run_demo(out, quick=quick, seed=seed, log=console.print)
        console.print(f"report: {out / 'report.md'}; plots: {out / 'pass_at_k.png'}, {out / 'pts_curve.png'}")
