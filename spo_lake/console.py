"""Where progress and messages go: one stderr console (stdout stays for results), shared by every layer."""
from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True, soft_wrap=True)  # one message, one line: scripts parse them


def progress_bar(*extra: str, disable: bool = False) -> Progress:
    """A rich progress bar on stderr; `extra` names fields shown after the bar (e.g. 'pass_rate')."""
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn()]
    columns += [TextColumn(f"{name}={{task.fields[{name}]}}") for name in extra]
    return Progress(*columns, console=console, disable=disable, transient=False)
