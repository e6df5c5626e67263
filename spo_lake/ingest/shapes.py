"""The input shapes ingest accepts, normalised to the canonical fields before the type stage (`records.py`).

What other tools produce, and how it lands:
- the schema's column names stand for the input names (`response_text` for `response`, `model_id` for `model`,
  `tokenizer_id`, `behavior_logprobs`), and TRL's `completion` for `response`; a raw export's derived columns
  (`response_hash`, `created_at`) are dropped, the lake recomputes them;
- conversational fields: `prompt` / `completion` as lists of {role, content} messages, or `messages`, a whole
  conversation whose last message is the assistant's answer. The prompt text is the contents of the prompt messages
  joined by blank lines; the messages themselves are kept in metadata (`prompt_messages`) unless the prompt is one
  user message (so a chat export can restore them);
- preference rows (`chosen` + `rejected`, TRL's DPO shape): two trajectories, reward 0 and -1, metadata
  `preference` = chosen | rejected and a shared `pair` hash; `chosen_trajectory_id` / `rejected_trajectory_id`
  (spo-lake's own DPO export) are their ids;
- a missing `prompt_id` is `prompt-` + the first 16 hex digits of sha256(prompt text);
- extra fields are kept in `metadata` under their own names (or dropped, or refused: `ExtraFields`);
- rewards: the lake's contract is r in {0, -1} (0 = passed). `RewardMap` maps another convention (the input value
  and the map are recorded in metadata as `reward_input` / `reward_map`); a `passed` field gives the reward when
  there is none and must agree with it when there is.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

import pyarrow as pa

from spo_lake.errors import InputError
from spo_lake.ingest.readers import IngestError, Located, reject_constant
from spo_lake.ingest.records import SCHEMA_NAMES, CheckedRows, from_arrow, from_records

# input name -> canonical name, per record kind: the schema's names, and TRL's `completion`
TRAJECTORY_ALIASES = {**{schema: name for name, schema in SCHEMA_NAMES.items()}, "completion": "response"}
PROMPT_ALIASES = {"problem": "prompt", "prompt_metadata": "metadata"}  # spo-lake's prompt export
DERIVED = ("response_hash", "created_at")
# What `spolake ingest --help` lists: every trajectory field by its schema name, and the names it is also read under.
TRAJECTORY_FIELD_DOCS = {
    "prompt_id": "the problem's id (default: prompt-<sha256 of the prompt text>)",
    "response_text": "the model's answer text (also: response, and TRL's completion)",
    "prompt": "prompt text, or {role, content} messages; creates the problem with --task",
    "task": "the problem's task (countdown, humaneval, codecontests, taco, pyfunc)",
    "messages": "a conversation ending with the assistant's answer (instead of prompt + response_text)",
    "chosen / rejected": "a preference pair: two trajectories, reward 0 and -1",
    "reward": "0 (pass) or -1 (fail); other conventions with --reward-map",
    "passed": "true/false: the reward when none is given; must agree with it otherwise",
    "source": "where it came from (default --source)",
    "model_id": "the model that produced it (also: model)",
    "run_id": "the run that produced it", "trajectory_id": "its id (default: derived from its content)",
    "token_ids": "response token ids", "behavior_logprobs": "their behaviour log-probs (also: logprobs)",
    "tokenizer_id": "the tokenizer of token_ids (also: tokenizer)", "policy_version": "policy version (int >= 0)",
    "temperature": "sampling temperature", "top_p": "sampling top-p", "metadata": "a JSON object",
}  # a raw export's columns the lake computes itself
REWARD_CONVENTIONS = {"binary": "1=0,0=-1", "signed": "1=0,-1=-1"}  # name -> map (input=lake)
LAKE_REWARDS = (0.0, -1.0)


class ExtraFields(str, Enum):
    """What happens to input fields that are not record fields."""

    metadata = "metadata"  # kept in the row's metadata object under their own names
    drop = "drop"
    error = "error"


@dataclass(frozen=True)
class RewardMap:
    """Input reward value -> lake reward (0 or -1), e.g. `RewardMap.parse("1=0,0=-1")` for a 1/0 dataset, or a
    threshold for float scores: `RewardMap.parse(">=0.5")` passes a score of at least 0.5 and fails any other."""

    values: dict[float, float]
    text: str
    threshold: float | None = None

    @classmethod
    def parse(cls, text: str) -> RewardMap:
        """From "input=lake,..." pairs, a convention name (binary: 1=0,0=-1; signed: 1=0,-1=-1) or ">=T"."""
        text = REWARD_CONVENTIONS.get(text, text)
        if text.startswith(">="):
            try:
                threshold = float(text[2:])
            except ValueError:
                threshold = math.nan
            if not math.isfinite(threshold):
                raise InputError(f"reward map {text!r}: expected a finite number after >=, such as >=0.5")
            return cls({}, f">={threshold:g}", threshold)
        values: dict[float, float] = {}
        for item in text.split(","):
            try:
                src, dst = (float(x) for x in item.split("="))
            except ValueError:
                raise InputError(f"reward map {text!r}: expected input=lake pairs such as 1=0,0=-1, a threshold such "
                                 f"as >=0.5, or one of {', '.join(REWARD_CONVENTIONS)}") from None
            if dst not in LAKE_REWARDS:
                raise InputError(f"reward map {text!r}: maps {src:g} to {dst:g}; lake rewards are 0 (pass) or -1")
            values[src] = dst
        return cls(values, ",".join(f"{k:g}={v:g}" for k, v in values.items()))

    def lake_reward(self, value: float) -> float | None:
        """The lake reward of an input value; None when the map does not cover it (a NaN never passes a threshold
        and is no key, so it is refused too)."""
        if self.threshold is not None:
            return None if not math.isfinite(value) else 0.0 if value >= self.threshold else -1.0
        return self.values.get(value)


@dataclass(frozen=True)
class Shaping:
    """How to read input shapes: the record kind's fields, extra-field policy, and the reward convention."""

    fields: dict[str, str]
    what: str  # "trajectories" or "prompts"
    extra: ExtraFields = ExtraFields.metadata
    reward_map: RewardMap | None = None

    @property
    def trajectories(self) -> bool:
        return self.what == "trajectories"

    @property
    def aliases(self) -> dict[str, str]:
        return TRAJECTORY_ALIASES if self.trajectories else PROMPT_ALIASES


