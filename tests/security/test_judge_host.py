"""The judge's host side: a sample that reported in time is judged on its report even when this process was
frozen past the deadline (another thread held the GIL); responses too long to compile cheaply are not compiled on
the host; generated tasks hold no problem a constant answer passes."""
from __future__ import annotations

import ast
import signal
import subprocess
import sys
import time

import pytest

from spo_lake.tasks import Problem, SandboxOptions
from spo_lake.tasks.countdown import check_structure, draw_problem
from spo_lake.tasks.judge import judge_many
from spo_lake.tasks.pyfunc import load
from spo_lake.tasks.verifiers import MAX_CODE_CHARS
from tests.sandbox.conftest import requires_bwrap

CHILD = """
import sys
from spo_lake.sandbox import Sandbox
from spo_lake.sandbox.runner import Job, Limits
with Sandbox() as sandbox:
    sandbox.run(Job("print(1)"))
    for seconds in sys.argv[1:]:
        print("ready", flush=True)
        sys.stdin.readline()
        result = sandbox.run(Job(f"import time; time.sleep({seconds}); print('done')"), Limits(timeout_s=4.0))
        print(result.verdict, flush=True)
"""


@requires_bwrap
def test_a_report_waiting_when_the_host_wakes_past_the_deadline_is_judged_by_the_samples_own_clock():
    """The host process is stopped (SIGSTOP: a GIL held for seconds, made certain) while its sample runs: a sample
    that ended after 1 s of its 4 s is `ok`, one that slept 5 s is `timeout`, whenever the host reads them."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, "1", "5"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdin is not None and child.stdout is not None
    verdicts = []
    try:
        for _ in range(2):
            assert child.stdout.readline().strip() == "ready"
            child.stdin.write("go\n")
            child.stdin.flush()
            time.sleep(0.5)  # the sample has started; its report comes while the host is stopped
            child.send_signal(signal.SIGSTOP)
            time.sleep(6.5)
            child.send_signal(signal.SIGCONT)
            verdicts.append(child.stdout.readline().strip())
    finally:
        child.kill()
        child.wait()
    assert verdicts == ["ok", "timeout"]


def test_a_response_too_long_to_compile_cheaply_is_judged_without_compiling_it():
    prompts, _ = load(n=1, seed=0)
    hostile = 'x = f"' + "{1}" * 50_000 + '"'  # ~1.5 s of compile() holding the GIL on CPython 3.11
    assert len(hostile) > MAX_CODE_CHARS
    (verdict,) = judge_many([(Problem.from_row(prompts[0]), f"```python\n{hostile}\n```")], SandboxOptions(),
                            workers=1)
    assert verdict.verdict == "syntax" and f"longer than {MAX_CODE_CHARS}" in verdict.detail


def expected_values(program: str) -> list[str]:
    """The right-hand sides of `assert candidate(...) == VALUE` in a check program, as source text."""
    tree = ast.parse(program)
    return [ast.unparse(node.test.comparators[0]) for node in ast.walk(tree) if isinstance(node, ast.Assert)]


def test_no_generated_pyfunc_problem_is_passed_by_a_constant():
    for seed in range(6):
        prompts, _ = load(n=1000, seed=seed)
        for p in prompts:
            values = expected_values(p["tests"]["program"])
            assert len(values) == 5 and len(set(values)) >= 2, p["prompt_id"]


@requires_bwrap
def test_echoing_the_worked_example_fails():
    prompts, _ = load(n=6, seed=1)
    items = []
    for p in prompts:
        example = p["prompt"].split("` returns `", 1)[1].split("`.", 1)[0]
        name = p["tests"]["entry_point"]
        items.append((Problem.from_row(p), f"```python\ndef {name}(*args):\n    return {example}\n```"))
    assert [v.verdict for v in judge_many(items, SandboxOptions(), workers=2)] == ["wrong_answer"] * len(items)


@pytest.mark.parametrize("seed", range(3))
def test_no_countdown_problem_is_answered_by_its_target_alone(seed):
    import random

    rng = random.Random(seed)
    for _ in range(500):
        numbers, target = draw_problem(rng)
        assert target not in numbers
        assert not check_structure(str(target), numbers).ok
