"""What every CLI verb shares: the lake option, the console, turning user errors into one-line exits, and the
options of the verbs that run a model or generated code (`RunOptions`)."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from typing import Annotated, Any, get_type_hints

import typer

from spo_lake import __version__
from spo_lake.cli.output import DOCUMENT_HELP, DocumentFormat
from spo_lake.console import console, quiet_foreign_bars
from spo_lake.errors import InputError, UserError
from spo_lake.lake import Lake
from spo_lake.tasks import SandboxOptions

DEFAULT_LAKE = "./lake"
quiet_foreign_bars()  # before any verb imports transformers (and with it tqdm)


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
        for name, value in kwargs.items():  # bytes that are not UTF-8 arrive as lone surrogates: no value can hold them
            if any(isinstance(v, str) and not _is_text(v) for v in (value if isinstance(value, list) else [value])):
                print(f"error: --{name.replace('_', '-')}: not valid UTF-8 text", file=sys.stderr)
                raise typer.Exit(1)
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


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_pairs(pairs: list[str] | None, option: str, shape: str) -> dict[str, str]:
    """`KEY=VALUE` items of a repeatable option as a dict (the last one of a key wins)."""
    out = {}
    for p in pairs or []:
        if "=" not in p or not p.split("=", 1)[0].strip():
            raise InputError(f"{option} expects {shape}, got {p!r}")
        key, value = p.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def parse_ks(k: str) -> tuple[int, ...]:
    """`--k 1,10`: the k values of pass@k, each a positive integer."""
    try:
        ks = tuple(int(x) for x in k.split(",") if x.strip())
    except ValueError:
        ks = ()
    if not ks or min(ks) < 1:
        raise InputError(f"--k {k!r}: expected comma-separated positive integers such as 1,10")
    return ks


def check_device(device: str | None, what: str = "--device") -> None:
    """A device torch can name (auto, cpu, cuda, cuda:1, ...): a typo fails here as one line, not deep inside torch."""
    if device in (None, "auto"):
        return
    import torch

    try:
        torch.device(device)
    except RuntimeError:
        raise InputError(f"{what} {device!r}: not a device; auto, cpu, cuda, cuda:1, ...") from None


def parse_map(pairs: list[str] | None) -> dict[str, str]:
    return parse_pairs(pairs, "--map", "dst=src")


# The options the verbs that run a model or generated code share, each declared once. Sandbox defaults are
# SandboxOptions' own, so a default changes in one place.
SANDBOX_DEFAULTS = SandboxOptions()
SANDBOX_HELP = "bwrap (default) or none — none runs generated code UNSANDBOXED on this machine; never on untrusted data"
EXECUTOR_HELP = "local (this process) or ray (Ray workers; same rows as local)"
RAY_ADDRESS_HELP = "the Ray cluster for --executor ray, e.g. ray://head:10001 or auto (default: a new local instance)"
Threads = Annotated[int | None, typer.Option("--threads", min=1,
                                             help="torch threads (default: the cores this process may use)")]
Seed = Annotated[int, typer.Option(help="sampling seed")]
GenerationBatch = Annotated[int, typer.Option(min=1, help="responses per generation batch")]
Device = Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when available)")]
ModelId = Annotated[str | None, typer.Option("--model-id", help="record and reuse the lake's rows under this model id "
                                             "instead of the model's own (e.g. an id an older lake holds for it)")]
Workers = Annotated[int | None, typer.Option(min=1, help="parallel sandboxes (default: cores)")]
TimeoutS = Annotated[float, typer.Option(help="wall-clock limit per test")]
MemoryMb = Annotated[int, typer.Option(help="address-space limit")]
Sandbox = Annotated[str, typer.Option(help=SANDBOX_HELP)]
Executor = Annotated[str, typer.Option(help=EXECUTOR_HELP)]
RayAddress = Annotated[str | None, typer.Option(help=RAY_ADDRESS_HELP)]
Format = Annotated[DocumentFormat, typer.Option("--format", help=DOCUMENT_HELP)]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The trailing options of the verbs that run a model or generated code (sample, q0, pts, refprobs, judge):
    `run_options` adds them to a verb and hands them to it as one `opts`."""
    seed: Seed = 0
    batch: GenerationBatch = 64
    device: Device = None
    threads: Threads = None
    workers: Workers = None
    timeout_s: TimeoutS = SANDBOX_DEFAULTS.timeout_s
    memory_mb: MemoryMb = SANDBOX_DEFAULTS.memory_mb
    sandbox: Sandbox = SANDBOX_DEFAULTS.mode
    model_id: ModelId = None
    executor: Executor = "local"
    ray_address: RayAddress = None
    format: Format = "table"

    def sandbox_options(self) -> SandboxOptions:
        return sandbox_options(self.timeout_s, self.memory_mb, self.sandbox)


def run_options(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a verb RunOptions' options (all, or the ones named), listed after its own, and call it with their values
    as `opts` (an option not given to the verb keeps RunOptions' default)."""
    hints = get_type_hints(RunOptions, include_extras=True)
    fields = [f for f in dataclasses.fields(RunOptions) if not names or f.name in names]

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "opts"]
        shared = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                    annotation=hints[f.name]) for f in fields]

        @functools.wraps(fn)
        def verb(**kwargs: Any) -> Any:
            opts = RunOptions(**{f.name: kwargs.pop(f.name) for f in fields})
            return fn(**kwargs, opts=opts)

        # what typer reads: the verb's own parameters, then the shared ones
        verb.__signature__ = inspect.Signature([*own, *shared])  # type: ignore[attr-defined]
        verb.__annotations__ = {p.name: p.annotation for p in [*own, *shared]}
        return verb

    return decorate


def sandbox_options(timeout_s: float, memory_mb: int, sandbox: str) -> SandboxOptions:
    if sandbox not in ("bwrap", "none"):
        raise InputError(f"--sandbox {sandbox!r}: bwrap or none")
    if sandbox == "none":
        console.print("[bold red]WARNING: --sandbox none: generated code runs unsandboxed with your privileges"
                      "[/bold red]")
    return SandboxOptions(timeout_s=timeout_s, memory_mb=memory_mb, mode=sandbox)
