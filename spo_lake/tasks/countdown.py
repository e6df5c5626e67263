"""The built-in `countdown` task: reach a target from 3-4 numbers with + - * / and parentheses.

Prompt: a short instruction naming the numbers and the target. Response format: the answer is the LAST
non-empty line of the response (so a model may write reasoning lines first); surrounding backticks and a
trailing "= <value>" are ignored. That line must be a Python arithmetic expression over the given numbers,
each used at most once (any subset is allowed), with only + - * / and parentheses.

Verification is two-staged. The parent process only *parses* the answer with `ast` (structure: numbers and
the four operators; the multiset of numbers), and never evaluates it. The value is computed in the
sandbox, because the expression is model-generated code; `verify_many` evaluates many answers in ONE
sandboxed process to amortise its ~10-50 ms start-up.

Problems are generated, not downloaded: `make_problems(n, seed)` draws numbers in 1..20 and a target in
10..100 that a brute-force `solve` can reach, and supplies up to a few solver expressions as `human`
trajectories.
"""
from __future__ import annotations

import ast
import json
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from spo_lake.errors import InputError
from spo_lake.tasks.base import Problem, SandboxOptions, Verdict

MAX_ANSWER_CHARS = 200  # longer answers cannot be honest 4-number expressions; also bounds ast's work
TOLERANCE = 1e-6  # float division, e.g. 7/3*3 == 7.000000000000001
NUMBER_RANGE = (1, 20)
TARGET_RANGE = (10, 100)
SOLUTION_CAP = 100  # solver solutions counted per problem (metadata n_solutions is capped here)

_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def format_prompt_text(numbers: Sequence[int], target: int) -> str:
    listed = ", ".join(str(x) for x in numbers)
    return (
        f"Using the numbers {listed} (each at most once) and + - * / ( ), write an expression equal to {target}.\n"
        "Answer:"
    )


# ---------------------------------------------------------------------------------------------- solver
# Subset dynamic programme: values(mask) is every value reachable with exactly the numbers in `mask`;
# expressions are reconstructed top-down only for the target, so nothing explodes. Like the classic game,
# the solver keeps every intermediate value an integer (division only when exact): integer arithmetic keeps
# it fast and its solutions natural. The verifier is more lenient and accepts any expression of the right value.


