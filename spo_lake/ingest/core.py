"""Ingest: validate and stage an input batch by batch, then commit it (prompts, evaluations, trajectories — trajectories
last, one commit per table): all or nothing, in memory bounded by the batch size, whatever the input's size.

Ids are content-derived, so re-ingesting the same input is a no-op; identical responses sampled twice stay two rows
(they count in Monte-Carlo estimates) because a repeat's id includes its occurrence number within the input.
New rows are staged (written, uncommitted) under a write lease, so vacuum leaves them alone and a failure deletes
them; they are committed under the lake lock, re-planned there if another writer changed the trajectories or prompts
meanwhile, so overlapping ingests cannot both add a row. A crash between commits leaves only facts no trajectory
references yet (new prompts, imported verdicts); a retry re-uses them.
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from spo_lake.errors import InputError
from spo_lake.ingest.frameworks import Dump, DumpCounts, dump_records
from spo_lake.ingest.ids import SeenIds, adopt_unattributed, response_digests, trajectory_ids
from spo_lake.ingest.readers import (
    IngestError,
    Located,
    is_parquet,
    read_hf,
    read_parquet,
    read_parquet_batches,
    read_records,
)
from spo_lake.ingest.records import CheckedRows, rename
from spo_lake.ingest.rules import validate_prompts, validate_trajectories
from spo_lake.ingest.shapes import ExtraFields, RewardMap, Shaping, formatted_prompt, shaped_batch, typed_batch
from spo_lake.lake import Lake, Staged
from spo_lake.lake.inflight import Lease

BATCH_ROWS = 20_000  # rows validated and staged at a time: sets the memory ceiling (docs/performance.md)


@dataclass(frozen=True)
class IngestReport:
    """What an ingest did: rows added, rows already there, prompts and imported verdicts it created."""

    new: int
    present: int
    prompts_new: int = 0
    evaluations_new: int = 0

    def summary(self) -> str:
        """One line: "N new, M already present" and what else the ingest added."""
        extra = f"; {self.prompts_new} new prompts" if self.prompts_new else ""
        extra += f"; {self.evaluations_new} imported verdicts" if self.evaluations_new else ""
        return f"{self.new} new, {self.present} already present{extra}"


def load_batch(path: str, fields: dict[str, str], what: str, mapping: dict[str, str] | None = None,
               hf_split: str | None = None, extra: ExtraFields = ExtraFields.metadata,
               reward_map: RewardMap | None = None) -> CheckedRows:
    """Read, reshape (`shapes.py`) and type-check a whole input: Parquet and datasets as typed Arrow, the rest by
    record."""
    shaping = Shaping(fields, what, extra, reward_map)
    if hf_split is not None or is_parquet(path):
        table = read_hf(path, hf_split) if hf_split is not None else read_parquet(Path(path))
        origin = f"{path}[{hf_split}]" if hf_split is not None else path
        if table.num_rows == 0:
            raise IngestError(f"{origin}: no records")
        return typed_batch(table, origin, shaping, mapping)
    return shaped_batch(rename(read_records(path), mapping or {}), shaping)


def load_batches(path: str, fields: dict[str, str], what: str, mapping: dict[str, str] | None = None,
                 hf_split: str | None = None, extra: ExtraFields = ExtraFields.metadata,
                 reward_map: RewardMap | None = None, batch_rows: int = BATCH_ROWS, dump: Dump | None = None,
                 counts: DumpCounts | None = None) -> Iterator[CheckedRows]:
    """`load_batch`, streamed: batches of at most `batch_rows` input rows, each naming rows by their place in the
    whole input. JSONL, CSV and Parquet are read incrementally; a dataset is memory-mapped by `datasets` already.
    With `dump`, `path` is another trainer's rollout dump (`frameworks.py`); `counts` gets what it held."""
    if batch_rows < 1:
        raise InputError(f"batch size must be at least 1, got {batch_rows}")
    shaping = Shaping(fields, what, extra, reward_map)
    if dump is None and hf_split is not None:
        table = read_hf(path, hf_split)
        if table.num_rows == 0:
            raise IngestError(f"{path}[{hf_split}]: no records")
        for start in range(0, table.num_rows, batch_rows):
            yield typed_batch(table.slice(start, batch_rows), f"{path}[{hf_split}]", shaping, mapping, start)
        return
    if dump is None and is_parquet(path):
        start = 0
        for table in read_parquet_batches(Path(path), batch_rows):
            yield typed_batch(table, path, shaping, mapping, start)
            start += table.num_rows
        return
    rows = (read_records(path) if dump is None
            else dump_records(path, dump, counts or DumpCounts(), mapped=reward_map is not None))
    records = rename(rows, mapping or {})
    while chunk := list(itertools.islice(records, batch_rows)):
        yield shaped_batch(chunk, shaping)


