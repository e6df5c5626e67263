"""pyfunc: generated short Python functions with unit tests, for small pretrained chat models.

HumanEval is out of reach of a ~100 M-parameter instruct model and countdown is arithmetic it cannot do; these are
one-line functions (add a constant, count a character, sum the numbers above a threshold, ...) described in one
sentence with one worked example, so such a model solves some of them some of the time: room for RL to move.

Problems are generated from a seed (`spolake prompts add --dataset pyfunc --n N --seed S`), no downloads: a family
and its constants are drawn, the reference implementation computes the expected value of each test input here, and
the tests are a HumanEval-style `check(candidate)` program. The prompt is plain instructions (the backend wraps it
in the model's chat template); judging is HumanEval's (the check runs on the trusted side and calls the response's
function in the sandbox), with nothing prepended to the response's code. Each problem also gets its reference
solution as a `human` trajectory.
"""
from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spo_lake.errors import InputError
from spo_lake.tasks.base import Problem
from spo_lake.tasks.humaneval import HumanEvalTask

TESTS_PER_PROBLEM = 5
_WORDS = ("apple", "sky", "river", "to", "banana", "code", "a", "little", "stone", "tree", "moonlight", "cat")


@dataclass(frozen=True)
class Family:
    """One kind of function: `name(params)`, a sentence saying what it returns (with the drawn constants), the
    reference body, and a generator of argument tuples."""

    name: str
    params: str
    describe: str  # str.format'ed with the constants
    body: str  # the reference function's body (one return line), str.format'ed with the constants
    constants: Callable[[random.Random], dict[str, Any]]
    arguments: Callable[[random.Random, dict[str, Any]], tuple]


def _ints(rng: random.Random, n: int, lo: int = -20, hi: int = 50) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 6)))


def _k(lo: int, hi: int) -> Callable[[random.Random], dict[str, Any]]:
    return lambda rng: {"k": rng.randint(lo, hi)}


FAMILIES = (
    Family("add_value", "x", "returns the integer x plus {k}", "return x + {k}",
           _k(2, 99), lambda rng, c: (rng.randint(-50, 200),)),
    Family("multiply", "x", "returns the integer x multiplied by {k}", "return x * {k}",
           _k(2, 12), lambda rng, c: (rng.randint(-30, 100),)),
    Family("is_divisible", "n", "returns True if the integer n is divisible by {k}, otherwise False",
           "return n % {k} == 0", _k(3, 9), lambda rng, c: (c["k"] * rng.randint(0, 20) + rng.choice((0, 0, 1, 2)),)),
    Family("count_char", "s", "returns how many times the character {c!r} appears in the string s",
           "return s.count({c!r})", lambda rng: {"c": rng.choice("aeiorst")}, lambda rng, c: (_text(rng),)),
    Family("first_chars", "s", "returns the first {k} characters of the string s", "return s[:{k}]",
           _k(2, 6), lambda rng, c: (_text(rng),)),
    Family("repeat_text", "s", "returns the string s repeated {k} times", "return s * {k}",
           _k(2, 4), lambda rng, c: (rng.choice(_WORDS),)),
    Family("sum_above", "xs", "returns the sum of the numbers in the list xs that are greater than {k}",
           "return sum(v for v in xs if v > {k})", _k(0, 20), lambda rng, c: (_ints(rng, rng.randint(3, 7)),)),
    Family("count_long_words", "s", "returns how many words of the string s (split on spaces) are longer than {k} "
           "characters", "return sum(len(w) > {k} for w in s.split())", _k(2, 5), lambda rng, c: (_text(rng),)),
    Family("value_range", "xs", "returns the largest number in the non-empty list xs minus the smallest",
           "return max(xs) - min(xs)", lambda rng: {}, lambda rng, c: (_ints(rng, rng.randint(2, 7)),)),
    Family("clip", "x", "returns x limited to the range {lo} to {hi}: {lo} if x is below {lo}, {hi} if x is above "
           "{hi}, else x", "return min(max(x, {lo}), {hi})", lambda rng: dict(zip(("lo", "hi"), sorted(
               rng.sample(range(-10, 40), 2)))), lambda rng, c: (rng.randint(-30, 60),)),
    Family("square_evens", "xs", "returns a list of the squares of the even numbers in the list xs, in order",
           "return [v * v for v in xs if v % 2 == 0]", lambda rng: {}, lambda rng, c: (_ints(rng, rng.randint(2, 6),
                                                                                                 -9, 9),)),
    Family("digit_sum", "n", "returns the sum of the decimal digits of the non-negative integer n",
           "return sum(int(d) for d in str(n))", lambda rng: {}, lambda rng, c: (rng.randint(0, 99999),)),
    Family("count_vowels", "s", "returns the number of vowels (a, e, i, o, u) in the lowercase string s",
           "return sum(ch in 'aeiou' for ch in s)", lambda rng: {}, lambda rng, c: (_text(rng),)),
    Family("last_items", "xs", "returns a list of the last {k} items of the list xs (all of xs if it is shorter)",
           "return xs[-{k}:]", _k(2, 4), lambda rng, c: (_ints(rng, rng.randint(1, 7)),)),
    Family("join_with", "words", "returns the strings in the list words joined with {sep!r} between them",
           "return {sep!r}.join(words)", lambda rng: {"sep": rng.choice(("-", ", ", "+", "_"))},
           lambda rng, c: (rng.sample(_WORDS, rng.randint(2, 4)),)),
    Family("shout", "s", "returns the string s in upper case followed by {n} exclamation marks",
           "return s.upper() + '{marks}'", lambda rng: {"n": (n := rng.randint(1, 3)), "marks": "!" * n},
           lambda rng, c: (rng.choice(_WORDS) + rng.choice(("", " " + rng.choice(string.ascii_lowercase))),)),
)


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def draw_cases(rng: random.Random, family: Family, constants: dict[str, Any], reference: Callable) -> list[tuple]:
    """TESTS_PER_PROBLEM argument tuples whose expected values are not all the same: tests that one value passes
    would reward `return <the example's value>` (the prompt shows it), so such draws are redrawn."""
    while True:
        cases = [family.arguments(rng, constants) for _ in range(TESTS_PER_PROBLEM)]
        if len({repr(reference(*args)) for args in cases}) >= 2:
            return cases


