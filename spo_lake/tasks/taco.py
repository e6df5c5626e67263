"""TACO (`BAAI/TACO`): stdin/stdout and call-based problems with JSON-encoded tests and solutions.

`input_output` is a JSON object {"inputs": [...], "outputs": [...]} plus "fn_name" for call-based
problems, whose inputs are argument lists and whose outputs are wrapped in a list as TACO does
([[3], [7]] for returns 3 and 7); they are kept as they are for the `call` verifier. TACO does not
split public from hidden tests, so all of them are `private`. `solutions` is a JSON list of Python
programs (version unspecified), taken as correct human solutions. Reading and judging are shared with CodeContests.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from spo_lake.tasks.base import Problem, SandboxOptions, Verdict
from spo_lake.tasks.codecontests import (
    STDIO_INSTRUCTION,
    Row,
    contest_prompt,
    contest_verifier_name,
    read_rows,
    verify_contest,
)

HUB_NAME = "BAAI/TACO"
REQUIRED = ("question", "solutions", "input_output")
METADATA_FIELDS = ("difficulty", "source", "url", "name", "date", "picture_num",
                   "Expected Time Complexity", "Expected Auxiliary Space")
LIST_FIELDS = ("tags", "raw_tags", "skill_types")  # Python-literal lists in TACO

CALL_INSTRUCTION = (
    "Solve the problem above in Python 3 by defining `{fn_name}`: it is called with each test's inputs as "
    "arguments and its return value is checked. Give the complete code in a single ```python code block."
)

_SECONDS = {"": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
            "ms": 1e-3, "millisecond": 1e-3, "milliseconds": 1e-3}
_MEGABYTES = {"": 1.0, "mb": 1.0, "m": 1.0, "megabyte": 1.0, "megabytes": 1.0, "mib": 1.0, "mebibytes": 1.0,
              "kb": 1 / 1024, "kilobytes": 1 / 1024, "gb": 1024.0, "gigabyte": 1024.0, "gigabytes": 1024.0}
_QUANTITY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)(?:\(s\))?\s*\.?\s*", re.IGNORECASE)


def load(path: str | None = None, *, split: str = "train", limit: int | None = None) -> tuple[list[dict], list[dict]]:
    """(prompt records, human trajectory records) of TACO problems. `path` is as for CodeContests;
    prompt ids are "taco/<split>/<row number>", counted over everything `path` names, so load a whole
    split (its directory or hub name) rather than one shard of it."""
    prompts: list[dict] = []
    trajectories: list[dict] = []
    rows = read_rows(path, split=split, hub_name=HUB_NAME, required=REQUIRED, limit=limit)
    for number, row in enumerate(rows):
        prompt_id = f"taco/{split}/{number}"
        prompts.append(_prompt_record(row, prompt_id, split))
        for index, code in enumerate(_solutions(row)):
            trajectories.append({
                "prompt_id": prompt_id,
                "response": code,
                "source": "human",
                "reward": 0.0,
                "metadata": {"language": "python", "dataset": "taco", "label": "correct", "index": index},
            })
    return prompts, trajectories


def parse_time_limit(text: str | None) -> float | None:
    """Seconds in a free-text limit ("2 seconds", "1.5 s", "500 ms", "1 second(s)"); None if unparseable."""
    return _quantity(text, _SECONDS)


def parse_memory_limit(text: str | None) -> int | None:
    """Megabytes in a free-text limit ("256 megabytes", "64 MB", "1 GB"); None if unparseable."""
    megabytes = _quantity(text, _MEGABYTES)
    return round(megabytes) if megabytes else None


def _quantity(text: str | None, units: dict[str, float]) -> float | None:
    match = _QUANTITY.fullmatch(text) if isinstance(text, str) else None
    if match is None or match[2].lower() not in units:
        return None
    return float(match[1]) * units[match[2].lower()] or None


def _prompt_record(row: Row, prompt_id: str, split: str) -> dict:
    data = row.data
    metadata: dict[str, Any] = {"dataset": "taco", "split": split}
    metadata |= {name: _literal_list(data.get(name)) for name in LIST_FIELDS}
    metadata |= {name: data[name] for name in METADATA_FIELDS if data.get(name) not in (None, "")}
    if data.get("starter_code"):
        metadata["starter_code"] = data["starter_code"]
    return {
        "prompt_id": prompt_id,
        "task": "taco",
        "prompt": row.text("question"),
        "tests": _tests(row),
        "time_limit_s": parse_time_limit(data.get("time_limit")),
        "memory_limit_mb": parse_memory_limit(data.get("memory_limit")),
        "metadata": metadata,
    }


def _tests(row: Row) -> dict[str, Any]:
    spec = _json(row, "input_output")
    if not isinstance(spec, dict):
        raise row.error("input_output", "is not a JSON object")
    inputs, outputs = spec.get("inputs", []), spec.get("outputs", [])
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise row.error("input_output", "needs equally long 'inputs' and 'outputs' lists")
    fn_name = spec.get("fn_name")
    if fn_name:
        tests = [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]
        return {"public": [], "private": tests, "generated": [], "fn_name": fn_name}
    tests = [{"input": _stdio_text(i), "output": _stdio_text(o)} for i, o in zip(inputs, outputs, strict=True)]
    return {"public": [], "private": tests, "generated": []}


def _stdio_text(value: Any) -> str:
    """Some TACO stdio tests (from APPS) give a list of lines instead of one string."""
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _solutions(row: Row) -> list[str]:
    if not row.data.get("solutions"):
        return []
    solutions = _json(row, "solutions")
    if not isinstance(solutions, list) or not all(isinstance(s, str) for s in solutions):
        raise row.error("solutions", "is not a JSON list of strings")
    return solutions


def _json(row: Row, field: str) -> Any:
    try:
        return json.loads(row.data[field])
    except (TypeError, json.JSONDecodeError) as e:
        raise row.error(field, f"is not valid JSON ({e})") from None


def _literal_list(text: str | None) -> list[str]:
    """TACO writes lists as Python literals ("['Strings']"); an unreadable value gives an empty list."""
    try:
        value = ast.literal_eval(text) if text else []
    except (ValueError, SyntaxError):
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


@dataclass(frozen=True)
class TacoTask:
    name: str = "taco"

    def format_prompt(self, problem: Problem) -> str:
        fn_name = problem.tests.get("fn_name")
        instruction = CALL_INSTRUCTION.format(fn_name=fn_name) if fn_name else STDIO_INSTRUCTION
        return contest_prompt(problem.prompt, instruction, problem.metadata.get("starter_code", ""))

    def verifier_name(self, problem: Problem) -> str:
        return contest_verifier_name(problem)

    def verify(self, problem: Problem, response: str, options: SandboxOptions) -> Verdict:
        return verify_contest(problem, response, options)


TASK = TacoTask()
