"""Curation verbs: judge, dedup, and `pipeline run` (TOML recipes)."""
from __future__ import annotations

import typer

from spo_lake.cli.common import RunOptions, console, open_lake, run_options, user_errors
from spo_lake.cli.output import DOCUMENT_FORMAT, DocumentFormat, emit_json, show_report


def register(app: typer.Typer) -> None:
    @app.command()
    @user_errors
    @run_options("workers", "timeout_s", "memory_mb", "sandbox", "executor", "ray_address", "format")
    def judge(where: str | None = typer.Option(None, help="SQL filter over trajectories t joined with prompts p"), *,
              opts: RunOptions) -> None:
        """Judge every trajectory its task's verifier has not judged yet in the sandbox (incremental, resumable); `eval`
        is pass@k of a model."""
        from spo_lake.pipelines.judge import judge as run

        report = run(open_lake(), where=where, options=opts.sandbox_options(), workers=opts.workers,
                     executor=opts.executor, ray_address=opts.ray_address)
        show_report(report, opts.format)

    app.command("evaluate", hidden=True, help="The old name of `judge`.")(judge)

    @app.command()
    @user_errors
    def dedup(where: str | None = typer.Option(None, help="SQL filter over trajectories t joined with prompts p"),
              format: DocumentFormat = DOCUMENT_FORMAT) -> None:
        """Group identical programs per prompt (comments/whitespace ignored); raw rows stay."""
        from spo_lake.pipelines.dedup import dedup as run

        show_report(run(open_lake(), where=where), format)

    app.add_typer(pipeline_app, name="pipeline")


pipeline_app = typer.Typer(help="Declarative TOML recipes chaining pipeline steps.")


@pipeline_app.command("run")
@user_errors
def pipeline_run(recipe: str = typer.Argument(..., help="recipe TOML (see pipelines/)"),
                 set_: list[str] = typer.Option(None, "--set", help="override a [vars] entry: name=value"),
                 format: DocumentFormat = DOCUMENT_FORMAT) -> None:
    """Run a recipe's steps in order; each is incremental, so a re-run continues where a crash stopped."""
    from spo_lake.cli.common import parse_pairs
    from spo_lake.pipelines.recipe import load_recipe, run_recipe

    loaded = load_recipe(recipe, parse_pairs(set_, "--set", "name=value"))
    done = run_recipe(loaded, open_lake(create=True), log=console.print)
    if format == "json":
        emit_json(done)