def make_problem(rng: random.Random, prompt_id: str) -> tuple[dict, dict]:
    """(prompt record, reference `human` trajectory record) of one problem drawn from `rng`."""
    family = rng.choice(FAMILIES)
    constants = family.constants(rng)
    solution = f"def {family.name}({family.params}):\n    {family.body.format(**constants)}\n"
    namespace: dict[str, Any] = {}
    exec(solution, namespace)  # our own generated reference code, never a model's
    reference = namespace[family.name]
    cases = draw_cases(rng, family, constants, reference)
    asserts = "".join(f"    assert candidate({', '.join(map(repr, args))}) == {reference(*args)!r}\n"
                      for args in cases)
    example = _call(family.name, cases[0])
    prompt = (f"Write a Python function `{family.name}({family.params})` that {family.describe.format(**constants)}."
              f"\nFor example, `{example}` returns `{reference(*cases[0])!r}`."
              "\nReply with the function in a ```python code block.")
    record = {
        "prompt_id": prompt_id, "task": "pyfunc", "prompt": prompt,
        "tests": {"program": f"def check(candidate):\n{asserts}", "entry_point": family.name},
        "time_limit_s": None, "memory_limit_mb": None,
        "metadata": {"dataset": "pyfunc", "family": family.name, "constants": constants},
    }
    human = {"prompt_id": prompt_id, "response": f"```python\n{solution}```", "source": "human", "reward": 0.0,
             "metadata": {"language": "python3", "dataset": "pyfunc", "label": "correct"}}
    return record, human


def load(path: str | None = None, *, n: int = 100, seed: int = 0, limit: int | None = None
         ) -> tuple[list[dict], list[dict]]:
    """Loader for `spolake prompts add --dataset pyfunc`: `n` problems generated from `seed` (`limit` caps n)."""
    if path is not None:
        raise InputError(f"pyfunc problems are generated, not read from a file (got path {path!r}); omit the path")
    rng = random.Random(seed)
    pairs = [make_problem(rng, f"pyfunc/{seed}/{i}") for i in range(n if limit is None else min(n, limit))]
    return [p for p, _ in pairs], [h for _, h in pairs]


@dataclass(frozen=True)
class PyFuncTask(HumanEvalTask):
    name: str = "pyfunc"

    def code_prefix(self, problem: Problem) -> str:
        return ""  # the prompt is instructions, not code: the response's code runs alone


TASK = PyFuncTask()
