"""CodeContests (`deepmind/code_contests`): stdin/stdout problems, their tests and human solutions.

Also home of what the contest-style tasks share (TACO imports it): reading rows of a local Parquet/Arrow/
JSONL file, directory or glob, or of a Hugging Face hub dataset, through `datasets`; per-run limits; and
judging a response on contest tests (stdio, or call-based for TACO).

Limits: contest time and memory limits are written for C++, and a sandboxed Python start costs time
and address space of its own, so a run gets the larger of the problem's limit and the sandbox options'
(`run_limits`); the options act as a floor.
"""
from __future__ import annotations

import dataclasses
import glob
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spo_lake.errors import InputError
from spo_lake.tasks.base import Problem, SandboxOptions, Verdict
from spo_lake.tasks.extract import extract_code
from spo_lake.tasks.verifiers import verify_call, verify_stdio

HUB_NAME = "deepmind/code_contests"

# Enums of the dataset's contest_problem.proto (numbers are not contiguous there).
SOURCES = {0: "unknown", 1: "codechef", 2: "codeforces", 3: "hackerearth", 4: "codejam", 6: "atcoder", 7: "aizu"}
DIFFICULTIES = {0: "unknown", 1: "easy", 2: "medium", 3: "hard", 4: "harder", 5: "hardest", 6: "external"} | {
    number: letter for number, letter in zip([*range(7, 18), *range(19, 30)], "ABCDEFGHIJKLMNOPQRSTUV", strict=True)
}
PYTHON3 = 3

REQUIRED = ("name", "description", "public_tests", "private_tests", "generated_tests",
            "solutions", "incorrect_solutions")
TEST_KINDS = ("public", "private", "generated")  # also the order the verifier runs them in
METADATA_FIELDS = ("cf_contest_id", "cf_index", "cf_points", "cf_rating", "cf_tags", "is_description_translated",
                   "input_file", "output_file")

STDIO_INSTRUCTION = (
    "Solve the problem above with a Python 3 program that reads the input from standard input and writes "
    "the answer to standard output. Give the complete program in a single ```python code block."
)

_BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json"}
_SPLIT_ALIASES = {"valid": "validation", "validation": "valid", "dev": "validation"}
_HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")


# ---------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Row:
    origin: str  # the file, or "hub-name[split]"
    index: int  # row number within origin
    data: dict[str, Any]

    def error(self, field: str, problem: str) -> ValueError:
        return ValueError(f"{self.origin}: row {self.index}: field {field!r} {problem}")

    def text(self, field: str) -> str:
        """A string field that must be present and non-empty."""
        value = self.data.get(field)
        if not isinstance(value, str) or not value.strip():
            raise self.error(field, "is missing or empty")
        return value


def read_rows(path: str | None, *, split: str, hub_name: str, required: Sequence[str],
              limit: int | None) -> Iterator[Row]:
    """Rows of `path` (None: the hub dataset `hub_name`), at most `limit`, each checked to have `required`.

    A file is read whole, whatever `split` says; a directory is split by file name as `load_dataset`
    does (train-*.parquet, data/test-*.parquet, ...); a glob names files; anything else that looks like
    owner/name is a hub dataset. Local files are streamed (no Arrow copy in the datasets cache); a hub
    dataset is downloaded and cached as usual.
    """
    count = 0
    for origin, dataset in _datasets(path or hub_name, split):
        for index, data in enumerate(dataset):
            if limit is not None and count >= limit:
                return
            missing = next((name for name in required if name not in data), None)
            if missing is not None:
                raise InputError(f"{origin}: row {index}: missing field {missing!r}")
            yield Row(origin, index, data)
            count += 1


def _datasets(path: str, split: str) -> Iterator[tuple[str, Iterable[dict[str, Any]]]]:
    import datasets  # heavy: only when loading

    files = _local_files(path, split)
    if files is None:
        try:
            yield f"{path}[{split}]", datasets.load_dataset(path, split=split)
        except Exception as e:  # network, auth, unknown name or split: all user-facing
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise InputError(f"cannot load {path!r} (split {split!r}) from the Hugging Face hub: {reason}") from None
        return
    for file in files:
        builder = _BUILDERS.get(Path(file).suffix)
        if builder is None:
            raise InputError(f"{file}: unsupported file type (use {', '.join(_BUILDERS)})")
        yield file, datasets.load_dataset(builder, data_files=file, split="train", streaming=True)


def _local_files(path: str, split: str) -> list[str] | None:
    """The files `path` names, or None when it names a hub dataset."""
    local = Path(path).expanduser()
    if local.is_file():
        return [str(local)]
    if local.is_dir():
        return _split_files(local, split)
    if any(c in path for c in "*?["):
        files = sorted(f for f in glob.glob(str(local), recursive=True) if Path(f).is_file())
        if not files:
            raise InputError(f"{path}: no files match")
        return files
    if _HUB_NAME.fullmatch(path):
        return None
    raise InputError(f"{path}: no such file or directory")


def _split_files(directory: Path, split: str) -> list[str]:
    from datasets.data_files import DataFilesDict, get_data_patterns

    by_split = DataFilesDict.from_patterns(get_data_patterns(str(directory)), base_path=str(directory))
    for name in (split, _SPLIT_ALIASES.get(split)):
        if name in by_split:
            return sorted(f for f in by_split[name] if Path(f).suffix in _BUILDERS)
    raise InputError(f"{directory}: no {split!r} split (found: {', '.join(map(str, by_split)) or 'none'})")


# ----------------------------------------------------------------------------------------------- judging


