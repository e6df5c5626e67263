"""`spolake chain`: training runs that build on each other through the lake (spo_lake.chain)."""
from __future__ import annotations

import sys

import typer

from spo_lake.cli.common import console, open_lake, user_errors


def register(app: typer.Typer) -> None:
    @app.command()
    @user_errors
    def chain(config: str = typer.Option(..., "--config", "-c", help="run config (TOML) with an optional chain table: "
                                         "name, dir, between (recipe steps)"),
              runs: int = typer.Option(..., "--runs", min=1, help="number of runs K"),
              set_: list[str] = typer.Option(None, "--set", help="override a run-config key: key=value or "
                                             "streams.<name>.<key>=value (TOML values; repeatable)"),
              name: str | None = typer.Option(None, help="chain name (default: the chain table's name, "
                                                 "else 'chain')"),
              from_previous_checkpoint: bool = typer.Option(
                  False, "--from-previous-checkpoint", help="run k starts from run k−1's final checkpoint "
                  "(default: every run starts from π0)"),
              quiet: bool = typer.Option(False, help="no live progress display")) -> None:
        """Run k trains from a snapshot holding everything runs 1..k−1 wrote back. Re-running continues."""
        from spo_lake.chain import RunFailed, load_chain, run_chain

        spec = load_chain(config, list(set_ or []), name=name, from_previous_checkpoint=from_previous_checkpoint)
        try:
            manifest = run_chain(spec, open_lake(), runs, log=console.print, quiet=quiet)
        except RunFailed as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None
        for run in manifest["runs"][:runs]:
            console.print(f"run {run['run']}: {run['run_id']} read snapshot {run['snapshot']}, "
                          f"checkpoint {run['checkpoint']}")
        console.print(f"manifest: {spec.root / 'manifest.json'}")
