"""Ingest from Python: any input a notebook holds (a file, a `datasets.Dataset`, an Arrow table, a polars DataFrame,
a list of dicts), through the same reshaping and validation as `spolake ingest`."""
from __future__ import annotations

import os
from typing import Any, TypeAlias

import pyarrow as pa

from spo_lake.errors import InputError
from spo_lake.ingest.core import (
    BATCH_ROWS,
    Batches,
    IngestReport,
    add_prompts,
    ingest_trajectories,
    load_batch,
    load_batches,
)
from spo_lake.ingest.readers import IngestError, Located
from spo_lake.ingest.records import PROMPT_FIELDS, TRAJECTORY_FIELDS, CheckedRows
from spo_lake.ingest.shapes import ExtraFields, RewardMap, Shaping, shaped_batch, typed_batch
from spo_lake.lake import Lake

# Any: a datasets.Dataset or polars DataFrame
Input: TypeAlias = str | os.PathLike | list[dict[str, Any]] | pa.Table | Any


def read_input(data: Input, fields: dict[str, str], what: str, *, mapping: dict[str, str] | None = None,
               split: str | None = None, extra: ExtraFields | str = ExtraFields.metadata,
               reward_map: RewardMap | str | None = None) -> CheckedRows:
    """Reshape and type-check an input. A string or path is a file (JSONL, JSONL.gz, Parquet, CSV), or with `split` a
    Hugging Face dataset name or save_to_disk directory; errors name the row as `input:row N`."""
    extra = ExtraFields(extra)
    reward_map = RewardMap.parse(reward_map) if isinstance(reward_map, str) else reward_map
    if isinstance(data, (str, os.PathLike)):
        return load_batch(str(data), fields, what, mapping, split, extra, reward_map)
    shaping = Shaping(fields, what, extra, reward_map)
    if isinstance(data, list):
        inverse = {src: dst for dst, src in (mapping or {}).items()}
        rows = (Located(f"input:row {i + 1}", {inverse.get(k, k): v for k, v in r.items()}) for i, r in enumerate(data))
        return shaped_batch(rows, shaping)
    table = _arrow(data)
    if table.num_rows == 0:
        raise IngestError("input: no records")
    return typed_batch(table, "input", shaping, mapping)


def _arrow(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if hasattr(data, "with_format"):  # datasets.Dataset: respects selections and shuffles, unlike .data
        return data.with_format("arrow")[:]
    if hasattr(data, "to_arrow"):  # polars
        return data.to_arrow()
    raise TypeError(f"cannot ingest a {type(data).__name__}: give a path, a list of dicts, a pyarrow Table, a "
                    "datasets.Dataset or a polars DataFrame")


def _lake(lake: Lake | str | os.PathLike) -> Lake:
    return lake if isinstance(lake, Lake) else Lake.open(lake, create=True)


def ingest(lake: Lake | str | os.PathLike, data: Input, *, source: str = "import", task: str | None = None,
           model: str | None = None, run_id: str | None = None, tokenizer: str | None = None,
           mapping: dict[str, str] | None = None, split: str | None = None,
           extra: ExtraFields | str = ExtraFields.metadata, reward_map: RewardMap | str | None = None,
           batch_rows: int = BATCH_ROWS) -> IngestReport:
    """Ingest trajectories: validate the whole input, then commit it; re-ingesting the same input is a no-op.
    A file is streamed `batch_rows` rows at a time (memory bounded by that, not by the file).

    `data`: a file path (JSONL, JSONL.gz, Parquet, CSV; a Hugging Face dataset with `split`), a list of dicts, a
    pyarrow Table, a datasets.Dataset or a polars DataFrame, in any shape `spo_lake.ingest.shapes` accepts
    (prompt/completion, conversational messages, chosen/rejected pairs). `source`, `model`, `run_id`, `tokenizer`
    fill rows that lack them; `task` creates prompts from a `prompt` field; `mapping` renames {field: input column};
    `extra` keeps unknown columns in metadata, drops them or refuses them; `reward_map` ("1=0,0=-1" or "binary")
    maps another reward convention to the lake's 0/-1. Raises IngestError (one line naming row and field).
    """
    from spo_lake.ingest.records import SOURCES

    if source not in SOURCES:
        raise InputError(f"source {source!r}: unknown (one of {', '.join(SOURCES)})")
    batches: Batches
    if isinstance(data, (str, os.PathLike)):
        extra = ExtraFields(extra)
        rewards = RewardMap.parse(reward_map) if isinstance(reward_map, str) else reward_map
        batches = lambda: load_batches(str(data), TRAJECTORY_FIELDS, "trajectories", mapping, split,  # noqa: E731
                                       extra, rewards, batch_rows)
    else:
        batches = read_input(data, TRAJECTORY_FIELDS, "trajectories", mapping=mapping, split=split, extra=extra,
                             reward_map=reward_map)
    return ingest_trajectories(_lake(lake), batches, source=source, task=task,
                               defaults={"model": model, "run_id": run_id, "tokenizer": tokenizer})


def ingest_prompts(lake: Lake | str | os.PathLike, data: Input, *, mapping: dict[str, str] | None = None,
                   split: str | None = None, extra: ExtraFields | str = ExtraFields.metadata) -> IngestReport:
    """Add problems (prompt_id, task, prompt, tests, limits, metadata) from any input `ingest` takes; a prompt
    already in the lake must be identical (prompts are immutable)."""
    return add_prompts(_lake(lake), read_input(data, PROMPT_FIELDS, "prompts", mapping=mapping, split=split,
                                               extra=extra))


__all__ = ["Input", "ingest", "ingest_prompts", "read_input"]