def run_limits(problem: Problem, options: SandboxOptions) -> tuple[float, int]:
    """(timeout_s, memory_mb) for one run: the larger of the problem's limit and the options'."""
    timeout_s = max(options.timeout_s, problem.time_limit_s or 0.0)
    memory_mb = max(options.memory_mb, problem.memory_limit_mb or 0)
    return timeout_s, memory_mb


def contest_tests(problem: Problem) -> list[dict[str, Any]]:
    """The public, private and generated tests of a contest problem, in the order they are run."""
    return [test for kind in TEST_KINDS for test in problem.tests.get(kind, [])]


def contest_verifier_name(problem: Problem) -> str:
    return "call" if problem.tests.get("fn_name") else "stdio"


def verify_contest(problem: Problem, response: str, options: SandboxOptions) -> Verdict:
    """Extract the program and judge it on `contest_tests`: by calling `tests["fn_name"]` when the
    problem has one (TACO call-based), else through stdin/stdout."""
    code = extract_code(response).code
    tests = contest_tests(problem)
    if not tests:  # nothing to run must never count as a pass
        return Verdict(passed=False, verdict="sandbox_error", detail="problem has no tests", extracted_code=code)
    timeout_s, memory_mb = run_limits(problem, options)
    fn_name = problem.tests.get("fn_name")
    if fn_name:
        verdict = verify_call(code, fn_name, tests, timeout_s=timeout_s, memory_mb=memory_mb, mode=options.mode)
    else:
        verdict = verify_stdio(code, tests, timeout_s=timeout_s, memory_mb=memory_mb, mode=options.mode)
    return dataclasses.replace(verdict, extracted_code=code)


def contest_prompt(statement: str, instruction: str, starter_code: str = "") -> str:
    """The statement, the starter code if any, then what to answer with."""
    starter = f"\n\nStart from this code:\n```python\n{starter_code.rstrip()}\n```" if starter_code.strip() else ""
    return f"{statement.strip()}{starter}\n\n{instruction}"


# ----------------------------------------------------------------------------------------------- loading


def load(path: str | None = None, *, split: str = "train", limit: int | None = None) -> tuple[list[dict], list[dict]]:
    """(prompt records, human trajectory records) of CodeContests problems; see the module docstring
    for `path`. Python 3 solutions are correct human solutions (reward 0), Python 3 incorrect_solutions
    incorrect ones (reward -1); other languages are skipped."""
    prompts: list[dict] = []
    trajectories: list[dict] = []
    for row in read_rows(path, split=split, hub_name=HUB_NAME, required=REQUIRED, limit=limit):
        prompt_id = f"codecontests/{row.text('name')}"
        prompts.append(_prompt_record(row, prompt_id, split))
        for label, field in (("correct", "solutions"), ("incorrect", "incorrect_solutions")):
            for index, code in enumerate(_python3_solutions(row, field)):
                trajectories.append({
                    "prompt_id": prompt_id,
                    "response": code,
                    "source": "human",
                    "reward": 0.0 if label == "correct" else -1.0,
                    "metadata": {"language": "python3", "dataset": "codecontests", "label": label, "index": index},
                })
    return prompts, trajectories


def _prompt_record(row: Row, prompt_id: str, split: str) -> dict:
    data = row.data
    metadata = {"dataset": "codecontests", "split": split, "name": data["name"]}
    if data.get("source") is not None:
        metadata["source"] = SOURCES.get(data["source"], str(data["source"]))
    if data.get("difficulty") is not None:
        metadata["difficulty"] = DIFFICULTIES.get(data["difficulty"], str(data["difficulty"]))
    metadata |= {name: data[name] for name in METADATA_FIELDS if data.get(name) not in (None, "", [])}
    return {
        "prompt_id": prompt_id,
        "task": "codecontests",
        "prompt": row.text("description"),
        "tests": {kind: _tests(row, f"{kind}_tests") for kind in TEST_KINDS},
        "time_limit_s": _seconds(data.get("time_limit")),
        "memory_limit_mb": data["memory_limit_bytes"] // 2**20 if data.get("memory_limit_bytes") else None,
        "metadata": metadata,
    }


def _tests(row: Row, field: str) -> list[dict[str, str]]:
    value = row.data[field] or {"input": [], "output": []}
    inputs, outputs = value.get("input") or [], value.get("output") or []
    if len(inputs) != len(outputs):
        raise row.error(field, f"has {len(inputs)} inputs but {len(outputs)} outputs")
    return [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]


def _python3_solutions(row: Row, field: str) -> list[str]:
    value = row.data[field] or {"language": [], "solution": []}
    languages, solutions = value.get("language") or [], value.get("solution") or []
    if len(languages) != len(solutions):
        raise row.error(field, f"has {len(languages)} languages but {len(solutions)} solutions")
    return [code for language, code in zip(languages, solutions, strict=True) if language == PYTHON3]


def _seconds(duration: dict | None) -> float | None:
    """A protobuf Duration {seconds, nanos} in seconds; None when absent or zero."""
    if not duration:
        return None
    seconds = (duration.get("seconds") or 0) + (duration.get("nanos") or 0) / 1e9
    return seconds or None


# -------------------------------------------------------------------------------------------------- task


@dataclass(frozen=True)
class CodeContestsTask:
    name: str = "codecontests"

    def format_prompt(self, problem: Problem) -> str:
        return contest_prompt(problem.prompt, STDIO_INSTRUCTION)

    def verifier_name(self, problem: Problem) -> str:
        return contest_verifier_name(problem)

    def verify(self, problem: Problem, response: str, options: SandboxOptions) -> Verdict:
        return verify_contest(problem, response, options)


TASK = CodeContestsTask()
