"""Ordinary runs through the real sandbox: stdio, exit codes, errors, limits, reuse, the pool, mode none."""
from __future__ import annotations

import os
import time

import pytest

from spo_lake.sandbox import CallFailed, Job, Limits, Sandbox, SandboxPool, SandboxUnavailable, run_many, run_python
from spo_lake.sandbox.seccomp import seccomp_filter

from .conftest import descendants, requires_bwrap

pytestmark = requires_bwrap


def test_stdin_is_echoed():
    result = run_python("import sys\nsys.stdout.write(sys.stdin.read().upper())", stdin="héllo\nworld\n")
    assert (result.verdict, result.exit_code, result.stdout) == ("ok", 0, "HÉLLO\nWORLD\n")
    assert 0 < result.wall_s


def test_large_stdin_reaches_the_program():
    numbers = " ".join(str(i) for i in range(200_000))
    result = run_python("print(sum(map(int, input().split())))", stdin=numbers)
    assert result.stdout.strip() == str(sum(range(200_000)))


@pytest.mark.parametrize("source, exit_code", [("import sys; sys.exit(3)", 3), ("exit(0)", 0), ("raise SystemExit('no')", 1),
                                               ("import os; os._exit(7)", 7)])
def test_exit_codes(source: str, exit_code: int):
    result = run_python(source)
    assert result.exit_code == exit_code
    assert result.verdict == ("ok" if exit_code == 0 else "runtime_error")


def test_syntax_error_is_a_runtime_error_with_its_traceback():
    result = run_python("def f(:\n    pass\n")
    assert result.verdict == "runtime_error"
    assert "SyntaxError" in result.stderr and result.detail.startswith("SyntaxError")


def test_exception_traceback_shows_the_program_not_the_harness():
    result = run_python("def f():\n    return 1 / 0\nf()\n")
    assert result.verdict == "runtime_error"
    assert 'File "solution.py", line 2, in f' in result.stderr and "harness" not in result.stderr
    assert result.detail == "ZeroDivisionError: division by zero"


def test_threads_atexit_and_unflushed_output_complete_like_a_script():
    source = (
        "import atexit, threading, sys, time\n"
        "atexit.register(lambda: print('atexit'))\n"
        "threading.stack_size(1 << 26)\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
        "sys.setrecursionlimit(10 ** 6)\n"
        "def depth(n): return 0 if n == 0 else 1 + depth(n - 1)\n"
        "print(depth(50_000), end=' ')\n"
    )
    result = run_python(source)
    assert result.verdict == "ok", result.stderr
    assert result.stdout.split() == ["50000", "thread", "atexit"]


def test_timeout_and_memory_verdicts():
    slow = run_python("while True:\n    pass\n", timeout_s=0.5)
    assert slow.verdict == "timeout" and slow.wall_s >= 0.5  # the clock runs from the program's start: never less
    hungry = run_python("x = bytearray(300 << 20)\n", memory_mb=128)
    assert hungry.verdict == "memory" and "MemoryError" in hungry.stderr
    enough = run_python("x = bytearray(64 << 20)\nprint(len(x))", memory_mb=256)
    assert enough.verdict == "ok" and enough.stdout.strip() == str(64 << 20)


def test_runs_of_one_sandbox_do_not_see_each_other(sandbox: Sandbox):
    """Files and globals of one run are gone in the next: each run is a fresh process in a wiped directory."""
    first = sandbox.run(Job("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd(), os.listdir('.'))"))
    second = sandbox.run(Job("import os\nprint(os.getcwd(), sorted(os.listdir('.')))"))
    assert first.verdict == second.verdict == "ok"
    assert "left.txt" in first.stdout and "left.txt" not in second.stdout


def test_sandbox_is_reused_and_every_run_gets_the_same_limits(sandbox: Sandbox):
    sandbox.run(Job("pass"))
    pid = sandbox.pid
    results = [sandbox.run(Job("import resource\nprint(resource.getrlimit(resource.RLIMIT_AS))"), Limits(memory_mb=300))
               for _ in range(3)]
    assert sandbox.pid == pid
    assert {r.stdout for r in results} == {f"({300 << 20}, {300 << 20})\n"}


def test_sessions_call_functions_with_data_and_failures_stick(sandbox: Sandbox):
    source = "class Solution:\n    def twice(self, x):\n        return (x, [x], {x: {x}})\n"
    with sandbox.session(source, "twice", Limits(timeout_s=30)) as session:
        assert session.call(4) == (4, [4], {4: {4}})
        assert session.call_many([[1], ["a"]]) == [(1, [1], {1: {1}}), ("a", ["a"], {"a": {"a"}})]
    with sandbox.session("x = 1\n", "twice") as missing:
        with pytest.raises(CallFailed, match="runtime_error.*twice"):
            missing.call(4)
    with sandbox.session("def twice(x):\n    exit(0)\n", "twice") as early:
        with pytest.raises(CallFailed) as failure:
            early.call(4)
        assert failure.value.verdict == "runtime_error"
        with pytest.raises(CallFailed):
            early.call(5)  # sticky: the session is over


def test_run_many_keeps_order_and_closes_its_sandboxes():
    jobs = [Job(f"import time\ntime.sleep({0.02 * (i % 3)})\nprint({i})") for i in range(12)]
    results = run_many(jobs, workers=2)
    assert [(r.verdict, r.stdout.strip()) for r in results] == [("ok", str(i)) for i in range(12)], results


def test_pool_map_runs_functions_on_worker_sandboxes_and_cleans_up():
    """Each result carries its verdict: an empty output is never silent (issue 30 saw empty strings under load)."""
    before = _bwrap_children()
    with SandboxPool(workers=2) as pool:
        results = list(pool.map(lambda n: run_python(f"print({n} * {n})"), range(8)))
        # one sandbox per worker thread that took an item, reused (a loaded machine may hand every item to one)
        assert 1 <= len(_bwrap_children() - before) <= 2
    assert [(r.verdict, r.stdout.strip()) for r in results] == [("ok", str(n * n)) for n in range(8)], \
        [(r.verdict, r.detail, r.wall_s) for r in results]
    deadline = time.monotonic() + 60  # a generous bound: the sandboxes die with their threads, at once when idle
    while _bwrap_children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _bwrap_children() - before


def test_mode_none_runs_without_isolation_and_warns(tmp_path):
    (tmp_path / "host.txt").write_text("visible")
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        sandbox = Sandbox("none")
    with sandbox:
        result = sandbox.run(Job(f"print(open({str(tmp_path / 'host.txt')!r}).read())"))
    assert (result.verdict, result.stdout) == ("ok", "visible\n")


def test_unknown_mode_and_missing_bwrap_are_clear_errors(monkeypatch: pytest.MonkeyPatch, tmp_path):
    with pytest.raises(ValueError, match="unknown sandbox mode 'docker'"):
        Sandbox("docker")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        Sandbox().run(Job("print(1)"))


def test_seccomp_filter_is_whole_instructions_and_only_for_known_machines():
    program = seccomp_filter("x86_64")
    assert program is not None and len(program) % 8 == 0 and len(program) // 8 < 4096
    assert seccomp_filter("sparc64") is None


def _bwrap_children() -> set[int]:
    """This process's direct children that are bwrap: one per live sandbox."""
    found = set()
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
                if parent == os.getpid() and cmdline.read().split(b"\0")[0].endswith(b"bwrap"):
                    found.add(pid)
        except (OSError, ValueError):
            continue
    return found
