"""Ingest: validate a whole input, then commit it (prompts, evaluations, trajectories — trajectories last).

Ids are content-derived, so re-ingesting the same input is a no-op; identical responses sampled twice stay two rows
(they count in Monte-Carlo estimates) because the id includes the occurrence number within the input.
A crash between commits leaves only facts no trajectory references yet; a retry re-uses them.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from spo_lake.ingest.readers import IngestError, Located, is_parquet, read_parquet, read_records
from spo_lake.ingest.records import (
    PROMPT_FIELDS, TRAJECTORY_FIELDS, Batch, from_arrow, from_records, rename, validate_prompts, validate_trajectories,
)
from spo_lake.lake import Lake
from spo_lake.tasks.normalize import response_hash


@dataclass(frozen=True)
class IngestReport:
    new: int
    present: int
    prompts_new: int = 0
    evaluations_new: int = 0

    def summary(self) -> str:
        extra = f"; {self.prompts_new} new prompts" if self.prompts_new else ""
        extra += f"; {self.evaluations_new} imported verdicts" if self.evaluations_new else ""
        return f"{self.new} new, {self.present} already present{extra}"


def load_batch(path: str, fields: dict[str, str], what: str, mapping: dict[str, str] | None = None,
               hf_split: str | None = None) -> Batch:
    mapping = mapping or {}
    if hf_split is None and is_parquet(path):
        from pathlib import Path

        table = read_parquet(Path(path))
        if table.num_rows == 0:
            raise IngestError(f"{path}: no records")
        inverse = {src: dst for dst, src in mapping.items()}
        return from_arrow(table.rename_columns([inverse.get(c, c) for c in table.column_names]), fields, path, what)
    return from_records(rename(read_records(path, hf_split), mapping), fields, what)


def located(records: Iterable[dict[str, Any]], origin: str) -> list[Located]:
    return [Located(f"{origin}:record {i + 1}", r) for i, r in enumerate(records)]


# ---- prompts ----------------------------------------------------------------------------------------------------
def add_prompts(lake: Lake, batch: Batch) -> IngestReport:
    """Add prompt rows. A prompt_id already in the lake must carry identical content (rows are immutable)."""
    validate_prompts(batch)
    t = batch.table
    existing = _existing_prompts(lake, t.column("prompt_id").to_pylist())
    keep = []
    for i, row in enumerate(t.to_pylist()):
        old = existing.get(row["prompt_id"])
        if old is None:
            keep.append(i)
        elif (old["task"], old["prompt"], _canon(old["tests"])) != (row["task"], row["prompt"], _canon(row["tests"])):
            raise IngestError(f"{batch.where(i)}: field 'prompt_id': {row['prompt_id']!r} is already in the lake "
                              "with different task/prompt/tests (prompts are immutable; use a new id)")
    lake.append("prompts", t.take(keep))
    return IngestReport(new=len(keep), present=t.num_rows - len(keep))


def _canon(tests: str | None) -> Any:
    return None if tests is None else json.loads(tests)


def _existing_prompts(lake: Lake, ids: list[str]) -> dict[str, dict[str, Any]]:
    df = lake.read("prompts").filter(pl.col("prompt_id").is_in(list(set(ids)))).select("prompt_id", "task", "prompt", "tests").collect()
    return {r["prompt_id"]: r for r in df.to_dicts()}


# ---- trajectories -----------------------------------------------------------------------------------------------
def ingest_trajectories(lake: Lake, batch: Batch, *, source: str | None = None, task: str | None = None,
                        defaults: dict[str, Any] | None = None) -> IngestReport:
    """Validate `batch` fully, then commit its new prompts, imported verdicts and trajectories.

    `source` fills rows without one; `defaults` (model, run_id, tokenizer, temperature, top_p) fill missing fields;
    `task` is used to create prompts from a `prompt` field when rows carry no `task`.
    """
    t = _fill(batch.table, {"source": source, **(defaults or {})})
    batch = Batch(t, batch.where)
    validate_trajectories(batch)
    ids = _trajectory_ids(t)
    _check_unique_given_ids(batch, ids)

    new_prompts = _prompts_to_create(lake, batch, task)
    present = set(lake.read("trajectories").select("trajectory_id")
                  .filter(pl.col("trajectory_id").is_in(ids)).collect().get_column("trajectory_id").to_list())
    new_mask = pa.array([i not in present for i in ids])
    new = t.filter(new_mask)
    new_ids = pa.array(ids).filter(new_mask)
    trajectories = pa.table({
        "trajectory_id": new_ids,
        "prompt_id": new.column("prompt_id"),
        "source": new.column("source"),
        "model_id": new.column("model"),
        "run_id": new.column("run_id"),
        "policy_version": new.column("policy_version"),
        "temperature": new.column("temperature"),
        "top_p": new.column("top_p"),
        "response_text": new.column("response"),
        "token_ids": new.column("token_ids"),
        "behavior_logprobs": new.column("logprobs"),
        "tokenizer_id": new.column("tokenizer"),
        "response_hash": pa.array([response_hash(r) for r in new.column("response").to_pylist()], pa.string()),
        "metadata": new.column("metadata"),
    })
    evaluations = _imported_verdicts(lake, new_ids, new.column("reward"))
    lake.append_many({"prompts": new_prompts, "evaluations": evaluations, "trajectories": trajectories})
    return IngestReport(new=new.num_rows, present=t.num_rows - new.num_rows,
                        prompts_new=new_prompts.num_rows, evaluations_new=evaluations.num_rows)


def _fill(t: pa.Table, values: dict[str, Any]) -> pa.Table:
    for name, value in values.items():
        if value is None or name not in t.column_names:
            continue
        col = t.column(name)
        t = t.set_column(t.column_names.index(name), name, pc.fill_null(col, pa.scalar(value, col.type)))
    return t


def _trajectory_ids(t: pa.Table) -> list[str]:
    given = t.column("trajectory_id").to_pylist()
    keys = zip(*(t.column(c).to_pylist() for c in ("prompt_id", "source", "model", "run_id", "response")))
    seen: Counter = Counter()
    ids = []
    for g, key in zip(given, keys):
        if g is not None:
            ids.append(g)
            continue
        occurrence = seen[key]
        seen[key] += 1
        blob = json.dumps([*key, occurrence], ensure_ascii=False).encode()
        ids.append(hashlib.blake2b(blob, digest_size=16).hexdigest())
    return ids


def _check_unique_given_ids(batch: Batch, ids: list[str]) -> None:
    first: dict[str, int] = {}
    for i, tid in enumerate(ids):
        if tid in first:
            raise IngestError(f"{batch.where(i)}: field 'trajectory_id': duplicate {tid!r} (first at {batch.where(first[tid])})")
        first[tid] = i


def _prompts_to_create(lake: Lake, batch: Batch, task: str | None) -> pa.Table:
    t = batch.table
    pids = t.column("prompt_id").to_pylist()
    existing = set(_existing_prompts(lake, pids))
    texts, tasks = t.column("prompt").to_pylist(), t.column("task").to_pylist()
    rows: dict[str, dict[str, Any]] = {}
    for i, pid in enumerate(pids):
        if pid in existing:
            continue
        if texts[i] is None:
            if pid in rows:
                continue
            raise IngestError(f"{batch.where(i)}: field 'prompt_id': {pid!r} is not in the lake; add it with "
                              "`spolake prompts add` or give a 'prompt' field")
        row_task = tasks[i] or task
        if row_task is None:
            raise IngestError(f"{batch.where(i)}: field 'task': needed to create prompt {pid!r} (or pass --task)")
        if pid in rows and rows[pid]["prompt"] != texts[i]:
            raise IngestError(f"{batch.where(i)}: field 'prompt': differs from an earlier row of prompt {pid!r}")
        rows.setdefault(pid, {"prompt_id": pid, "task": row_task, "prompt": texts[i]})
    return pa.Table.from_pylist(list(rows.values()), schema=pa.schema([("prompt_id", pa.string()), ("task", pa.string()), ("prompt", pa.string())]))


def _imported_verdicts(lake: Lake, ids: pa.Array, reward: pa.ChunkedArray) -> pa.Table:
    has = pc.is_valid(reward)
    ids, reward = ids.filter(has), reward.filter(has)
    done = set(lake.read("evaluations").filter((pl.col("verifier") == "imported") & pl.col("trajectory_id").is_in(ids.to_pylist()))
               .select("trajectory_id").collect().get_column("trajectory_id").to_list())
    keep = pa.array([i not in done for i in ids.to_pylist()], pa.bool_())
    ids, reward = ids.filter(keep), reward.filter(keep)
    return pa.table({
        "trajectory_id": ids,
        "verifier": pa.array(["imported"] * len(ids), pa.string()),
        "passed": pc.greater_equal(reward, 0.0),
        "reward": reward,
        "verdict": pa.array(["imported"] * len(ids), pa.string()),
    })
