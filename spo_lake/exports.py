"""Exports: a selection of the lake at a snapshot, shaped for the tools people train with (TRL, `datasets`).

Shapes:
- `raw`: the query's rows as they are.
- `sft`: one row per selected trajectory: `prompt` (the text the policy is conditioned on: the task's format of the
  prompt), `completion` (the response), `prompt_id`, `trajectory_id`. With `chat`, prompt and completion are lists
  of {role, content} messages and `messages` is the whole conversation. Default selection: trajectories whose every
  verdict passed.
- `dpo`: `prompt`, `chosen`, `rejected`, `prompt_id`, `chosen_trajectory_id`, `rejected_trajectory_id`. Pairing rule
  (deterministic): among the selected trajectories with verdicts, a trajectory passes when every verdict passed and
  fails otherwise; per prompt, passing and failing trajectories are each reduced to one per distinct normalised
  response (the smallest trajectory_id) and ordered by trajectory_id, and the i-th passing one is paired with the
  i-th failing one, so a prompt gives min(#passing, #failing) pairs and no trajectory is used twice. Default
  selection: every trajectory.
- `prompt`: one row per prompt with what a reward function needs (`spo_lake.rewards`): `prompt`, `prompt_id`,
  `task`, `problem` (the prompt row's own text), `tests`, `time_limit_s`, `memory_limit_mb`, `prompt_metadata`
  (JSON text). Default selection: every prompt.
- `verl-rl`: verl's RL dataset (as its examples/data_preprocess scripts write it), one row per prompt: `data_source`
  (`spo_lake/<task>`), `prompt` ([{role: user, content}]), `ability` (the task), `reward_model` {style: "rule",
  ground_truth: the tests as JSON text}, `extra_info` {index, prompt_id, split: "train"}. Default: every prompt.
- `verl-sft`: verl's SFT dataset: `messages` (user prompt + assistant answer, for the multi-turn / engine trainer),
  `prompt` and `response` as text (the single-turn trainer), `prompt_id`, `trajectory_id`. Default selection: as sft.
  See docs/interop.md for the verl config lines that read them.

For the shaped exports the query selects rows by id: it must return `trajectory_id` (sft, dpo) or `prompt_id`
(prompt), and the rows are ordered by prompt_id, then trajectory_id. Every export carries its provenance (snapshot,
its table versions, the query, the shape): in the Parquet schema metadata and the `datasets` info description under
the key `spo_lake`, and next to a JSONL file as `<file>.spolake.json`. All of it re-ingests as a no-op.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import pyarrow as pa

from spo_lake.errors import InputError
from spo_lake.ingest.shapes import formatted_prompt
from spo_lake.lake import Lake


class Shape(str, Enum):
    raw = "raw"
    sft = "sft"
    dpo = "dpo"
    prompt = "prompt"
    verl_rl = "verl-rl"
    verl_sft = "verl-sft"


class ExportFormat(str, Enum):
    parquet = "parquet"
    jsonl = "jsonl"
    hf = "hf"


PROVENANCE_KEY = "spo_lake"

# Per shape: the id column its query must return, and the default selection.
_SELECTS = {
    Shape.sft: ("trajectory_id", "SELECT trajectory_id FROM evaluations GROUP BY 1 HAVING bool_and(passed)"),
    Shape.dpo: ("trajectory_id", "SELECT trajectory_id FROM trajectories"),
    Shape.prompt: ("prompt_id", "SELECT prompt_id FROM prompts"),
}
_SELECTS[Shape.verl_rl], _SELECTS[Shape.verl_sft] = _SELECTS[Shape.prompt], _SELECTS[Shape.sft]

# The prompt row's fields, for its task's format of the prompt (`_shown`).
_PROMPT_FIELDS = "p.task, p.prompt, p.tests, p.time_limit_s, p.memory_limit_mb, p.metadata AS prompt_metadata"

_SFT_SQL = """
SELECT t.prompt_id, t.trajectory_id, t.response_text, t.metadata, {prompt_fields}
FROM (SELECT DISTINCT trajectory_id FROM ({query})) s JOIN trajectories t USING (trajectory_id)
JOIN prompts p USING (prompt_id)
ORDER BY t.prompt_id, t.trajectory_id
"""

_DPO_SQL = """
WITH verdicts AS (SELECT trajectory_id, bool_and(passed) AS passed FROM evaluations GROUP BY 1),
candidates AS (
    SELECT t.prompt_id, t.trajectory_id, t.response_text, t.response_hash, t.metadata, v.passed,
           row_number() OVER (PARTITION BY t.prompt_id, v.passed, t.response_hash ORDER BY t.trajectory_id) AS copy
    FROM (SELECT DISTINCT trajectory_id FROM ({query})) s
    JOIN trajectories t USING (trajectory_id) JOIN verdicts v USING (trajectory_id)),
