"""What every CLI verb shares: the lake option, the console, and turning user errors into one-line exits."""
from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Annotated, Any

import typer

from spo_lake import __version__
from spo_lake.console import console
from spo_lake.errors import InputError, UserError
from spo_lake.lake import Lake
from spo_lake.tasks import SandboxOptions

DEFAULT_LAKE = "./lake"


class State:
    lake_path: str = os.environ.get("SPOLAKE_LAKE", DEFAULT_LAKE)
    storage_options: dict[str, str] | None = None


STATE = State()


def open_lake(create: bool = False) -> Lake:
    return Lake.open(STATE.lake_path, storage_options=STATE.storage_options, create=create)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Report what users cause as one line on stderr and exit 1: a `UserError` (bad input, option or config, unknown
    snapshot, damaged lake), and the library errors that are about the user's input or files — bad SQL (DuckDB), an
    unreadable lake or input file (deltalake, Arrow, polars, the OS). Anything else is a bug: its traceback, and a
    line asking to report it (`SPOLAKE_DEBUG=1` shows the traceback of user errors too)."""
    import duckdb
    import polars as pl
    import pyarrow as pa
    from deltalake.exceptions import DeltaError

    from spo_lake.lake.errors import delta_message

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (UserError, duckdb.Error, DeltaError, OSError, pa.ArrowException, pl.exceptions.PolarsError) as exc:
            if os.environ.get("SPOLAKE_DEBUG"):
                raise
            msg = str(exc)
            if isinstance(exc, pl.exceptions.PolarsError):  # polars reads the lake's files and does not name them
                msg = f"{msg} (reading the lake at {STATE.lake_path}: `spolake doctor` names damaged files)"
            print(f"error: {delta_message(msg)}", file=sys.stderr)  # one line: no colours, no Rust backtrace
            raise typer.Exit(1) from None
        except (typer.Exit, typer.Abort):  # a command's own chosen exit, already explained
            raise
        except Exception:
            traceback.print_exc()
            print(f"error: a bug in spo-lake {__version__}, not in your input: please report it with the traceback "
                  "above", file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper


def parse_pairs(pairs: list[str] | None, option: str, shape: str) -> dict[str, str]:
    """`KEY=VALUE` items of a repeatable option as a dict (the last one of a key wins)."""
    out = {}
    for p in pairs or []:
        if "=" not in p or not p.split("=", 1)[0].strip():
            raise InputError(f"{option} expects {shape}, got {p!r}")
        key, value = p.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def parse_map(pairs: list[str] | None) -> dict[str, str]:
    return parse_pairs(pairs, "--map", "dst=src")


THREADS_OPTION = typer.Option(None, "--threads", min=1, help="torch threads (default: the cores this process may use)")

# The options of every verb that runs generated code. Defaults are SandboxOptions' own: `timeout_s: TimeoutS =
# SANDBOX_DEFAULTS.timeout_s`, so a default changes in one place.
SANDBOX_DEFAULTS = SandboxOptions()
SANDBOX_HELP = "bwrap (default) or none — none runs generated code UNSANDBOXED on this machine; never on untrusted data"
EXECUTOR_HELP = "local (this process) or ray (Ray workers; same rows as local)"
RAY_ADDRESS_HELP = "the Ray cluster for --executor ray, e.g. ray://head:10001 or auto (default: a new local instance)"
Workers = Annotated[int | None, typer.Option(help="parallel sandboxes (default: cores)")]
TimeoutS = Annotated[float, typer.Option(help="wall-clock limit per test")]
MemoryMb = Annotated[int, typer.Option(help="address-space limit")]
Sandbox = Annotated[str, typer.Option(help=SANDBOX_HELP)]
Executor = Annotated[str, typer.Option(help=EXECUTOR_HELP)]
RayAddress = Annotated[str | None, typer.Option(help=RAY_ADDRESS_HELP)]


def sandbox_options(timeout_s: float, memory_mb: int, sandbox: str) -> SandboxOptions:
    if sandbox not in ("bwrap", "none"):
        raise InputError(f"--sandbox {sandbox!r}: bwrap or none")
    if sandbox == "none":
        console.print("[bold red]WARNING: --sandbox none: generated code runs unsandboxed with your privileges"
                      "[/bold red]")
    return SandboxOptions(timeout_s=timeout_s, memory_mb=memory_mb, mode=sandbox)
