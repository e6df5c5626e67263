"""Other trainers' rollout dumps, read as they are written today (`spolake ingest --from trl|verl|prime-rl PATH`).

Each reader turns a dump into canonical trajectory records (then shaped and validated like any input: `shapes.py`):
- `trl`: `GRPOTrainer(args=GRPOConfig(log_completions=True))` writes `<output_dir>/completions/completions_{step:05d}
  .parquet` with `step`, `prompt`, `completion` (text or messages), one column per reward function (NaN where it
  returned None), `log_extra` columns and `advantage` (TRL 1.16). The step is logged after the optimizer step, so
  the policy that sampled it is `step - 1` (one generation per step, TRL's default). The reward is the one reward
  column (or `reward_column`); its convention needs a reward map unless it is spo-lake's verifier.
- `verl`: `trainer.rollout_data_dir` / `validation_data_dir` hold `{global_step}.jsonl` (`_dump_generations` in
  `verl/trainer/ppo/ray_trainer.py`): `input` and `output` (decoded text), `gts`, `score` (the summed token-level
  score), `step` and the reward function's extra infos. The first rollout is step 1, sampled before any update:
  `policy_version = step - 1`.
- `prime-rl`: `rollouts/step_N/{train,eval}/{all,effective}/traces.jsonl`, one `verifiers` v1 `Episode.to_record()`
  a line (`src/prime_rl/monitors/file.py`). Each trace of an episode is one trajectory: the prompt messages before
  its first sampled node, the sampled messages as the response, the sampled tokens (`mask`) and their `logprobs`,
  reward = sum of score × weight, `policy_version` = the run's `work.policy.start`. `effective` is a subset of
  `all`, so a step's `all` is read when present.
Missing run ids default to the dump directory's name. A record without a reward is ingested without one; an errored
one (prime-rl `ok: false`) is counted; an episode with no trace, or an errored trace without a sampled message (a
call that failed early), is counted and skipped: `DumpCounts` says how many of each.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from spo_lake.errors import InputError
from spo_lake.ingest.readers import IngestError, Located, read_jsonl, read_parquet

FORMATS = ("trl", "verl", "prime-rl")
SOURCE = {"trl": "trl-grpo", "verl": "verl", "prime-rl": "prime-rl"}
VERIFIER_COLUMN = "spo_lake_verifier"  # TRL's column for spo-lake's reward function: already the lake's convention
_TRL_FILE = re.compile(r"completions_(\d+)\.parquet$")
_PRIME_STEP = re.compile(r"step_(\d+)$")


@dataclass(frozen=True)
class Dump:
    """A rollout dump to read: its format and, for TRL, which column is the reward."""

    fmt: str
    reward_column: str | None = None
    run_id: str | None = None  # for dumps that name no run (trl, verl); default: the dump directory's name


@dataclass
class DumpCounts:
    """What a dump held besides plain rewarded records."""

    rewardless: int = 0
    errored: int = 0  # ingested (with their errors in metadata)
    skipped: int = 0  # errored episodes with no completion to ingest

    def summary(self) -> str:
        parts = [f"{n} {what}" for n, what in ((self.rewardless, "without a reward"), (self.errored, "errored"),
                                               (self.skipped, "errored with no completion, not ingested")) if n]
        return "; ".join(parts)


def detect(path: str) -> str:
    """The format of a dump path, when only one fits."""
    p = Path(path)
    fits = [f for f in FORMATS if _files(p, f)]
    if len(fits) != 1:
        raise InputError(f"{path}: {'no' if not fits else 'more than one'} rollout dump format fits "
                         f"({', '.join(fits) or 'trl, verl or prime-rl expected'}); name it with --from")
    return fits[0]


def _files(p: Path, fmt: str) -> list[Path]:
    """The dump's files in step order ([] when `p` is not that format's dump)."""
    if fmt == "trl":
        found = [p] if p.is_file() else sorted((p / "completions" if (p / "completions").is_dir() else p)
                                               .glob("completions_*.parquet")) if p.is_dir() else []
        return sorted((f for f in found if _TRL_FILE.search(f.name)), key=_step_of)
    if fmt == "verl":
        found = [p] if p.is_file() else list(p.glob("*.jsonl")) if p.is_dir() else []
        return sorted((f for f in found if f.stem.isdigit()), key=lambda f: int(f.stem))
    root = p / "rollouts" if (p / "rollouts").is_dir() else p
    if p.is_file():
        return [p] if p.name == "traces.jsonl" else []
    out = []
    for step in sorted((d for d in root.glob("step_*") if _PRIME_STEP.search(d.name)), key=_step_of):
        for kind in ("train", "eval"):
            subset = next((step / kind / s for s in ("all", "effective") if (step / kind / s / "traces.jsonl")
                           .is_file()), None)
            if subset is not None:
                out.append(subset / "traces.jsonl")
    return out


def _step_of(path: Path) -> int:
    return int(re.findall(r"\d+", path.name)[-1])


def dump_records(path: str, dump: Dump, counts: DumpCounts, mapped: bool) -> Iterator[Located]:
    """Canonical trajectory records of a dump; `mapped`: a reward map is given (scores need one)."""
    p, fmt, reward_column = Path(path), dump.fmt, dump.reward_column
    files = _files(p, fmt)
    if not files:
        raise IngestError(f"{path}: no {fmt} rollout files (see `spolake ingest --help`)")
    run = dump.run_id or (p.parent if p.is_file() else p).resolve().name
    if fmt == "trl":
        run = dump.run_id or (p.parent.parent if p.is_file() else p.parent if p.name == "completions"
                              else p).resolve().name
        for f in files:
            yield from _trl(f, run, counts, reward_column, mapped)
    elif fmt == "verl":
        for f in files:
            yield from _verl(f, run, counts, mapped)
    else:
        for f in files:
            yield from _prime(f, counts, mapped)


def _unmapped(where: str, field: str) -> IngestError:
    return IngestError(f"{where}: field {field!r}: a score in the trainer's own convention; say how it maps to the "
                       "lake's 0 (pass) / -1 (fail) with --reward-map (e.g. >=1 or 1=0,0=-1)")


def _reward(where: str, field: str, value: Any, mapped: bool, counts: DumpCounts) -> Any:
    """The record's reward: None (counted) when absent or NaN; a score must be mapped."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        counts.rewardless += 1
        return None
    if not mapped:
        raise _unmapped(where, field)
    return value