def formatted_prompt(row: dict[str, Any]) -> str:
    """The text a model is conditioned on for a prompts-table row: its task's format, or the text itself for a task
    spo-lake does not know."""
    from spo_lake.tasks import Problem, get_task

    try:
        task = get_task(row["task"])
    except KeyError:
        return row["prompt"]
    return task.format_prompt(Problem.from_row(row))


def prompt_id_for(prompt: str) -> str:
    """The id of a prompt given without one: stable across inputs, tools and machines."""
    return "prompt-" + hashlib.sha256(prompt.encode()).hexdigest()[:16]


# ---- whole inputs ------------------------------------------------------------------------------------------------
def shaped_batch(records: Iterable[Located], shaping: Shaping) -> CheckedRows:
    """Type-check row-oriented records after reshaping them."""
    return from_records(reshape(records, shaping), shaping.fields, shaping.what)


def typed_batch(table: pa.Table, origin: str, shaping: Shaping, mapping: dict[str, str] | None = None,
                first_row: int = 0) -> CheckedRows:
    """An Arrow input (Parquet, a dataset): column-wise when its columns are canonical, else record by record."""
    inverse = {src: dst for dst, src in (mapping or {}).items()}
    table = _rename_columns(table.rename_columns([inverse.get(c, c) for c in table.column_names]), shaping)
    if not _needs_reshaping(table, shaping):
        return from_arrow(table, shaping.fields, origin, shaping.what, first_row)
    # The list fields (token ids, log-probs: most of the bytes) stay columns unless a row splits into two.
    lists = [c for c in table.column_names if shaping.fields.get(c, "").startswith("list<")]
    narrow = table.drop_columns(lists)
    row = lambda i: f"{origin}:row {first_row + i + 1}"  # noqa: E731
    records = list(reshape((Located(row(i), r) for i, r in enumerate(narrow.to_pylist())), shaping))
    if not lists or len(records) != table.num_rows:  # no list columns, or preference rows split in two
        return shaped_batch((Located(row(i), r) for i, r in enumerate(table.to_pylist())), shaping)
    scalars = from_records(records, {f: k for f, k in shaping.fields.items() if f not in lists}, shaping.what)
    typed = from_arrow(table.select(lists), {f: shaping.fields[f] for f in lists}, origin, shaping.what,
                       first_row).table
    out = scalars.table
    for name in lists:
        out = out.append_column(name, typed.column(name))
    return CheckedRows(out.select(list(shaping.fields)), scalars.where)


