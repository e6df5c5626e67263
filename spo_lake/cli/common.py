"""What every CLI verb shares: the lake option, the console, and turning user errors into one-line exits."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
from enum import Enum
from typing import Any, Callable

import typer

from spo_lake.console import console
from spo_lake.lake import Lake

DEFAULT_LAKE = "./lake"


class State:
    lake_path: str = os.environ.get("SPOLAKE_LAKE", DEFAULT_LAKE)
    storage_options: dict[str, str] | None = None


STATE = State()


def open_lake(create: bool = False) -> Lake:
    return Lake.open(STATE.lake_path, storage_options=STATE.storage_options, create=create)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Report user mistakes (bad input, unknown snapshot, bad SQL) as one line on stderr and exit 1."""
    import duckdb
    import polars as pl
    import pyarrow as pa
    from deltalake.exceptions import DeltaError

    from spo_lake.ingest import IngestError
    from spo_lake.lake import ContractError, LakeError
    from spo_lake.lake.errors import delta_message

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (IngestError, LakeError, ContractError, KeyError, ValueError, duckdb.Error, DeltaError, OSError,
                pa.ArrowException, pl.exceptions.PolarsError) as exc:
            if os.environ.get("SPOLAKE_DEBUG"):
                raise
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            if isinstance(exc, pl.exceptions.PolarsError):  # polars reads the lake's files and does not name them
                msg = f"{msg} (reading the lake at {STATE.lake_path}: `spolake doctor` names damaged files)"
            print(f"error: {delta_message(msg)}", file=sys.stderr)  # one line: no colours, no Rust backtrace
            raise typer.Exit(1) from None

    return wrapper


def parse_pairs(pairs: list[str] | None, option: str, shape: str) -> dict[str, str]:
    """`KEY=VALUE` items of a repeatable option as a dict (the last one of a key wins)."""
    out = {}
    for p in pairs or []:
        if "=" not in p or not p.split("=", 1)[0].strip():
            raise ValueError(f"{option} expects {shape}, got {p!r}")
        key, value = p.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def parse_map(pairs: list[str] | None) -> dict[str, str]:
    return parse_pairs(pairs, "--map", "dst=src")


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


FORMAT_OPTION = typer.Option(OutputFormat.table, "--format", help="table (for people) or json (one object on stdout)")
THREADS_OPTION = typer.Option(None, "--threads", min=1, help="torch threads (default: the cores this process may use)")


def emit_json(data: Any) -> None:
    """A verb's result as one JSON document on stdout (what `--format json` prints); NaN and inf become null."""
    sys.stdout.write(json.dumps(_finite(data), default=str, ensure_ascii=False, allow_nan=False) + "\n")


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def show_report(report: Any, format: OutputFormat) -> None:
    """A pipeline step's report: its summary line on stderr and, with --format json, its fields on stdout."""
    if format is OutputFormat.json:
        emit_json(dataclasses.asdict(report) | {"summary": report.summary()})
    console.print(report.summary())
