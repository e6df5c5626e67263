"""Verifiers that run code against tests in the sandbox: stdio (CodeContests/TACO), call (TACO fn_name), humaneval.

Each takes code already extracted from a response and returns a `Verdict`. Code that does not compile is
judged in the parent with `compile()` (compiling is safe, executing is not) and never reaches the sandbox.
Tests run one after another on the calling thread's long-lived sandbox, each in a fresh process, and
verification stops at the first failing test, whose index and a short detail the verdict records.
Expected outputs stay on the host: the program never sees them.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import time
import warnings
from typing import Any, Callable, Mapping, Sequence

from spo_lake.sandbox import Job, Limits, RunResult, thread_sandbox
from spo_lake.tasks.base import Verdict

FLOAT_TOLERANCE = 1e-5  # CodeContests' checker: absolute or relative
DETAIL_CHARS = 200


def tokens_match(actual: str, expected: str, tolerance: float = FLOAT_TOLERANCE) -> bool:
    """Whitespace-split token comparison: equal strings, or both floats within `tolerance` (abs or rel)."""
    got, want = actual.split(), expected.split()
    return len(got) == len(want) and all(g == w or _floats_close(g, w, tolerance) for g, w in zip(got, want))


def verify_stdio(code: str, tests: Sequence[Mapping[str, Any]], timeout_s: float = 5.0, memory_mb: int = 512,
                 mode: str = "bwrap") -> Verdict:
    """tests: [{"input": stdin text, "output": expected stdout}]; timeout_s is per test."""
    def check(test: Mapping[str, Any], result: RunResult) -> str | None:
        if tokens_match(result.stdout, str(test["output"])):
            return None
        return f"expected {_short(str(test['output']))!r}, got {_short(result.stdout)!r}"

    jobs = [Job(code, stdin=str(test["input"])) for test in tests]
    return _verify(code, jobs, tests, check, Limits(timeout_s=timeout_s, memory_mb=memory_mb), mode)


def verify_call(code: str, fn_name: str, tests: Sequence[Mapping[str, Any]], timeout_s: float = 5.0,
                memory_mb: int = 512, mode: str = "bwrap") -> Verdict:
    """tests: [{"input": argument list, "output": expected return value}] for `fn_name`, defined at top level
    or as a method of `class Solution`. TACO wraps outputs in a list: `result == out or [result] == out` passes.
    """
    def check(test: Mapping[str, Any], result: RunResult) -> str | None:
        expected = _as_json(test["output"])
        if result.value == expected or [result.value] == expected:
            return None
        return f"expected {_short(json.dumps(expected))}, got {_short(json.dumps(result.value))}"

    jobs = [Job(code, fn_name=fn_name, args=_arguments(test["input"])) for test in tests]
    return _verify(code, jobs, tests, check, Limits(timeout_s=timeout_s, memory_mb=memory_mb), mode)


def verify_humaneval(code: str, test_program: str, entry_point: str, timeout_s: float = 5.0, memory_mb: int = 512,
                     mode: str = "bwrap") -> Verdict:
    """HumanEval: `code`, then the problem's test program, then `check(entry_point)` must run to the end.

    A failed assertion is a wrong answer; exiting early (exit(), os._exit) is a runtime error, not a pass.
    """
    program = f"{code}\n{test_program}\n\ncheck({entry_point})\n"
    jobs = [Job(program, must_finish=True)]
    verdict = _verify(code, jobs, [{}], _no_check, Limits(timeout_s=timeout_s, memory_mb=memory_mb), mode)
    if verdict.verdict == "runtime_error" and "AssertionError" in verdict.detail:
        return dataclasses.replace(verdict, verdict="wrong_answer")
    return verdict


Check = Callable[[Mapping[str, Any], RunResult], "str | None"]

# Compiling a candidate on the host can warn about its code ("SyntaxWarning: 'int' object is not callable; perhaps
# you missed a comma?"): the candidate's business, not the user's terminal. Candidates compile under this pseudo
# filename, and a filter on it silences just those (thread-safe, unlike warnings.catch_warnings).
CANDIDATE_FILE = "<candidate>"
warnings.filterwarnings("ignore", category=SyntaxWarning, module=re.escape(CANDIDATE_FILE))


def compile_candidate(code: str):
    """Compile (never run) untrusted code: raises what compile raises, warns nothing."""
    return compile(code, CANDIDATE_FILE, "exec", dont_inherit=True)  # why a finished run fails its test, or None


def _verify(code: str, jobs: Sequence[Job], tests: Sequence[Mapping[str, Any]], check: Check, limits: Limits,
            mode: str) -> Verdict:
    """Compile in the parent, then run the jobs in order; the first failing one decides the verdict."""
    if not jobs:
        raise ValueError("no tests to run: a program cannot pass without tests")
    started = time.monotonic()
    syntax_error = _syntax_error(code)
    if syntax_error is not None:
        return Verdict(passed=False, verdict="syntax", detail=syntax_error, extracted_code=code)
    sandbox = thread_sandbox(mode)
    for index, (job, test) in enumerate(zip(jobs, tests)):
        result = sandbox.run(job, limits)
        verdict = "wrong_answer" if result.verdict == "ok" else result.verdict
        failure = check(test, result) if result.verdict == "ok" else result.detail or result.verdict
        if failure is not None:
            return Verdict(passed=False, verdict=verdict, first_failing_test=index, detail=_short(f"test {index}: {failure}"),
                           duration_s=time.monotonic() - started, extracted_code=code)
    return Verdict(passed=True, verdict="ok", duration_s=time.monotonic() - started, extracted_code=code)


def _no_check(test: Mapping[str, Any], result: RunResult) -> None:
    return None


def _syntax_error(code: str) -> str | None:
    try:
        compile_candidate(code)
    except SyntaxError as error:
        return f"line {error.lineno}: {error.msg}"
    except (ValueError, RecursionError, MemoryError) as error:  # null bytes, absurd nesting
        return f"{type(error).__name__}: {error}"
    return None


def _floats_close(a: str, b: str, tolerance: float) -> bool:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isclose(x, y, rel_tol=tolerance, abs_tol=tolerance)


def _arguments(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _as_json(value: Any) -> Any:
    """Tuples become lists, as the program's return value does on its way out of the sandbox."""
    return json.loads(json.dumps(value))


def _short(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 3] + "..."