ranked AS (
    SELECT *, row_number() OVER (PARTITION BY prompt_id, passed ORDER BY trajectory_id) AS k
    FROM candidates WHERE copy = 1)
SELECT w.prompt_id, w.trajectory_id AS chosen_trajectory_id, w.response_text AS chosen, w.metadata,
       l.trajectory_id AS rejected_trajectory_id, l.response_text AS rejected, {prompt_fields}
FROM ranked w JOIN ranked l ON w.prompt_id = l.prompt_id AND w.k = l.k AND w.passed AND NOT l.passed
JOIN prompts p ON p.prompt_id = w.prompt_id
ORDER BY w.prompt_id, w.k
"""

_PROMPTS_SQL = """
SELECT p.prompt_id, {prompt_fields} FROM prompts p WHERE p.prompt_id IN (SELECT DISTINCT prompt_id FROM ({query}))
ORDER BY p.prompt_id
"""


@dataclass(frozen=True)
class Export:
    """An exported selection: its rows and where they came from (`provenance`: snapshot, versions, query, shape)."""

    table: pa.Table
    provenance: dict[str, Any]

    def to_dataset(self):
        """The rows as a `datasets.Dataset` whose info description is the provenance (JSON)."""
        import datasets

        return datasets.Dataset(self.table, info=datasets.DatasetInfo(description=json.dumps(self.provenance)))

    def write(self, out: str | Path, fmt: ExportFormat | str = ExportFormat.parquet) -> None:
        """Write as Parquet, JSONL (+ `<out>.spolake.json`) or a `datasets` save_to_disk directory. The output is
        written beside `out` and renamed into place, so an interrupted export leaves what was there, never half a
        file."""
        import pyarrow.parquet as pq

        fmt, out = ExportFormat(fmt), Path(out)
        if out.exists() and out.is_dir() != (fmt is ExportFormat.hf):
            raise InputError(f"--out {out}: {'a file' if out.is_file() else 'a directory'} is there; {fmt.value} "
                             f"writes {'a directory' if fmt is ExportFormat.hf else 'a file'}")
        if fmt is ExportFormat.hf and out.is_dir() and any(out.iterdir()) and not (out / "state.json").is_file():
            # only an earlier `datasets` export is replaced: never a directory of the user's own files
            raise InputError(f"--out {out}: a directory that is not a datasets export is there")
        # a staging directory of its own beside `out` (same file system, so the rename is atomic; exports to one
        # path at once do not share it)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
        try:
            written = staging / out.name
            if fmt is ExportFormat.hf:
                self.to_dataset().save_to_disk(str(written))
            elif fmt is ExportFormat.parquet:
                pq.write_table(self.table.replace_schema_metadata({PROVENANCE_KEY: json.dumps(self.provenance)}),
                               written)
            else:
                with written.open("w") as fh:
                    for row in self.table.to_pylist():
                        fh.write(json.dumps(row, default=str, ensure_ascii=False) + "\n")
            if out.is_dir():  # a directory is not renamed over a full one
                shutil.rmtree(out)
            os.replace(written, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if fmt is ExportFormat.jsonl:
            Path(f"{out}.spolake.json").write_text(json.dumps(self.provenance, indent=2) + "\n")


def export(lake: Lake, snapshot: str, shape: Shape | str = Shape.raw, query: str | None = None,
           chat: bool = False) -> Export:
    """Select rows at `snapshot` with `query` and shape them (see the module docstring for the shapes)."""
    from spo_lake import __version__

    shape = Shape(shape)
    snap = lake.get_snapshot(snapshot)
    if shape is Shape.raw:
        if query is None:
            raise InputError("--shape raw needs a --query")
        table = lake.sql(query, snapshot=snap)
    else:
        column, default = _SELECTS[shape]
        query = query.strip().rstrip(";") if query else default
        returned = lake.sql(f"SELECT * FROM ({query}) LIMIT 0", snapshot=snap).column_names
        if column not in returned:
            raise InputError(f"--shape {shape.value}: the query must return a {column!r} column (it returns "
                             f"{', '.join(returned) or 'nothing'})")
        table = _BUILDERS[shape](lake, snap, query, chat)
    provenance = {"snapshot": snap.name, "versions": snap.versions, "query": query, "shape": shape.value,
                  "chat": chat, "rows": table.num_rows, "spo_lake_version": __version__}
    return Export(table, provenance)


def _rows(lake: Lake, snap, sql: str, query: str) -> list[dict[str, Any]]:
    """The shape's SQL over the selection, each row with `shown`: the prompt as the model is conditioned on it."""
    rows = lake.sql(sql.format(query=query, prompt_fields=_PROMPT_FIELDS), snapshot=snap).to_pylist()
    shown: dict[str, str] = {}
    for r in rows:
        if r["prompt_id"] not in shown:
            shown[r["prompt_id"]] = formatted_prompt({**r, "metadata": r["prompt_metadata"]})
        r["shown"] = shown[r["prompt_id"]]
    return rows