def _combine(a: int, b: int) -> list[tuple[str, int]]:
    out = [("+", a + b), ("-", a - b), ("*", a * b)]
    if b != 0 and a % b == 0:
        out.append(("/", a // b))
    return out


def _wrap(expr: str, prec: int, op: str, right: bool) -> str:
    need = prec < _PRECEDENCE[op] or (right and prec == _PRECEDENCE[op] and op in "-/")
    return f"({expr})" if need else expr


@lru_cache(maxsize=4096)
def _values(numbers: tuple[int, ...], mask: int) -> frozenset[int]:
    bits = [i for i in range(len(numbers)) if mask >> i & 1]
    if len(bits) == 1:
        return frozenset({numbers[bits[0]]})
    out: set[int] = set()
    for left, right in _splits(mask):
        if left > right:
            continue  # each unordered split once; both orders of - and / are added below
        right_values = _values(numbers, right)
        for a in _values(numbers, left):
            for b in right_values:
                out.update((a + b, a - b, b - a, a * b))
                if b != 0 and a % b == 0:
                    out.add(a // b)
                if a != 0 and b % a == 0:
                    out.add(b // a)
    return frozenset(out)


def _splits(mask: int) -> list[tuple[int, int]]:
    """Ordered (left, right) partitions of mask into two non-empty parts (both orders: - and / are not symmetric)."""
    out, sub = [], (mask - 1) & mask
    while sub:
        out.append((sub, mask ^ sub))
        sub = (sub - 1) & mask
    return out


def _partners(a: int, op: str, value: int, candidates: frozenset[int]) -> list[int]:
    """Every b in candidates with `a op b == value` under the solver's rules, found by inverting op."""
    if op == "+":
        wanted = [value - a]
    elif op == "-":
        wanted = [a - value]
    elif op == "*":
        if a == 0:
            return sorted(candidates) if value == 0 else []
        wanted = [value // a] if value % a == 0 else []
    elif value == 0:  # a / b == 0 exactly only for a == 0
        return sorted(b for b in candidates if b != 0) if a == 0 else []
    else:
        wanted = [a // value] if a % value == 0 else []
    return [b for b in wanted if b in candidates and (op != "/" or (b != 0 and a % b == 0 and a // b == value))]


def _expressions(numbers: tuple[int, ...], mask: int, value: int, cap: int) -> list[tuple[str, int]]:
    """Up to `cap` (expression, precedence) pairs using exactly the numbers in mask and equal to value."""
    bits = [i for i in range(len(numbers)) if mask >> i & 1]
    if len(bits) == 1:
        return [(str(numbers[bits[0]]), 3)] if numbers[bits[0]] == value else []
    out: dict[str, int] = {}
    for left, right in _splits(mask):
        right_values = _values(numbers, right)
        for a in _values(numbers, left):
            for op in "+-*/":
                if op in "+*" and left > right:  # commutative ops: one order only
                    continue
                for b in _partners(a, op, value, right_values):
                    for ea, pa in _expressions(numbers, left, a, cap):
                        for eb, pb in _expressions(numbers, right, b, cap):
                            out.setdefault(f"{_wrap(ea, pa, op, False)}{op}{_wrap(eb, pb, op, True)}", _PRECEDENCE[op])
                            if len(out) >= cap:
                                return list(out.items())
    return list(out.items())


def reachable(numbers: Sequence[int]) -> set[int]:
    """Every value an expression with integer intermediates over a non-empty subset of `numbers` reaches."""
    key = tuple(numbers)
    return set().union(*(_values(key, mask) for mask in range(1, 1 << len(key))))


def solve(numbers: Sequence[int], target: int, cap: int = SOLUTION_CAP) -> list[str]:
    """Distinct expressions (up to `cap`, shortest first) over numbers (each at most once) equal to target."""
    key, goal = tuple(numbers), int(target)
    found: set[str] = set()
    # Fewer numbers first: short solutions are found before the cap is hit.
    for mask in sorted(range(1, 1 << len(key)), key=lambda m: bin(m).count("1")):
        if goal in _values(key, mask):
            found.update(e for e, _ in _expressions(key, mask, goal, cap - len(found)))
        if len(found) >= cap:
            break
    return sorted(found, key=lambda e: (len(e), e))


def needs_product(numbers: Sequence[int], target: int) -> bool:
    """Whether every solution multiplies or divides: + and - alone reach only the signed sums of a subset of the
    numbers (any sign pattern: a - (b - c) = a - b + c), and `target` is none of them. The skill the demo's
    skill-gap π0 was rarely taught (docs/results-skill-gap.md)."""
    sums = {0}
    for x in numbers:
        sums |= {v + x for v in sums} | {v - x for v in sums}
    return int(target) not in sums


# ---------------------------------------------------------------------------------------------- problems


def draw_problem(rng: random.Random) -> tuple[list[int], int]:
    """Numbers in NUMBER_RANGE; a target drawn from a random expression tree, so targets with many
    solutions (moderate difficulty) are likelier than targets with a single contrived one."""
    while True:
        numbers = [rng.randint(*NUMBER_RANGE) for _ in range(rng.choice((3, 4)))]
        pool = rng.sample(numbers, rng.randint(2, len(numbers)))
        while len(pool) > 1:
            a, b = pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))
            pool.append(rng.choice(_combine(a, b))[1])
        value = pool[0]
        if TARGET_RANGE[0] <= value <= TARGET_RANGE[1] and value not in numbers:
            return numbers, value


def make_problems(n: int, seed: int, solutions_per_prompt: int = 3) -> tuple[list[dict], list[dict]]:
    """`n` problems, deterministic for `seed`: (prompt records, `human` trajectory records from the solver)."""
    rng = random.Random(seed)
    prompts, trajectories = [], []
    for i in range(n):
        numbers, target = draw_problem(rng)
        solutions = solve(numbers, target, cap=SOLUTION_CAP)
        prompt_id = f"countdown/{seed}/{i}"
        prompts.append(
            {
                "prompt_id": prompt_id,
                "task": "countdown",
                "prompt": format_prompt_text(numbers, target),
                "tests": {"numbers": numbers, "target": target},
                "time_limit_s": 2.0,
                "memory_limit_mb": 256,
                "metadata": {"seed": seed, "index": i, "n_solutions": len(solutions)},
            }
        )
        for expression in rng.sample(solutions, min(solutions_per_prompt, len(solutions))):
            trajectories.append(
                {
                    "prompt_id": prompt_id,
                    "response": expression,
                    "source": "human",
                    "reward": 0.0,
                    "metadata": {"solver": "countdown.solve"},
                }
            )
    return prompts, trajectories


def load(
    path: str | None = None, *, n: int = 1000, seed: int = 0, limit: int | None = None
) -> tuple[list[dict], list[dict]]:
    """Loader entry point for `spolake prompts add --dataset countdown`: problems are generated, so `path`
    must be None; `limit` caps n."""
    if path is not None:
        raise InputError(f"countdown problems are generated, not read from a file (got path {path!r}); omit the path")
    return make_problems(n if limit is None else min(n, limit), seed)


# ---------------------------------------------------------------------------------------------- verifier


def extract_answer(response: str) -> str:
    """The answer line of a response: its last non-empty line, without backticks or a trailing '= value'."""
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    answer = lines[-1].strip("`").strip() if lines else ""
    return answer.split("=", 1)[0].strip()


@dataclass(frozen=True)
class Check:
    """Outcome of the structural check in the parent process; `ok` means 'safe and legal: evaluate it'."""

    ok: bool
    verdict: str = ""
    detail: str = ""


def check_structure(expression: str, numbers: Sequence[int]) -> Check:
    """Parse-only check: numbers and + - * / only, each given number used at most once (as a multiset)."""
    if not expression:
        return Check(False, "syntax", "empty answer")
    if len(expression) > MAX_ANSWER_CHARS:
        return Check(False, "syntax", f"answer longer than {MAX_ANSWER_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return Check(False, "syntax", f"not a Python expression: {type(exc).__name__}")
    used: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) not in _OPS:
            return Check(False, "syntax", f"disallowed operator: {type(node.op).__name__}")
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.operator)):
            return Check(False, "syntax", f"disallowed construct: {type(node).__name__}")
    extra = Counter(used) - Counter(numbers)
    if extra:
        return Check(False, "wrong_answer", f"numbers not available: {sorted(extra.elements())}")
    return Check(True)


# Runs inside the sandbox: reads a JSON list of expressions on stdin, evaluates each in isolation with no
# builtins, prints one JSON list of [value, error] pairs. Structure was already checked by the parent.
_HARNESS = """
import json, sys
results = []
for expression in json.loads(sys.stdin.read()):
    try:
        results.append([float(eval(compile(expression, "<answer>", "eval"), {"__builtins__": {}}, {})), None])
    except Exception as exc:
        results.append([None, type(exc).__name__])
print(json.dumps(results))
"""


class CountdownTask:
    name = "countdown"
    chunk_size = 512  # expressions per sandboxed process in verify_many

    def format_prompt(self, problem: Problem) -> str:
        return problem.prompt

    def verifier_name(self, problem: Problem) -> str:
        return "countdown"

    def verify(self, problem: Problem, response: str, options: SandboxOptions) -> Verdict:
        return self.verify_many([(problem, response)], options)[0]

    def verify_many(self, items: Sequence[tuple[Problem, str]], options: SandboxOptions) -> list[Verdict]:
        """Judge many (problem, response) pairs; the structurally legal answers are evaluated in sandboxed
        batches of `chunk_size`, each expression in its own try/except."""
        verdicts: list[Verdict | None] = [None] * len(items)
        pending: list[tuple[int, str]] = []
        for i, (problem, response) in enumerate(items):
            answer = extract_answer(response)
            check = check_structure(answer, problem.tests["numbers"])
            if check.ok:
                pending.append((i, answer))
            else:
                verdicts[i] = Verdict(
                    False, check.verdict, detail=check.detail, extracted_code=answer[:MAX_ANSWER_CHARS]
                )
        for start in range(0, len(pending), self.chunk_size):
            chunk = pending[start : start + self.chunk_size]
            for (i, answer), verdict in zip(chunk, _evaluate_in_sandbox([a for _, a in chunk], options)):
                verdicts[i] = _judge(items[i][0].tests["target"], answer, verdict)
        return [v for v in verdicts if v is not None]


@dataclass(frozen=True)
class _Evaluated:
    """One expression's value from the sandbox, or why there is none."""

    value: float | None
    verdict: str
    detail: str
    duration_s: float


def _evaluate_in_sandbox(expressions: list[str], options: SandboxOptions) -> list[_Evaluated]:
    from spo_lake.sandbox import run_python

    started = time.perf_counter()
    result = run_python(
        _HARNESS, stdin=json.dumps(expressions), timeout_s=options.timeout_s, memory_mb=options.memory_mb,
        mode=options.mode,
    )
    share = (time.perf_counter() - started) / len(expressions)
    if result.verdict != "ok":
        # The whole batch failed (e.g. timeout); every answer in it gets that verdict.
        detail = f"sandbox: {result.verdict} {result.stderr.strip()[-200:]}".strip()
        return [_Evaluated(None, result.verdict, detail, share) for _ in expressions]
    try:
        values = json.loads(result.stdout)
        assert isinstance(values, list) and len(values) == len(expressions)
        assert all(isinstance(v, list) and len(v) == 2 and (v[0] is None or type(v[0]) is float) for v in values)
    except (ValueError, AssertionError, RecursionError):  # read defensively, like everything from the sandbox
        return [_Evaluated(None, "sandbox_error", "unreadable harness output", share) for _ in expressions]
    return [
        _Evaluated(value, "ok", "", share) if error is None else _Evaluated(None, "runtime_error", str(error), share)
        for value, error in values
    ]


def _judge(target: int, answer: str, evaluated: _Evaluated) -> Verdict:
    common: dict[str, Any] = {"duration_s": evaluated.duration_s, "extracted_code": answer}
    if evaluated.value is None:
        return Verdict(False, evaluated.verdict, detail=evaluated.detail, **common)
    if abs(evaluated.value - target) <= TOLERANCE:
        return Verdict(True, "ok", detail=f"= {target}", **common)
    return Verdict(False, "wrong_answer", detail=f"= {evaluated.value:g}, not {target}", **common)


TASK = CountdownTask()

__all__ = [
    "TASK", "CountdownTask", "check_structure", "draw_problem", "extract_answer", "load", "make_problems", "reachable",
    "solve",
]