def located(records: Iterable[dict[str, Any]], origin: str) -> list[Located]:
    return [Located(f"{origin}:record {i + 1}", r) for i, r in enumerate(records)]


def _present(lake: Lake, table: str, ids: pa.Array, where: pl.Expr | None = None) -> pa.Array:
    """Boolean mask: which of `ids` the table already holds (as trajectory_id)."""
    key = "trajectory_id"
    frame = lake.read(table)
    if where is not None:
        frame = frame.filter(where)
    wanted = pl.LazyFrame({key: pl.from_arrow(ids)})
    found = frame.select(key).join(wanted, on=key, how="semi").collect().get_column(key).to_arrow()
    return pc.is_in(ids, value_set=found.cast(pa.string()))


# ---- prompts ----------------------------------------------------------------------------------------------------
_PROMPT_CONTENT = ("task", "prompt", "tests", "time_limit_s", "memory_limit_mb", "metadata")


def add_prompts(lake: Lake, batch: CheckedRows) -> IngestReport:
    """Add prompt rows. A prompt_id already in the lake must carry identical content (rows are immutable)."""
    validate_prompts(batch)
    t = batch.table
    with lake.lock():
        existing = _existing_prompts(lake, t.column("prompt_id"))
        keep = []
        for i, row in enumerate(t.to_pylist()):
            old = existing.get(row["prompt_id"])
            if old is None:
                keep.append(i)
            elif _content(old) != _content(row):
                changed = [f for f in _PROMPT_CONTENT if _content(old)[f] != _content(row)[f]]
                raise IngestError(f"{batch.where(i)}: field {changed[0]!r}: prompt {row['prompt_id']!r} is already in "
                                  "the lake with different content (prompts are immutable; use a new prompt_id)")
        lake.append("prompts", t.take(pa.array(keep, pa.int64())))
    return IngestReport(new=len(keep), present=t.num_rows - len(keep))


def _content(row: dict[str, Any]) -> dict[str, Any]:
    """Comparable prompt content: JSON fields parsed (key order and spacing do not matter)."""
    return {f: json.loads(row[f]) if f in ("tests", "metadata") and row[f] is not None else row[f]
            for f in _PROMPT_CONTENT}


def _existing_prompts(lake: Lake, ids: pa.Array | pa.ChunkedArray) -> dict[str, dict[str, Any]]:
    # (the casts: pyarrow has no type information, so polars' from_arrow cannot tell a Table from an Array)
    wanted = cast(pl.Series, pl.from_arrow(pc.unique(ids))).implode()
    df = lake.read("prompts").filter(pl.col("prompt_id").is_in(wanted)).select("prompt_id", *_PROMPT_CONTENT).collect()
    return {r["prompt_id"]: r for r in df.to_dicts()}


# ---- trajectories -----------------------------------------------------------------------------------------------
Batches = CheckedRows | Callable[[], Iterable[CheckedRows]]


def ingest_trajectories(lake: Lake, batches: Batches, *, source: str | None = None, task: str | None = None,
                        defaults: dict[str, Any] | None = None) -> IngestReport:
    """Validate and stage every batch, then commit the new prompts, imported verdicts and trajectories.

    `batches`: one CheckedRows, or a function returning the input's batches afresh (called again if the plan must be
    redone under the lock). `source` fills rows without one; `defaults` (model, run_id, tokenizer, temperature,
    top_p) fill missing fields; `task` is used to create prompts from a `prompt` field when rows carry no `task`.
    A bad row anywhere fails the whole ingest, and what was staged is deleted.
    """
    read = (lambda: [batches]) if isinstance(batches, CheckedRows) else batches
    fill = {"source": source, **(defaults or {})}
    with lake.writing() as lease:
        # Plan and stage outside the lake lock, so concurrent ingests overlap their heavy work; under the lock,
        # commit if no other writer changed what the plan checked against, else redo the plan there.
        before = _checked_versions(lake)
        plan = _stage_new_rows(lake, lease, read(), fill, task)
        with lake.lock():
            if _checked_versions(lake) != before:
                lease.discard()
                plan = _stage_new_rows(lake, lease, read(), fill, task)
            # trajectories, which make the batch visible, commit last; rows a concurrent ingest committed first
            # (object stores have no lake lock) are not added twice, and not counted
            prompts_new, evaluations_new, new = [lake.commit_rows(staged) for staged in plan.staged]
    return IngestReport(new=new, present=plan.rows - new, prompts_new=prompts_new, evaluations_new=evaluations_new)


def _checked_versions(lake: Lake) -> tuple[int, int]:
    return lake.version("prompts"), lake.version("trajectories")