def _prompt_value(row: dict[str, Any], chat: bool) -> str | list[dict[str, str]]:
    """The prompt column: the shown text, or with `chat` messages (those ingested with the trajectory, if any)."""
    if not chat:
        return row["shown"]
    kept = json.loads(row["metadata"]).get("prompt_messages") if row.get("metadata") else None
    return kept or [{"role": "user", "content": row["shown"]}]


def _answer(text: str, chat: bool) -> str | list[dict[str, str]]:
    return [{"role": "assistant", "content": text}] if chat else text


def _sft(lake: Lake, snap, query: str, chat: bool) -> pa.Table:
    out = []
    for r in _rows(lake, snap, _SFT_SQL, query):
        prompt, completion = _prompt_value(r, chat), _answer(r["response_text"], chat)
        out.append({"prompt": prompt, "completion": completion, "prompt_id": r["prompt_id"],
                    "trajectory_id": r["trajectory_id"]} | ({"messages": [*prompt, *completion]} if chat else {}))
    return _table(out, ["prompt", "completion", "prompt_id", "trajectory_id"] + (["messages"] if chat else []))


def _dpo(lake: Lake, snap, query: str, chat: bool) -> pa.Table:
    out = [{"prompt": _prompt_value(r, chat), "chosen": _answer(r["chosen"], chat),
            "rejected": _answer(r["rejected"], chat), "prompt_id": r["prompt_id"],
            "chosen_trajectory_id": r["chosen_trajectory_id"], "rejected_trajectory_id": r["rejected_trajectory_id"]}
           for r in _rows(lake, snap, _DPO_SQL, query)]
    return _table(out, ["prompt", "chosen", "rejected", "prompt_id", "chosen_trajectory_id", "rejected_trajectory_id"])


def _prompt(lake: Lake, snap, query: str, chat: bool) -> pa.Table:
    out = [{"prompt": _prompt_value(r, chat), "prompt_id": r["prompt_id"], "task": r["task"], "problem": r["prompt"],
            "tests": r["tests"], "time_limit_s": r["time_limit_s"], "memory_limit_mb": r["memory_limit_mb"],
            "prompt_metadata": r["prompt_metadata"]} for r in _rows(lake, snap, _PROMPTS_SQL, query)]
    return _table(out, ["prompt", "prompt_id", "task", "problem", "tests", "time_limit_s", "memory_limit_mb",
                        "prompt_metadata"])


def _verl_rl(lake: Lake, snap, query: str, chat: bool) -> pa.Table:
    out = [{"data_source": f"spo_lake/{r['task']}", "prompt": [{"role": "user", "content": r["shown"]}],
            "ability": r["task"], "reward_model": {"style": "rule", "ground_truth": r["tests"] or ""},
            "extra_info": {"index": i, "prompt_id": r["prompt_id"], "split": "train"}}
           for i, r in enumerate(_rows(lake, snap, _PROMPTS_SQL, query))]
    return _table(out, ["data_source", "prompt", "ability", "reward_model", "extra_info"])


def _verl_sft(lake: Lake, snap, query: str, chat: bool) -> pa.Table:
    out = [{"messages": [{"role": "user", "content": r["shown"]}, {"role": "assistant", "content": r["response_text"]}],
            "prompt": r["shown"], "response": r["response_text"], "prompt_id": r["prompt_id"],
            "trajectory_id": r["trajectory_id"]} for r in _rows(lake, snap, _SFT_SQL, query)]
    return _table(out, ["messages", "prompt", "response", "prompt_id", "trajectory_id"])


def _table(rows: list[dict[str, Any]], columns: list[str]) -> pa.Table:
    """Rows as Arrow, keeping the column order even when there are none."""
    if rows:
        return pa.Table.from_pylist(rows).select(columns)
    return pa.table({c: pa.array([], pa.string()) for c in columns})


_BUILDERS = {Shape.sft: _sft, Shape.dpo: _dpo, Shape.prompt: _prompt, Shape.verl_rl: _verl_rl,
             Shape.verl_sft: _verl_sft}
