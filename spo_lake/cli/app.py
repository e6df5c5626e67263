"""The `spolake` command line."""
from __future__ import annotations

import atexit
import os
import sys
import traceback
from typing import NoReturn

import typer

from spo_lake.cli import (
    chain_cmds,
    demo_cmds,
    export_cmds,
    ingest_cmds,
    interrupt,
    lake_cmds,
    model_cmds,
    pipeline_cmds,
    report_cmds,
    train_cmds,
    view_cmds,
)
from spo_lake.cli.common import DEFAULT_LAKE, STATE, parse_pairs, user_errors

app = typer.Typer(help="spo-lake: a versioned trajectory lake and Soft Policy Optimization trainer.",
                  no_args_is_help=True, pretty_exceptions_enable=False)


def _show_version(value: bool) -> None:
    if value:
        from spo_lake import __version__

        print(f"spolake {__version__}")
        raise typer.Exit(0)


@app.callback()
@user_errors
def root(lake: str = typer.Option(DEFAULT_LAKE, "--lake", envvar="SPOLAKE_LAKE", help="lake directory or URI"),
         storage_option: list[str] | None = typer.Option(
             None, "--storage-option", envvar="SPOLAKE_STORAGE_OPTIONS", metavar="KEY=VALUE",
             help="object-store option or credential passed to deltalake (repeatable; the environment variable takes "
                  "space-separated KEY=VALUE items; AWS_*/AZURE_*/GOOGLE_* variables are read by deltalake itself)"),
         version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                      help="print the version and exit")) -> None:
    STATE.lake_path = lake
    STATE.storage_options = parse_pairs(storage_option, "--storage-option", "KEY=VALUE") or None


lake_cmds.register(app)
ingest_cmds.register(app)
export_cmds.register(app)
report_cmds.register(app)
pipeline_cmds.register(app)
model_cmds.register(app)
train_cmds.register(app)
chain_cmds.register(app)
demo_cmds.register(app)
view_cmds.register(app)


def exit_code(exc: SystemExit) -> int:
    """The status a SystemExit asks for: None is 0, an int is itself, anything else is printed and is 1."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def main() -> NoReturn:
    """Run `spolake` and leave with exactly the exit code the command chose.

    Python's own interpreter shutdown sometimes aborts (SIGABRT, exit 134: "terminate called without an active
    exception") while polars' and deltalake's native thread pools are torn down. So once the command is done, the
    Python-level exit handlers run and the streams are flushed, then the process leaves through os._exit, which
    skips the native destructors. Ctrl-C: see `interrupt`.
    """
    interrupt.install()
    try:
        app()
        code = 0
    except interrupt.Interrupted:
        interrupt.leave()
    except SystemExit as exc:
        code = exit_code(exc)
    except BaseException:  # an unexpected error: show it, as Python would, and fail
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (e.g. `| head`) has nothing left to flush to
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