@dataclass
class _Stream:
    """What the batches of one input share: ids seen so far, prompts and verdicts staged so far, the counts."""

    seen: SeenIds = field(default_factory=SeenIds)
    given: SeenIds = field(default_factory=SeenIds)
    adopted: set[str] = field(default_factory=set)
    prompts: dict[str, dict[str, Any]] = field(default_factory=dict)  # staged, by prompt_id (like _existing_prompts)
    evaluations: list[Staged] = field(default_factory=list)
    rows: int = 0


@dataclass(frozen=True)
class _Plan:
    rows: int  # of the input
    staged: list[Staged]  # prompts, evaluations, trajectories


def _stage_new_rows(lake: Lake, lease: Lease, batches: Iterable[CheckedRows], fill: dict[str, Any],
                    task: str | None) -> _Plan:
    """Write (without committing) the prompts, imported verdicts and trajectories the input adds to the lake."""
    state = _Stream()

    def trajectories() -> Iterator[pa.Table]:  # staged while the next batch is read and checked
        for batch in batches:
            yield _batch_rows(lake, lease, batch, fill, task, state)

    staged_trajectories = lake.stage("trajectories", trajectories(), lease)
    if state.rows == 0:
        raise IngestError("input: no records")
    prompts = pa.Table.from_pylist([{k: r[k] for k in _NEW_PROMPT.names} for r in state.prompts.values()],
                                   schema=_NEW_PROMPT)
    staged = [lake.stage("prompts", [prompts], lease), _merged(lease, "evaluations", state.evaluations),
              staged_trajectories]
    return _Plan(state.rows, staged)


def _batch_rows(lake: Lake, lease: Lease, batch: CheckedRows, fill: dict[str, Any], task: str | None,
                state: _Stream) -> pa.Table:
    """Check one batch; stage its new prompts (in `state`) and imported verdicts; return its new trajectory rows."""
    t = _fill(batch.table, fill)
    batch = CheckedRows(t, batch.where)
    validate_trajectories(batch)
    hashes, exact = response_digests(t.column("response"))
    ids = adopt_unattributed(lake.read("trajectories"), t, trajectory_ids(t, exact, state.seen), hashes,
                             state.adopted)
    if t.column("trajectory_id").null_count < t.num_rows:  # derived ids never repeat; given ones might
        _check_unique_ids(batch, ids, state.given)
    for row in _prompts_to_create(lake, batch, task, state.prompts).to_pylist():
        state.prompts[row["prompt_id"]] = {**dict.fromkeys(_PROMPT_CONTENT), **row}
    new_mask = pc.invert(_present(lake, "trajectories", ids))
    new, new_ids = _where(t, new_mask), _where(ids, new_mask)
    evaluations = _imported_verdicts(lake, new_ids, new.column("reward"))
    if evaluations.num_rows:
        state.evaluations.append(lake.stage("evaluations", [evaluations], lease))
    state.rows += t.num_rows
    return _trajectory_rows(new, new_ids, _where(hashes, new_mask))


def _merged(lease: Lease, table: str, parts: list[Staged]) -> Staged:
    """Several stagings of one table as one commit."""
    local = all(p.actions is not None for p in parts)
    return Staged(table, sum(p.num_rows for p in parts),
                  actions=[a for p in parts for a in p.actions or []] if local else None,
                  data=None if local else pa.concat_tables([p.data for p in parts]), lease=lease)


def _trajectory_rows(new: pa.Table, ids: pa.Array, hashes: pa.Array) -> pa.Table:
    return pa.table({
        "trajectory_id": ids,
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
        "response_hash": hashes,
        "metadata": new.column("metadata"),
    })


def _where(data: pa.Table | pa.Array, mask: pa.Array) -> pa.Table | pa.Array:
    """`data.filter(mask)` without copying everything when every row is kept (a fresh ingest)."""
    return data if pc.all(mask).as_py() is not False else data.filter(mask)


def _fill(t: pa.Table, values: dict[str, Any]) -> pa.Table:
    for name, value in values.items():
        if value is None or name not in t.column_names:
            continue
        col = t.column(name)
        t = t.set_column(t.column_names.index(name), name, pc.fill_null(col, pa.scalar(value, col.type)))
    return t


def _check_unique_ids(batch: CheckedRows, ids: pa.Array, earlier: SeenIds) -> None:
    """Given trajectory_ids must not repeat within one input (derived ids never do); `earlier` holds the ids of the
    input's earlier batches and gains these."""
    keys = SeenIds.prefixes(ids.to_pylist(), hashed=False)
    repeated = earlier.earlier(keys)
    if repeated.any():
        i = int(repeated.nonzero()[0][0])
        raise IngestError(f"{batch.where(i)}: field 'trajectory_id': duplicate {ids[i].as_py()!r} (also earlier in "
                          "the input)")
    earlier.add(keys)
    if pc.count_distinct(ids).as_py() == len(ids):
        return
    first: dict[str, int] = {}
    for i, tid in enumerate(ids.to_pylist()):
        if tid in first:
            raise IngestError(f"{batch.where(i)}: field 'trajectory_id': duplicate {tid!r} "
                              f"(first at {batch.where(first[tid])})")
        first[tid] = i