def _rename_columns(table: pa.Table, shaping: Shaping) -> pa.Table:
    """The aliases as column renames (an alias next to its canonical column stays, for `reshape` to refuse)."""
    names = table.column_names
    if shaping.trajectories:
        drop = [c for c in DERIVED if c in names]
    else:
        drop = ["prompt"] if "problem" in names and "prompt" in names else []
    table = table.drop_columns(drop)
    names = table.column_names
    return table.rename_columns([shaping.aliases[c] if c in shaping.aliases and shaping.aliases[c] not in names else c
                                 for c in names])


def _needs_reshaping(table: pa.Table, shaping: Shaping) -> bool:
    """Extra or conversational fields, prompt ids to derive, or a reward map: those go record by record."""
    names = table.column_names
    if set(names) - set(shaping.fields) or shaping.reward_map is not None:
        return True
    if "prompt_id" not in names or ("prompt" in names and table.column("prompt_id").null_count):
        return True  # ids to derive from the prompt text
    return any(pa.types.is_list(f.type) and pa.types.is_struct(f.type.value_type) for f in table.schema)


# ---- records ------------------------------------------------------------------------------------------------------
def reshape(records: Iterable[Located], shaping: Shaping) -> Iterator[Located]:
    """Canonical records from any accepted input shape (one input record may become two: a preference pair)."""
    for loc in records:
        rec = _renamed(loc, shaping)
        pieces = _split_preference(loc.where, rec) if shaping.trajectories else [rec]
        for piece in pieces:
            yield Located(loc.where, _finish(loc.where, piece, shaping))


def _renamed(loc: Located, shaping: Shaping) -> dict[str, Any]:
    rec = dict(loc.record)
    if shaping.trajectories:
        for name in DERIVED:
            rec.pop(name, None)
    elif "problem" in rec:
        rec.pop("prompt", None)
    for alias, name in shaping.aliases.items():
        if alias in rec:
            if name in rec:
                raise IngestError(f"{loc.where}: field {alias!r}: given together with {name!r} (the same field)")
            rec[name] = rec.pop(alias)
    return rec


def _split_preference(where: str, rec: dict[str, Any]) -> list[dict[str, Any]]:
    """A chosen/rejected row as two trajectory records (0 and -1); any other record as itself."""
    if "chosen" not in rec and "rejected" not in rec:
        return [rec]
    for side in ("chosen", "rejected"):
        if rec.get(side) is None:
            raise IngestError(f"{where}: missing required field {side!r} (a preference row has chosen and rejected)")
    for field in ("response", "reward", "passed", "trajectory_id", "token_ids", "logprobs"):  # one per side, not pair
        if rec.get(field) is not None:
            raise IngestError(f"{where}: field {field!r}: not allowed in a preference row (chosen/rejected)")
    common = {k: v for k, v in rec.items() if k not in ("chosen", "rejected", "chosen_trajectory_id",
                                                        "rejected_trajectory_id")}
    pair = hashlib.sha256(json.dumps([rec.get("prompt"), rec.get("prompt_id"), rec["chosen"], rec["rejected"]],
                                     sort_keys=True, default=str).encode()).hexdigest()[:16]
    out = []
    for side, reward in (("chosen", 0.0), ("rejected", -1.0)):
        piece = {**common, "response": rec[side], "reward": reward, "trajectory_id": rec.get(f"{side}_trajectory_id")}
        if "prompt" not in piece and _is_conversation(rec[side]):  # implicit prompt: full conversations
            piece["messages"] = piece.pop("response")
        piece["metadata"] = _metadata(where, piece.get("metadata")) | {"preference": side, "pair": pair}
        out.append(piece)
    return out


