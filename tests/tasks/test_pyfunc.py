"""pyfunc: generated problems are deterministic, their reference solutions pass the sandboxed check, and wrong or
missing functions fail it."""
import pytest

from spo_lake.errors import InputError
from spo_lake.tasks import Problem, SandboxOptions
from spo_lake.tasks.judge import judge_many
from spo_lake.tasks.pyfunc import FAMILIES, TESTS_PER_PROBLEM, load


def test_problems_are_a_function_of_the_seed():
    assert load(n=12, seed=3) == load(n=12, seed=3)
    assert load(n=12, seed=3)[0] != load(n=12, seed=4)[0]
    assert load(n=12, seed=3, limit=5)[0] == load(n=5, seed=3)[0]
    prompts, _ = load(n=12, seed=3)
    assert [p["prompt_id"] for p in prompts] == [f"pyfunc/3/{i}" for i in range(12)]
    for p in prompts:
        name = p["tests"]["entry_point"]
        assert p["prompt"].startswith(f"Write a Python function `{name}(") and "```python" in p["prompt"]
        assert p["tests"]["program"].count("assert candidate(") == TESTS_PER_PROBLEM


def test_a_path_is_refused():
    with pytest.raises(InputError, match="generated"):
        load("problems.jsonl")


def test_reference_solutions_pass_and_wrong_or_missing_functions_fail():
    prompts, humans = load(n=len(FAMILIES) * 3, seed=0)  # every family, most likely
    problems = [Problem.from_row(p) for p in prompts]
    wrong = [h["response"].replace("return ", "return None if True else ", 1) for h in humans]
    items = [*zip(problems, [h["response"] for h in humans]), *zip(problems, wrong),
             (problems[0], "```python\ndef unrelated(x):\n    return x\n```")]
    verdicts = judge_many(items, SandboxOptions(), workers=2)
    n = len(problems)
    assert [v.verdict for v in verdicts[:n]] == ["ok"] * n
    assert [v.verdict for v in verdicts[n:2 * n]] == ["wrong_answer"] * n
    assert verdicts[-1].verdict == "runtime_error"  # the entry point is never defined
