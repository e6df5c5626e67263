"""Ingest verbs: `ingest` (trajectories) and `prompts add` (files or built-in dataset loaders)."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import typer

from spo_lake.cli.common import (
    console,
    open_lake,
    parse_map,
    user_errors,
)
from spo_lake.cli.output import DOCUMENT_FORMAT, DocumentFormat, emit_json
from spo_lake.errors import InputError
from spo_lake.ingest import PROMPT_FIELDS, TRAJECTORY_FIELDS, add_prompts, ingest_trajectories, load_batch
from spo_lake.ingest.core import BATCH_ROWS, IngestReport, load_batches
from spo_lake.ingest.datasets import DATASETS, ingest_dataset
from spo_lake.ingest.frameworks import FORMATS, Dump, DumpCounts, detect
from spo_lake.ingest.records import SOURCES
from spo_lake.ingest.shapes import REWARD_CONVENTIONS, TRAJECTORY_FIELD_DOCS, ExtraFields, RewardMap

prompts_app = typer.Typer(help="Problems: add from files or built-in dataset loaders.")

INGEST_HELP = ("Ingest trajectory records; validates everything before one commit; re-ingest is a no-op. Streams: "
               "memory stays bounded by --batch-rows whatever the input's size.\n\n"
               "Fields (one record per line of JSONL, a row of Parquet/CSV/a dataset; example: examples/samples.jsonl):"
               "\n\n" + "\n".join(f"  {name}: {doc}" for name, doc in TRAJECTORY_FIELD_DOCS.items()))
CONVENTIONS = ", ".join(f"{name} ({pairs})" for name, pairs in REWARD_CONVENTIONS.items())
EXTRA_HELP = "unknown input fields: metadata (keep them there), drop, or error"


def report_json(path: str | None, report: IngestReport) -> dict:
    return {"path": path, "new": report.new, "present": report.present, "prompts_new": report.prompts_new,
            "evaluations_new": report.evaluations_new}


def register(app: typer.Typer) -> None:
    @app.command(help=INGEST_HELP)
    @user_errors
    def ingest(path: str = typer.Argument(..., help="JSONL(.gz), Parquet, CSV file, a dataset with --hf, or a "
                                                    "trainer's rollout dump (a directory, or a file with --from)"),
               dump_format: str | None = typer.Option(
                   None, "--from", help=f"PATH is a rollout dump of: {', '.join(FORMATS)} (default for a directory: "
                                        "the one format that fits; see docs/interop.md)"),
               reward_column: str | None = typer.Option(None, help="--from trl: the reward function column to "
                                                                   "record (default: the only one)"),
               source: str = typer.Option("import", help=f"one of: {', '.join(SOURCES)}"),
               map: list[str] = typer.Option(None, "--map", help="rename input columns: dst=src (repeatable)"),
               task: str | None = typer.Option(None, help="task for prompts created from a 'prompt' field"),
               model: str | None = typer.Option(None, help="model id for rows without 'model_id'"),
               run_id: str | None = typer.Option(None, help="run id for rows without 'run_id'"),
               tokenizer: str | None = typer.Option(None, help="tokenizer id for rows without 'tokenizer_id'"),
               reward_map: str | None = typer.Option(
                   None, help="map input rewards to the lake's 0 (pass) / -1 (fail): input=lake pairs such as "
                              "1=0,0=-1, a threshold for float scores such as >=0.5 (pass at or above it), or a "
                              f"convention: {CONVENTIONS}"),
               extra: ExtraFields = typer.Option(ExtraFields.metadata, help=EXTRA_HELP),
               hf: bool = typer.Option(False, "--hf", help="PATH is a Hugging Face dataset name or save_to_disk dir"),
               split: str = typer.Option("train", help="dataset split with --hf"),
               batch_rows: int = typer.Option(BATCH_ROWS, help="rows validated and staged at a time (memory grows "
                                                               "with it, not with the input)"),
               format: DocumentFormat = DOCUMENT_FORMAT) -> None:
        if source not in SOURCES:
            raise InputError(f"--source {source!r}: unknown (one of {', '.join(SOURCES)})")
        rewards = RewardMap.parse(reward_map) if reward_map else None
        mapping = parse_map(map)
        if dump_format is None and not hf and Path(path).is_dir():
            dump_format = detect(path)
        if dump_format is not None and dump_format not in FORMATS:
            raise InputError(f"--from {dump_format!r}: one of {', '.join(FORMATS)}")
        dump = Dump(dump_format, reward_column, run_id) if dump_format is not None else None
        counts = DumpCounts()

        def batches():
            nonlocal counts
            counts = DumpCounts()  # read afresh when the plan is redone under the lock
            return load_batches(path, TRAJECTORY_FIELDS, "trajectories", mapping, split if hf else None, extra,
                                rewards, batch_rows, dump, counts)

        next(iter(batches()))  # a missing, empty or unreadable input fails before a lake is created
        lake = open_lake(create=True)
        with console.status(f"validating and writing {path}"):
            report = ingest_trajectories(lake, batches, source=source, task=task,
                                         defaults={"model": model, "run_id": run_id, "tokenizer": tokenizer})
        if format == "json":
            emit_json(report_json(path, report) | ({"dump": dump_format, **asdict(counts)} if dump else {}))
        held = f"; {counts.summary()}" if counts.summary() else ""
        console.print(f"{path}: {report.summary()}{held}")

    @prompts_app.command("add")
    @user_errors
    def prompts_add(path: str | None = typer.Argument(None, help="prompt records file, or dataset path/name"),
                    dataset: str | None = typer.Option(None, help=f"built-in loader: {', '.join(DATASETS)}"),
                    n: int | None = typer.Option(None, min=1, help="countdown, pyfunc: number of problems"),
                    seed: int | None = typer.Option(None, help="countdown, pyfunc: generator seed"),
                    limit: int | None = typer.Option(None, min=1, help="load at most this many problems"),
                    map: list[str] = typer.Option(None, "--map", help="rename input columns: dst=src"),
                    extra: ExtraFields = typer.Option(ExtraFields.metadata, help=EXTRA_HELP),
                    format: DocumentFormat = DOCUMENT_FORMAT) -> None:
        """Add problems (with tests) from a file, or a dataset with its human solutions."""
        if dataset:
            with console.status(f"loading {dataset}"):
                p, t = ingest_dataset(open_lake(create=True), dataset, path, n=n, seed=seed, limit=limit)
            if format == "json":
                emit_json({"dataset": dataset, "prompts": report_json(path, p), "solutions": report_json(path, t)})
            console.print(f"{dataset}: prompts {p.summary()}; human solutions {t.summary()}")
            return
        if path is None:
            raise InputError("give a prompt records FILE or --dataset NAME")
        with console.status(f"reading and validating {path}"):
            batch = load_batch(path, PROMPT_FIELDS, "prompts", parse_map(map), extra=extra)
            report = add_prompts(open_lake(create=True), batch)
        if format == "json":
            emit_json(report_json(path, report))
        console.print(f"{path}: {report.summary()}")

    app.add_typer(prompts_app, name="prompts")