def _finish(where: str, rec: dict[str, Any], shaping: Shaping) -> dict[str, Any]:
    """Conversations to text, rewards checked and mapped, prompt_id derived, extras handled."""
    extras: dict[str, Any] = {}
    if "messages" in rec:
        _conversation_to_fields(where, rec)
    if isinstance(rec.get("prompt"), list):
        messages = _messages(where, "prompt", rec["prompt"])
        rec["prompt"] = "\n\n".join(m["content"] for m in messages)
        if not (len(messages) == 1 and messages[0]["role"] == "user"):
            extras["prompt_messages"] = messages
    if shaping.trajectories:
        if isinstance(rec.get("response"), list):
            rec["response"] = "".join(m["content"] for m in _messages(where, "completion", rec["response"])
                                      if m["role"] == "assistant")
        extras |= _resolve_reward(where, rec, shaping.reward_map)
    if rec.get("prompt_id") is None and isinstance(rec.get("prompt"), str):
        rec["prompt_id"] = prompt_id_for(rec["prompt"])
    unknown = {k: rec.pop(k) for k in list(rec) if k not in shaping.fields}
    if unknown and shaping.extra is ExtraFields.error:
        raise IngestError(f"{where}: unknown field(s) {sorted(unknown)} for {shaping.what} (rename with --map dst=src, "
                          "or keep them in metadata with --extra metadata)")
    if shaping.extra is ExtraFields.metadata:
        extras = unknown | extras
    if extras or isinstance(rec.get("metadata"), str):
        metadata = _metadata(where, rec.get("metadata"))
        clash = sorted(set(metadata) & set(extras))
        if clash:
            raise IngestError(f"{where}: field {clash[0]!r}: also a key of 'metadata' (rename one with --map dst=src)")
        rec["metadata"] = metadata | extras
    return rec


def _conversation_to_fields(where: str, rec: dict[str, Any]) -> None:
    """`messages` (a conversation ending with the assistant's answer) as a prompt and a response."""
    messages = _messages(where, "messages", rec.pop("messages"))
    if not messages or messages[-1]["role"] != "assistant":
        raise IngestError(f"{where}: field 'messages': the last message must be the assistant's answer")
    for field in ("prompt", "response"):
        if rec.get(field) is not None:
            raise IngestError(f"{where}: field {field!r}: given together with 'messages'")
    rec["prompt"], rec["response"] = messages[:-1], messages[-1]["content"]
    if not rec["prompt"]:
        raise IngestError(f"{where}: field 'messages': no prompt before the assistant's answer")


def _is_conversation(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


def _messages(where: str, field: str, value: Any) -> list[dict[str, str]]:
    """A list of {role, content} messages with text content (extra keys such as tool calls are not kept)."""
    if not isinstance(value, list):
        raise IngestError(f"{where}: field {field!r}: expected a list of {{role, content}} messages")
    out = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise IngestError(f"{where}: field {field!r}: message {i} is not {{role, content}} with text content")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _metadata(where: str, value: Any) -> dict[str, Any]:
    """The metadata object of a record: absent, an object, or the text of one (as exports and Parquet carry it)."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value, parse_constant=reject_constant)
        except ValueError:
            raise IngestError(f"{where}: field 'metadata': expected a JSON object, got {value[:40]!r}") from None
    if not isinstance(value, dict):
        raise IngestError(f"{where}: field 'metadata': expected a JSON object, got {type(value).__name__}")
    return value


def _resolve_reward(where: str, rec: dict[str, Any], reward_map: RewardMap | None) -> dict[str, Any]:
    """Map the reward to the lake's convention and reconcile it with `passed`; returns the provenance to record."""
    provenance: dict[str, Any] = {}
    reward: Any = rec.get("reward")
    if reward_map is not None and type(reward) in (int, float):  # other types are the type stage's to name
        original = float(reward)
        mapped = reward_map.lake_reward(original)
        if mapped is None:
            raise IngestError(f"{where}: field 'reward': value {reward!r} is not in the reward map {reward_map.text}")
        rec["reward"] = reward = mapped
        provenance = {"reward_input": original, "reward_map": reward_map.text}
    passed = rec.pop("passed", None)
    if passed is None:
        return provenance
    if not isinstance(passed, bool):
        raise IngestError(f"{where}: field 'passed': expected true or false, got {type(passed).__name__} "
                          f"{str(passed)[:40]!r}")
    if reward is None:
        rec["reward"] = 0.0 if passed else -1.0
    elif type(reward) in (int, float) and (reward == 0) != passed:
        raise IngestError(f"{where}: field 'passed': {str(passed).lower()} disagrees with reward {reward!r} "
                          "(the lake's reward is 0 for a pass, -1 otherwise)")
    return provenance
