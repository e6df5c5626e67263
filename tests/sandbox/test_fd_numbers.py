"""A sandbox started while the host holds a hundred files: its pipes then get numbers from 100 up, where the zygote
moves its own out of the way of the sample's 0-4. Moving them with dup2 to fixed numbers closed or clobbered one
passed as such a number, and correct programs were judged wrong ("unreadable message", "exit code 1") once a
long-running host (a test worker, a trainer judging for hours) had that many files open."""
import os
import shutil

import pytest

from spo_lake.tasks import Problem, SandboxOptions
from spo_lake.tasks.judge import judge_many
from spo_lake.tasks.pyfunc import load

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


def test_a_sandbox_started_when_the_hosts_fds_reach_100_judges_correctly():
    held = [os.open(os.devnull, os.O_RDONLY)]
    try:
        if held[0] > 99:
            pytest.skip("this process already holds more than 100 files")
        while held[-1] < 99:  # the next file (a new sandbox's first pipe) gets number 100
            held.append(os.open(os.devnull, os.O_RDONLY))
        prompts, humans = load(n=4, seed=0)
        problems = [Problem.from_row(p) for p in prompts]
        wrong = [h["response"].replace("return ", "return None if True else ", 1) for h in humans]
        items = [*zip(problems, [h["response"] for h in humans]), *zip(problems, wrong)]
        verdicts = judge_many(items, SandboxOptions(), workers=1)  # a fresh thread: a fresh sandbox
    finally:
        for fd in held:
            os.close(fd)
    assert [v.verdict for v in verdicts] == ["ok"] * 4 + ["wrong_answer"] * 4, [v.detail for v in verdicts]
