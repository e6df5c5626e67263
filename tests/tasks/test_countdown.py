"""The countdown task: solver, problem generation, and the verifier on the real bwrap sandbox."""
from __future__ import annotations

import ast
import itertools
import random
import shutil
import time
from fractions import Fraction

import pytest

from spo_lake.tasks import get_task
from spo_lake.tasks.base import Problem, SandboxOptions
from spo_lake.tasks.countdown import (
    TARGET_RANGE,
    check_structure,
    extract_answer,
    load,
    make_problems,
    needs_product,
    reachable,
    solve,
)

requires_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
OPTIONS = SandboxOptions(timeout_s=5.0, memory_mb=256)
TASK = get_task("countdown")


def exact_value(expression: str) -> Fraction:
    """Exact value of a + - * / expression over integer literals (the test's own evaluator)."""
    ops = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__,
           ast.Div: Fraction.__truediv__}

    def walk(node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        return ops[type(node.op)](walk(node.left), walk(node.right))

    return walk(ast.parse(expression, mode="eval").body)


def brute_force_values(numbers: list[int]) -> set[int]:
    """Values reachable by repeatedly combining two of the remaining numbers (integer intermediates),
    stopping anywhere: the classic search, independent of the solver's subset DP."""
    seen: set[int] = set()

    def search(pool: tuple[int, ...]) -> None:
        seen.update(pool)
        for i, j in itertools.permutations(range(len(pool)), 2):
            a, b = pool[i], pool[j]
            rest = tuple(x for k, x in enumerate(pool) if k not in (i, j))
            results = [a + b, a - b, a * b] + ([a // b] if b != 0 and a % b == 0 else [])
            for value in results:
                search(rest + (value,))

    search(tuple(numbers))
    return seen


def problem(numbers: list[int], target: int) -> Problem:
    return Problem(prompt_id="t", task="countdown", prompt="", tests={"numbers": numbers, "target": target})


# ------------------------------------------------------------------------------------------- solver


@pytest.mark.parametrize("numbers", [[3, 7, 12], [2, 2, 3, 5], [1, 9, 15, 20], [4, 10, 18, 10]])
def test_reachable_matches_an_independent_brute_force(numbers):
    assert reachable(numbers) == brute_force_values(numbers)


def test_solver_returns_only_correct_distinct_expressions():
    rng = random.Random(7)
    for _ in range(30):
        numbers = [rng.randint(1, 20) for _ in range(rng.choice((3, 4)))]
        target = rng.choice(sorted(v for v in reachable(numbers) if 10 <= v <= 100))
        solutions = solve(numbers, target, cap=50)
        assert solutions and len(solutions) == len(set(solutions)) <= 50
        for expression in solutions:
            assert check_structure(expression, numbers).ok, expression
            assert exact_value(expression) == target, expression


def test_solver_finds_nothing_for_unreachable_targets():
    assert solve([2, 3], 7) == []
    assert 7 not in reachable([2, 3])
    assert solve([2, 3], 6) == ["2*3"]


def test_needs_product_is_true_exactly_when_no_solution_avoids_products():
    rng = random.Random(11)
    seen = set()
    for _ in range(60):
        numbers = [rng.randint(1, 20) for _ in range(rng.choice((3, 4)))]
        target = rng.choice(sorted(v for v in reachable(numbers) if 10 <= v <= 100))
        without = [e for e in solve(numbers, target, cap=10_000) if not set("*/") & set(e)]
        assert needs_product(numbers, target) == (not without), (numbers, target)
        seen.add(needs_product(numbers, target))
    assert seen == {True, False}
    assert needs_product([2, 3, 4], 24) and not needs_product([3, 7, 12], 16)  # 3*2*4; 12+7-3


# ------------------------------------------------------------------------------------------- problems


def test_make_problems_is_deterministic_and_well_formed():
    prompts, trajectories = make_problems(40, seed=3)
    again, _ = make_problems(40, seed=3)
    other, _ = make_problems(40, seed=4)
    assert prompts == again and prompts != other
    assert [p["prompt_id"] for p in prompts] == [f"countdown/3/{i}" for i in range(40)]
    for record in prompts:
        numbers, target = record["tests"]["numbers"], record["tests"]["target"]
        assert 3 <= len(numbers) <= 4 and TARGET_RANGE[0] <= target <= TARGET_RANGE[1]
        assert target in reachable(numbers) and target not in numbers
        assert str(target) in record["prompt"] and all(str(x) in record["prompt"] for x in numbers)
    by_id = {p["prompt_id"]: p for p in prompts}
    assert {t["prompt_id"] for t in trajectories} == set(by_id)
    for t in trajectories:
        assert t["source"] == "human" and t["reward"] == 0.0
        assert exact_value(t["response"]) == by_id[t["prompt_id"]]["tests"]["target"]


def test_load_generates_and_rejects_a_path():
    prompts, _ = load(n=10, seed=1, limit=4)
    assert len(prompts) == 4
    with pytest.raises(ValueError, match="generated"):
        load("some/file.jsonl")


# ------------------------------------------------------------------------------------------- verifier


def test_answer_extraction_takes_the_last_non_empty_line():
    assert extract_answer("3+4") == "3+4"
    assert extract_answer("12-5=7, 7*6=42\n(12-5)*6\n\n") == "(12-5)*6"
    assert extract_answer("so:\n`(12-5)*6 = 42`") == "(12-5)*6"
    assert extract_answer("  \n") == ""


@pytest.mark.parametrize(
    "answer, verdict",
    [
        ("__import__('os').system('true')", "syntax"),
        ("(1).__class__", "syntax"),
        ("9**9**9", "syntax"),
        ("3 if 1 else 4", "syntax"),
        ("[3 for _ in range(10**9)]", "syntax"),
        ("lambda: 3", "syntax"),
        ("-3+4", "syntax"),
        ("3.0+4", "syntax"),
        ("True+3", "syntax"),
        ("x+3", "syntax"),
        ("3+", "syntax"),
        ("(" * 300 + "3" + ")" * 300, "syntax"),
        ("3+3", "wrong_answer"),  # 3 given once
        ("3+5", "wrong_answer"),  # 5 not given
    ],
)
def test_structure_check_rejects_without_evaluating(answer, verdict):
    check = check_structure(answer, [3, 4, 12])
    assert not check.ok and check.verdict == verdict


@requires_bwrap
def test_verify_right_wrong_and_runtime_errors():
    assert TASK.verify(problem([3, 4, 12], 24), "12+3*4", OPTIONS).passed
    assert TASK.verify(problem([7, 3, 3], 7), "7/3*3", OPTIONS).passed  # float division within tolerance
    assert TASK.verify(problem([3, 4, 12], 19), "thinking: 12+4=16, 16+3=19\n12+4+3", OPTIONS).passed
    wrong = TASK.verify(problem([3, 4, 12], 24), "12+4+3", OPTIONS)
    assert (wrong.passed, wrong.verdict, wrong.reward) == (False, "wrong_answer", -1.0)
    zero = TASK.verify(problem([3, 3, 12], 24), "12/(3-3)", OPTIONS)
    assert (zero.passed, zero.verdict) == (False, "runtime_error") and "ZeroDivision" in zero.detail


@requires_bwrap
def test_huge_or_malicious_answers_never_hang_the_host():
    # rejected by the structure check, before anything is evaluated (a timeout or runtime error would mean it ran);
    # the time bound only catches a hang (the sleep is 30 s, 9**9**9 never ends), it is not a speed test
    started = time.perf_counter()
    for answer, reason in [("9**9**9", "disallowed operator: Pow"),
                           ("__import__('os').system('sleep 30')", "disallowed construct: Call"),
                           ("(lambda: 9**9**9)()", "disallowed construct: Call")]:
        verdict = TASK.verify(problem([9, 9, 9], 81), answer, OPTIONS)
        assert (verdict.passed, verdict.verdict, verdict.detail) == (False, "syntax", reason)
    assert time.perf_counter() - started < 25.0


@requires_bwrap
def test_verify_many_matches_verify_one_by_one():
    prompts, trajectories = make_problems(12, seed=5)
    problems = {p["prompt_id"]: Problem.from_row(p) for p in prompts}
    items = [(problems[t["prompt_id"]], t["response"]) for t in trajectories]
    items += [(problems[t["prompt_id"]], t["response"] + "+1") for t in trajectories[:5]]
    items += [(problems[prompts[0]["prompt_id"]], "9**9"), (problem([5, 5, 1], 2), "1/(5-5)")]
    batched = TASK.verify_many(items, OPTIONS)
    single = [TASK.verify(p, r, OPTIONS) for p, r in items]
    assert [(v.passed, v.verdict) for v in batched] == [(v.passed, v.verdict) for v in single]
    assert all(v.passed for v in batched[: len(trajectories)])
    assert not any(v.passed for v in batched[len(trajectories) :])
