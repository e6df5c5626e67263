"""The `spolake` command line."""
from __future__ import annotations

import typer

from spo_lake.cli import demo_cmds, ingest_cmds, lake_cmds, model_cmds, pipeline_cmds, train_cmds
from spo_lake.cli.common import DEFAULT_LAKE, STATE

app = typer.Typer(help="spo-lake: a versioned trajectory lake and Soft Policy Optimization trainer.",
                  no_args_is_help=True, pretty_exceptions_enable=False)


@app.callback()
def root(lake: str = typer.Option(DEFAULT_LAKE, "--lake", envvar="SPOLAKE_LAKE", help="lake directory or URI")) -> None:
    STATE.lake_path = lake


lake_cmds.register(app)
ingest_cmds.register(app)
pipeline_cmds.register(app)
model_cmds.register(app)
train_cmds.register(app)
demo_cmds.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
