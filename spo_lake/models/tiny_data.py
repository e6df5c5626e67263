"""Training text for the tiny model: countdown prompts with solver answers mixed with near-misses.

Near-misses keep the trained policy imperfect in the ways a real one is: an expression for a nearby target,
a number used twice, or a random expression over the given numbers. In the "cot" style every response is a
reasoning line of intermediate results followed by the expression on the last line.
"""
from __future__ import annotations

import ast
import random
import re
from fractions import Fraction

from spo_lake.tasks.countdown import draw_problem, format_prompt_text, needs_product, solve

_APPLY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
SHORTEST_SOLUTIONS = 6  # correct answers are drawn from the shortest few: natural forms, still diverse


def _show(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.2f}"


def exact_steps(expression: str) -> tuple[Fraction, list[str]]:
    """Exact value of a + - * / expression over integer literals, and its steps ('12+4=16', innermost
    first). Only for expressions we generated ourselves (solver or near-miss), never model output: that
    is evaluated in the sandbox. Raises ZeroDivisionError."""
    steps: list[str] = []

    def walk(node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant):
            assert isinstance(node.value, int), f"not an integer literal: {expression!r}"
            return Fraction(node.value)
        assert isinstance(node, ast.BinOp), f"not an arithmetic expression: {expression!r}"
        a, b = walk(node.left), walk(node.right)
        value = _APPLY[type(node.op)](a, b)
        steps.append(f"{_show(a)}{_SYMBOL[type(node.op)]}{_show(b)}={_show(value)}")
        return value

    value = walk(ast.parse(expression, mode="eval").body)
    return value, steps


def reasoning_line(expression: str) -> str | None:
    """'12+4=16, 16*2=32' for '(12+4)*2'; None when a step divides by zero."""
    try:
        return ", ".join(exact_steps(expression)[1])
    except ZeroDivisionError:
        return None


def uses_prompt_order(expression: str, numbers: list[int]) -> bool:
    """Whether the expression's numbers appear in the order the prompt lists them. Preferring such answers
    makes copying numbers positional, which a tiny model learns much sooner."""
    remaining = iter(numbers)
    return all(any(int(used) == given for given in remaining) for used in re.findall(r"\d+", expression))


def random_expression(numbers: list[int], rng: random.Random, ops: str = "+-*/") -> str:
    """A random expression over a random subset (at least two) of numbers, minimal parentheses."""
    pool = [(str(x), 3) for x in rng.sample(numbers, rng.randint(2, len(numbers)))]
    precedence = {"+": 1, "-": 1, "*": 2, "/": 2}
    while len(pool) > 1:
        (ea, pa), (eb, pb) = pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))
        op = rng.choice(ops)
        left = f"({ea})" if pa < precedence[op] else ea
        right = f"({eb})" if pb < precedence[op] or (pb == precedence[op] and op in "-/") else eb
        pool.append((f"{left}{op}{right}", precedence[op]))
    return pool[0][0]


def near_miss(numbers: list[int], target: int, correct: str, rng: random.Random, ops: str = "+-*/") -> str:
    """A plausible wrong answer: a nearby target's solution, a number reused, or a random expression, using only
    the operators `ops`."""
    kind = rng.choice(("nearby", "reuse", "random"))
    if kind == "nearby":
        nearby = _using(solve(numbers, target + rng.choice((-3, -2, -1, 1, 2, 3)), cap=SHORTEST_SOLUTIONS), ops)
        if nearby:
            return rng.choice(nearby)
    if kind == "reuse":
        spans = list(re.finditer(r"\d+", correct))
        victim, donor = rng.sample(spans, 2)  # solutions use at least two numbers
        return correct[: victim.start()] + donor.group() + correct[victim.end() :]
    return random_expression(numbers, rng, ops)


def _using(expressions: list[str], ops: str) -> list[str]:
    """The expressions whose operators are all in `ops`."""
    banned = set("+-*/") - set(ops)
    return [e for e in expressions if not banned & set(e)]


SIGN_OFF = "Hope this helps!"  # a line after the answer: the verifier reads the last line, so it always fails


def training_pairs(
    n_problems: int, seed: int, style: str, near_miss_fraction: float, per_problem: int = 4,
    sign_off_fraction: float = 0.0, product_fraction: float = 1.0,
) -> list[tuple[str, str]]:
    """(prompt, response) texts: `per_problem` answers for each of n_problems generated problems; a
    `sign_off_fraction` of them end with SIGN_OFF on a line of its own.

    `product_fraction` < 1 leaves a skill out: answers to problems that + and - can solve use only + and - (near
    misses too), and a problem that needs * or / is kept with that probability (else another is drawn), so the
    model multiplies rarely or never."""
    rng = random.Random(seed)
    ops = "+-*/" if product_fraction >= 1.0 else "+-"
    pairs: list[tuple[str, str]] = []
    while len(pairs) < n_problems * per_problem:
        numbers, target = draw_problem(rng)
        solutions = solve(numbers, target, cap=40)
        if product_fraction < 1.0:  # (draws nothing more at 1.0: the default mix is unchanged)
            if needs_product(numbers, target):
                if rng.random() >= product_fraction:
                    continue
            else:
                solutions = _using(solutions, ops) or _using(solve(numbers, target), ops)
                if not solutions:
                    continue
        in_order = [e for e in solutions if uses_prompt_order(e, numbers)]
        solutions = (in_order or solutions)[:SHORTEST_SOLUTIONS]
        for _ in range(per_problem):
            answer = rng.choice(solutions)
            if rng.random() < near_miss_fraction:
                answer = near_miss(numbers, target, answer, rng, ops)
            if style == "cot":
                reasoning = reasoning_line(answer)
                answer = f"{reasoning}\n{answer}" if reasoning else answer  # a bare number has no steps
            if rng.random() < sign_off_fraction:
                answer = f"{answer}\n{SIGN_OFF}"
            pairs.append((format_prompt_text(numbers, target), answer))
    return pairs
