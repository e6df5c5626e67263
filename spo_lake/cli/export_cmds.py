"""`spolake export`: a selection at a snapshot, shaped for TRL / `datasets` (library: `spo_lake.exports`)."""
from __future__ import annotations

from pathlib import Path

import typer

from spo_lake.cli.common import console, open_lake, user_errors
from spo_lake.exports import ExportFormat, Shape


def register(app: typer.Typer) -> None:
    @app.command()
    @user_errors
    def export(snapshot: str = typer.Option(..., help="snapshot to read"),
               query: str | None = typer.Option(None, help="SQL selecting the rows (raw), or the trajectory_id "
                                                   "(sft, dpo) / prompt_id (prompt) of the rows to shape"),
               shape: Shape = typer.Option(Shape.raw, help="raw rows; sft: prompt + completion; dpo: prompt + chosen "
                                           "+ rejected pairs; prompt: one row per prompt for a reward function; "
                                           "verl-rl / verl-sft: verl's RL / SFT Parquet (docs/interop.md)"),
               chat: bool = typer.Option(False, "--chat", help="prompts and answers as {role, content} messages"),
               format: ExportFormat = typer.Option(ExportFormat.parquet, "--format",
                                                   help="parquet, jsonl or hf (a datasets save_to_disk directory)"),
               out: Path = typer.Option(..., help="output path")) -> None:
        """Export a selection at a snapshot as Parquet, JSONL or a `datasets` dataset, shaped for TRL.

        sft rows default to trajectories that passed; dpo pairs the i-th passing with the i-th failing trajectory of
        each prompt (distinct responses, ordered by trajectory_id); the provenance (snapshot, versions, query,
        shape) travels with the file. Load the hf output with datasets.load_from_disk(OUT).
        """
        from spo_lake.exports import export as build

        with console.status("exporting"):
            result = build(open_lake(), snapshot, shape, query, chat)
            result.write(out, format)
        console.print(f"exported {result.table.num_rows} rows ({shape.value}) to {out}")