_NEW_PROMPT = pa.schema([("prompt_id", pa.string()), ("task", pa.string()), ("prompt", pa.string())])


def _prompts_to_create(lake: Lake, batch: CheckedRows, task: str | None, staged: dict[str, dict[str, Any]]) -> pa.Table:
    """Prompt rows to create from trajectory rows' `prompt`/`task` fields; checks them against the lake and the
    prompts earlier batches of the input `staged`."""
    t = batch.table
    existing = _existing_prompts(lake, t.column("prompt_id"))
    wanted = set(pc.unique(t.column("prompt_id")).to_pylist())
    existing |= {pid: row for pid, row in staged.items() if pid in wanted}
    restated = t.column("prompt").null_count < t.num_rows or t.column("task").null_count < t.num_rows
    all_known = pc.all(pc.is_in(t.column("prompt_id"), pa.array(list(existing), pa.string()))).as_py()
    if all_known and not restated:  # the usual case: rows refer to prompts already in the lake
        return _NEW_PROMPT.empty_table()
    frame = cast(pl.DataFrame, pl.from_arrow(t.select(["prompt_id", "prompt", "task"]))).with_row_index("row")
    known = pl.Series(list(existing), dtype=pl.String).implode()
    for name in ("prompt", "task") if existing else ():  # a row restating a known prompt must agree with the lake
        lake_value = pl.col("prompt_id").replace_strict({k: v[name] for k, v in existing.items()}, default=None,
                                                        return_dtype=pl.String)
        differs = pl.col(name) != lake_value
        if name == "prompt":  # exports restate a prompt as the model sees it: the task's format of it
            shown = {k: formatted_prompt(v) for k, v in existing.items()}
            differs &= pl.col(name) != pl.col("prompt_id").replace_strict(shown, default=None, return_dtype=pl.String)
        clash = frame.filter(pl.col("prompt_id").is_in(known) & pl.col(name).is_not_null() & differs).head(1)
        if clash.height:
            i, pid = clash["row"][0], clash["prompt_id"][0]
            raise IngestError(f"{batch.where(i)}: field {name!r}: differs from prompt {pid!r} in the lake")
    combos = (frame.filter(~pl.col("prompt_id").is_in(known))
              .unique(subset=["prompt_id", "prompt", "task"], keep="first", maintain_order=True))
    rows: dict[str, dict[str, Any]] = {}
    missing_text: dict[str, int] = {}
    for r in combos.iter_rows(named=True):  # one row per distinct (prompt_id, prompt, task): few
        pid, i = r["prompt_id"], r["row"]
        if r["prompt"] is None:
            missing_text.setdefault(pid, i)
            continue
        row_task = r["task"] or task
        if row_task is None:
            raise IngestError(f"{batch.where(i)}: field 'task': needed to create prompt {pid!r} (or pass --task)")
        old = rows.setdefault(pid, {"prompt_id": pid, "task": row_task, "prompt": r["prompt"]})
        if (old["prompt"], old["task"]) != (r["prompt"], row_task):
            name = "prompt" if old["prompt"] != r["prompt"] else "task"
            raise IngestError(f"{batch.where(i)}: field {name!r}: differs from an earlier row of prompt {pid!r}")
    for pid, i in missing_text.items():
        if pid not in rows:
            raise IngestError(f"{batch.where(i)}: field 'prompt_id': {pid!r} is not in the lake; add it with "
                              "`spolake prompts add` or give a 'prompt' field")
    return pa.Table.from_pylist(list(rows.values()), schema=_NEW_PROMPT)


def _imported_verdicts(lake: Lake, ids: pa.Array, reward: pa.ChunkedArray) -> pa.Table:
    """An `imported` evaluation per new trajectory with a reward (0 = passed), unless a crashed run left it."""
    has = pc.is_valid(reward)
    ids, reward = _where(ids, has), _where(reward, has)
    if len(ids):
        keep = pc.invert(_present(lake, "evaluations", ids, pl.col("verifier") == "imported"))
        ids, reward = _where(ids, keep), _where(reward, keep)
    verdict = pa.repeat(pa.scalar("imported"), len(ids))
    return pa.table({"trajectory_id": ids, "verifier": verdict, "passed": pc.greater_equal(reward, 0.0),
                     "reward": reward, "verdict": verdict})