# ---- TRL ----------------------------------------------------------------------------------------------------------
_TRL_FIXED = ("step", "prompt", "completion", "advantage")


def _trl(f: Path, run: str, counts: DumpCounts, reward_column: str | None, mapped: bool) -> Iterator[Located]:
    table = read_parquet(f)
    types = {f.name: f.type for f in table.schema}
    numeric = [c for c in table.column_names
               if c not in _TRL_FIXED and (pa.types.is_floating(types[c]) or pa.types.is_integer(types[c]))]
    if reward_column is None:
        if len(numeric) != 1:
            raise IngestError(f"{f}: {'no' if not numeric else 'several'} reward columns "
                              f"({', '.join(numeric) or 'none numeric'}); name one with --reward-column")
        reward_column = numeric[0]
    elif reward_column not in table.column_names:
        raise IngestError(f"{f}: no reward column {reward_column!r} (has {', '.join(table.column_names)})")
    native = reward_column == VERIFIER_COLUMN  # spo-lake's verifier already rewards 0 / -1
    for i, row in enumerate(table.to_pylist()):
        where = f"{f}:row {i + 1}"
        for field in ("step", "prompt", "completion"):
            if row.get(field) is None:
                raise IngestError(f"{where}: missing required field {field!r} (a TRL completions file)")
        step = row.pop("step")
        reward = _reward(where, reward_column, row.pop(reward_column), mapped or native, counts)
        yield Located(where, {**row, "reward": reward, "run_id": run, "source": SOURCE["trl"],
                              "policy_version": step - 1 if isinstance(step, int) and step >= 1 else None,
                              "trl_step": step})


