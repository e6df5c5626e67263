"""Where progress and messages go: one stderr console (stdout stays for results), shared by every layer.

Output reads well anywhere: a table goes to a terminal drawn, and to a pipe or file as a Markdown table with every
cell in full (a drawn table is cut to 80 columns there: `0.0…`); progress bars draw frames only on a terminal
(rich's own bars do not animate elsewhere, and `quiet_foreign_bars` stops other libraries' tqdm bars from writing
`\\r` frames into a log)."""
from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

console = Console(stderr=True, soft_wrap=True)  # one message, one line: scripts parse them


def progress_bar(*extra: str, disable: bool = False) -> Progress:
    """A rich progress bar on stderr; `extra` names fields shown after the bar (e.g. 'pass_rate')."""
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn()]
    columns += [TextColumn(f"{name}={{task.fields[{name}]}}") for name in extra]
    return Progress(*columns, console=console, disable=disable, transient=False)


def quiet_foreign_bars() -> None:
    """When stderr is not a terminal, turn off the tqdm bars of the libraries we call (transformers' GGUF
    de-quantizing, huggingface_hub): tqdm writes a `\\r` frame per update to any stream. tqdm reads TQDM_DISABLE when
    it is first imported, so this runs before it is (the CLI calls it at start-up); a value the user set wins."""
    if not console.is_terminal:
        os.environ.setdefault("TQDM_DISABLE", "1")


def print_table(table: Table) -> None:
    """`table` on stdout: drawn on a terminal, else as a Markdown table with every cell in full."""
    out = Console()
    if out.is_terminal:
        out.print(table)
    else:
        sys.stdout.write(markdown_table(table) + "\n")  # a blank line ends a Markdown table
        sys.stdout.flush()


def markdown_table(table: Table) -> str:
    """`table` as GitHub-flavoured Markdown: its title, a header row, one line per row, cells as plain text."""
    headers = [_plain(c.header) for c in table.columns]
    rows = list(zip(*[[_plain(cell) for cell in c.cells] for c in table.columns]))
    right = ["---:" if c.justify == "right" else "---" for c in table.columns]
    lines = [f"**{_plain(table.title)}**", ""] if table.title else []
    lines += ["| " + " | ".join(cells) + " |" for cells in [headers, right, *rows]]
    return "\n".join(lines) + "\n"


def _plain(cell: object) -> str:
    text = cell.plain if isinstance(cell, Text) else str(cell)  # a str cell is data: its brackets are not markup
    return text.replace("|", "\\|").replace("\n", " ")
