"""Curation verbs: evaluate, dedup, report."""
from __future__ import annotations

from typing import Optional

import typer

from spo_lake.cli.common import FORMAT_OPTION, OutputFormat, console, emit_json, open_lake, show_report, user_errors
from spo_lake.cli.lake_cmds import show_table, write_arrow

report_app = typer.Typer(help="Reports over the lake.")

SANDBOX_HELP = "bwrap (default) or none — none runs generated code UNSANDBOXED on this machine; never on untrusted data"
EXECUTOR_HELP = "local (this process) or ray (Ray workers; same rows as local)"
RAY_ADDRESS_HELP = "the Ray cluster for --executor ray, e.g. ray://head:10001 or auto (default: a new local instance)"


def sandbox_options(timeout_s: float, memory_mb: int, sandbox: str):
    from spo_lake.tasks import SandboxOptions

    if sandbox not in ("bwrap", "none"):
        raise ValueError(f"--sandbox {sandbox!r}: bwrap or none")
    if sandbox == "none":
        console.print("[bold red]WARNING: --sandbox none: generated code runs unsandboxed with your privileges[/bold red]")
    return SandboxOptions(timeout_s=timeout_s, memory_mb=memory_mb, mode=sandbox)


def register(app: typer.Typer) -> None:
    @app.command()
    @user_errors
    def evaluate(where: Optional[str] = typer.Option(None, help="SQL filter over trajectories t joined with prompts p"),
                 workers: Optional[int] = typer.Option(None, help="parallel sandboxes (default: cores)"),
                 timeout_s: float = typer.Option(5.0, help="wall-clock limit per test"),
                 memory_mb: int = typer.Option(512, help="address-space limit"),
                 sandbox: str = typer.Option("bwrap", help=SANDBOX_HELP),
                 executor: str = typer.Option("local", help=EXECUTOR_HELP),
                 ray_address: Optional[str] = typer.Option(None, help=RAY_ADDRESS_HELP),
                 format: OutputFormat = FORMAT_OPTION) -> None:
        """Judge every trajectory its task's verifier has not judged yet (incremental, resumable)."""
        from spo_lake.pipelines.evaluate import evaluate as run

        report = run(open_lake(), where=where, options=sandbox_options(timeout_s, memory_mb, sandbox), workers=workers,
                     executor=executor, ray_address=ray_address)
        show_report(report, format)

    @app.command()
    @user_errors
    def dedup(where: Optional[str] = typer.Option(None, help="SQL filter over trajectories t joined with prompts p"),
              format: OutputFormat = FORMAT_OPTION) -> None:
        """Group identical programs per prompt (comments/whitespace ignored); raw rows stay."""
        from spo_lake.pipelines.dedup import dedup as run

        show_report(run(open_lake(), where=where), format)

    @report_app.command("passk")
    @user_errors
    def passk(snapshot: Optional[str] = typer.Option(None), group_by: str = typer.Option("source", help="source|model|run_id|prompt|none"),
              k: str = typer.Option("1,10", help="comma-separated k values"),
              where: Optional[str] = typer.Option(None, help="SQL filter over trajectories t"),
              format: str = typer.Option("table", "--format", help="table|csv|json")) -> None:
        """pass@k (unbiased estimator) over evaluated trajectories."""
        from spo_lake.pipelines.report import passk_counts, passk_table

        ks = [int(x) for x in k.split(",") if x.strip()]
        table = passk_table(passk_counts(open_lake(), group_by, snapshot, where), ks)
        show_table(table, title=f"pass@k by {group_by}") if format == "table" else write_arrow(table, format, None)

    app.add_typer(report_app, name="report")
    app.add_typer(pipeline_app, name="pipeline")


pipeline_app = typer.Typer(help="Declarative TOML recipes chaining pipeline steps.")


@pipeline_app.command("run")
@user_errors
def pipeline_run(recipe: str = typer.Argument(..., help="recipe TOML (see pipelines/)"),
                 set_: list[str] = typer.Option(None, "--set", help="override a [vars] entry: name=value"),
                 format: OutputFormat = FORMAT_OPTION) -> None:
    """Run a recipe's steps in order; each is incremental, so a re-run continues where a crash stopped."""
    from spo_lake.pipelines.recipe import load_recipe, run_recipe

    from spo_lake.cli.common import parse_map

    loaded = load_recipe(recipe, parse_map(set_))
    done = run_recipe(loaded, open_lake(create=True), log=console.print)
    if format is OutputFormat.json:
        emit_json(done)