# ---- verl ---------------------------------------------------------------------------------------------------------
def _verl(f: Path, run: str, counts: DumpCounts, mapped: bool) -> Iterator[Located]:
    for loc in read_jsonl(f):
        rec = dict(loc.record)
        for field in ("input", "output"):
            if not isinstance(rec.get(field), str):
                raise IngestError(f"{loc.where}: missing required field {field!r} (a verl rollout dump line)")
        step = rec.pop("step", None)
        out = {"prompt": rec.pop("input"), "response": rec.pop("output"), "run_id": run, "source": SOURCE["verl"],
               "reward": _reward(loc.where, "score", rec.pop("score", None), mapped, counts), "verl_step": step,
               "policy_version": step - 1 if isinstance(step, int) and step >= 1 else None}
        if "gts" in rec:
            out["ground_truth"] = rec.pop("gts")
        yield Located(loc.where, {**rec, **out})


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# ---- prime-rl (verifiers v1 episodes) -----------------------------------------------------------------------------
def _text(content: Any) -> str:
    """A message's content: text, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict)
                         and part.get("type", "text") == "text")
    return ""


def _object(where: str, record: dict, field: str) -> dict:
    """`record[field]` when it is an object, {} when absent; anything else is an error naming the field."""
    value = record.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise IngestError(f"{where}: field {field!r}: expected an object, got {type(value).__name__}")
    return value


def _list(where: str, record: dict, field: str) -> list:
    value = record.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise IngestError(f"{where}: field {field!r}: expected a list, got {type(value).__name__}")
    return value


def _messages(trace: dict) -> list[dict]:
    return [n for n in trace.get("nodes") or [] if isinstance(n, dict) and isinstance(n.get("message"), dict)]


def _prime(f: Path, counts: DumpCounts, mapped: bool) -> Iterator[Located]:
    kind, subset = f.parent.parent.name, f.parent.name
    for loc in read_jsonl(f):
        episode = loc.record
        if not isinstance(episode.get("task"), dict):
            raise IngestError(f"{loc.where}: missing required field 'task' (a verifiers episode record)")
        traces = _list(loc.where, episode, "traces")
        errors = [e.get("message") for e in _list(loc.where, episode, "errors") if isinstance(e, dict)]
        run = _object(loc.where, episode, "run")
        work = _object(loc.where, run, "work")
        policy = _object(loc.where, work, "policy")
        if not traces:
            counts.skipped += 1
            continue
        for t, trace in enumerate(traces):
            where = f"{loc.where}: trace {t}"
            if not isinstance(trace, dict):
                raise IngestError(f"{where}: expected an object, got {type(trace).__name__}")
            failed = not episode.get("ok", True) or trace.get("ok") is False or errors or trace.get("errors")
            if failed and not any(n.get("sampled") for n in _messages(trace)):
                counts.skipped += 1  # a call that failed early: the trace holds no sampled message to ingest
                continue
            yield Located(where, _trace_record(where, episode, trace, run, work, policy, kind, subset, errors,
                                               counts, mapped))


def _trace_record(where: str, episode: dict, trace: dict, run: dict, work: dict, policy: dict, kind: str,
                  subset: str, errors: list, counts: DumpCounts, mapped: bool) -> dict[str, Any]:
    nodes = trace.get("nodes")
    if not isinstance(nodes, list) or not all(isinstance(n, dict) and isinstance(n.get("message"), dict)
                                              for n in nodes):
        raise IngestError(f"{where}: field 'nodes': expected a list of message nodes")
    first = next((i for i, n in enumerate(nodes) if n.get("sampled")), len(nodes))
    prompt = [{"role": n["message"].get("role", "user"), "content": _text(n["message"].get("content"))}
              for n in nodes[:first]]
    sampled = [n for n in nodes if n.get("sampled")]
    tokens: list[int] | None = []
    logprobs: list[float] | None = []
    for n in sampled:
        ids, mask, lps = n.get("token_ids") or [], n.get("mask") or [], n.get("logprobs") or []
        if not all(isinstance(x, list) for x in (ids, mask, lps)):
            raise IngestError(f"{where}: field 'nodes': token_ids, mask and logprobs must be lists")
        picked = [tok for tok, m in zip(ids, mask) if m]
        if not picked or len(picked) != len(lps) or tokens is None or logprobs is None:
            tokens = logprobs = None  # some turn without its sampled tokens: keep the text only
            continue
        tokens += picked
        logprobs += lps
    rewards = [r for r in _object(where, trace, "rewards").values() if isinstance(r, dict)]
    if not all(_number(r.get("score")) and _number(r.get("weight", 1.0)) for r in rewards):
        raise IngestError(f"{where}: field 'rewards': each needs a numeric score (and weight)")
    value = sum(r["score"] * r.get("weight", 1.0) for r in rewards) if rewards else None
    trace_errors = errors + [e.get("message") for e in _list(where, trace, "errors") if isinstance(e, dict)]
    ok = bool(episode.get("ok")) and bool(trace.get("ok", True)) and not trace_errors
    if not ok:
        counts.errored += 1
    task = episode["task"]
    model = next((c.get("model") for c in _list(where, trace, "calls") if isinstance(c, dict) and c.get("model")),
                 None)
    meta = {"episode_id": episode.get("id"), "group_id": _object(where, episode, "group").get("id"),
            "env": _object(where, episode, "env").get("id"), "task_key": task.get("key"), "kind": kind,
            "subset": subset, "step": work.get("step"), "policy_end": policy.get("end"), "ok": ok,
            "agent": _object(where, trace, "agent").get("name"), "turns": len(sampled)}
    if trace_errors:
        meta["errors"] = trace_errors
    return {"prompt": prompt or None, "response": "".join(_text(n["message"].get("content")) for n in sampled),
            "token_ids": tokens or None, "logprobs": logprobs if tokens else None, "run_id": run.get("id"),
            "model": model, "source": SOURCE["prime-rl"], "policy_version": policy.get("start"),
            "reward": _reward(where, "rewards", value, mapped, counts),
            "metadata": {"prime_rl": {k: v for k, v in meta.items() if v is not None}}}


__all__ = ["FORMATS", "Dump", "DumpCounts", "detect", "dump_records"]
