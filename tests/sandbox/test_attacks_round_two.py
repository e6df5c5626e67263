"""Issue 28's attacks: processes that outlive their sample, clean-up charged to the next sample, covert channels,
socket families, and a host that must stay small and never raise.

Every hostile program is followed, on the same sandbox, by an honest control: it must still be judged correctly and
within its own limit (1.5 s for a program that needs milliseconds; before the fixes, a clean-up of 2 s was charged
to it).
"""
from __future__ import annotations

import platform
import textwrap
import tracemalloc

import pytest

from spo_lake.sandbox import Job, Limits, Sandbox
from spo_lake.tasks.verifiers import tokens_match, values_match, verify_call, verify_stdio

from .conftest import descendants, requires_bwrap

pytestmark = requires_bwrap
GENEROUS_S = 60.0  # the limit where a test is not about time
HONEST = textwrap.dedent("""
    import threading
    out = []
    worker = threading.Thread(target=lambda: out.append(sum(range(1000))))
    worker.start()
    worker.join()
    open("scratch.txt", "w").write(str(out))
    print(out[0])
    """)
HONEST_LIMITS = Limits(timeout_s=1.5)
CLONE = {"x86_64": 56, "aarch64": 220}.get(platform.machine().lower(), -1)


def assert_honest_control(sandbox: Sandbox) -> None:
    """The next honest sample on this sandbox: correct, and within its limit (it starts a thread and writes a file)."""
    result = sandbox.run(Job(HONEST), HONEST_LIMITS)
    assert (result.verdict, result.stdout) == ("ok", "499500\n"), result


def hostile(sandbox: Sandbox, source: str) -> str:
    """Run a hostile program (its verdict is whatever it is), then the honest control; the hostile program's stdout."""
    result = sandbox.run(Job(textwrap.dedent(source)), Limits(timeout_s=GENEROUS_S))
    assert_honest_control(sandbox)
    return result.stdout


# ----------------------------------------------------------------------------------------------- 1 and 2: leftovers

CLONE_PARENT_CHILDREN = f"""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    made, errno = 0, 0
    for _ in range(200):
        pid = libc.syscall({CLONE}, 0x8000 | 17, 0, 0, 0, 0)  # CLONE_PARENT | SIGCHLD: a child of the zygote
        if pid == 0:
            os._exit(0)
        if pid < 0:
            errno = ctypes.get_errno()
            break
        made += 1
    print(made, errno)
    """


def test_children_made_with_clone_parent_are_refused_and_the_next_sample_is_unharmed(sandbox: Sandbox):
    sandbox.run(Job("pass"))
    baseline = len(descendants(sandbox.pid))
    for _ in range(2):  # zombies left by the first would fill the sandbox's pids group for the second
        refused = sandbox.run(Job(textwrap.dedent(CLONE_PARENT_CHILDREN)), Limits(timeout_s=GENEROUS_S))
        assert refused.stdout == "0 1\n", refused  # nothing made: EPERM
        assert len(descendants(sandbox.pid)) == baseline  # the same sandbox, no zombie of the zygote in it
        assert_honest_control(sandbox)


def test_the_zygote_reaps_children_it_did_not_fork():
    """The second line behind seccomp: mode none has no filter, so CLONE_PARENT works there and makes zombies of the
    zygote, which it must reap (bwrap mode: its pid namespace's leftovers must all be gone, or it is replaced)."""
    with pytest.warns(RuntimeWarning):
        unsandboxed = Sandbox("none")
    with unsandboxed:
        made = unsandboxed.run(Job(textwrap.dedent(CLONE_PARENT_CHILDREN)), Limits(timeout_s=GENEROUS_S))
        assert made.verdict == "ok" and int(made.stdout.split()[0]) > 0, made
        assert_honest_control(unsandboxed)
        assert descendants(unsandboxed.pid) == []  # no zombie left below the zygote: every child reaped


def test_a_slow_clean_up_is_not_charged_to_the_next_sample(sandbox: Sandbox):
    """A session's sample is stopped lazily (its clean-up overlaps the host's next work) after it left processes
    and files; the next run's clock starts when its own process starts."""
    mess = textwrap.dedent("""
        import os
        def leave_a_mess(n):
            for i in range(n):
                open(f"f{i}", "w").close()
                if os.fork() == 0:
                    os.setsid()
                    os.execv("/bin/sleep", ["sleep", "60"])
            return n
        """)
    with sandbox.session(mess, "leave_a_mess", Limits(timeout_s=GENEROUS_S, max_processes=64)) as session:
        assert session.call(20) == 20
    assert_honest_control(sandbox)


# ----------------------------------------------------------------------------------------------- 3: covert channels

def test_shared_state_syscalls_are_refused(sandbox: Sandbox):
    """Locks and watches on the read-only files every sandbox shares are channels between concurrent samples
    (16 of 16 bits passed with flock); page-cache probes of those files are one too."""
    source = """
        import ctypes, errno, fcntl, os, struct
        libc = ctypes.CDLL(None, use_errno=True)
        shared = os.open("/usr/bin", os.O_RDONLY)
        library = os.open(os.__file__, os.O_RDONLY)
        lock = struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0)

        def attempt(name, call):
            try:
                call()
                print(name, "allowed")
            except OSError as error:
                print(name, errno.errorcode.get(error.errno, error.errno))

        def raw(number, *args):
            ctypes.set_errno(0)
            if libc.syscall(number, *args) < 0:
                raise OSError(ctypes.get_errno(), "refused")

        attempt("flock", lambda: fcntl.flock(library, fcntl.LOCK_SH))
        attempt("fcntl_lock", lambda: fcntl.fcntl(library, fcntl.F_SETLK, lock))
        attempt("fcntl_getlk", lambda: fcntl.fcntl(library, fcntl.F_GETLK, lock))
        attempt("ofd_lock", lambda: fcntl.fcntl(library, 37, lock))
        attempt("dnotify", lambda: fcntl.fcntl(shared, 1026, 0x80000001))
        attempt("inotify", lambda: raw(INOTIFY_INIT1, 0))
        attempt("fanotify", lambda: raw(FANOTIFY_INIT, 0, 0))
        attempt("cachestat", lambda: raw(451, library, 0, 0, 0))
        attempt("nowait_read", lambda: os.preadv(library, [bytearray(16)], 0, os.RWF_NOWAIT))
        attempt("plain_read", lambda: os.preadv(library, [bytearray(16)], 0))
        attempt("fcntl_flags", lambda: fcntl.fcntl(library, fcntl.F_GETFL))
        """
    numbers = {"x86_64": (294, 300), "aarch64": (26, 262)}[platform.machine().lower()]
    source = source.replace("INOTIFY_INIT1", str(numbers[0])).replace("FANOTIFY_INIT", str(numbers[1]))
    outcomes = dict(line.split(" ", 1) for line in hostile(sandbox, source).splitlines())
    allowed = {name for name, outcome in outcomes.items() if outcome == "allowed"}
    assert allowed == {"plain_read", "fcntl_flags"} and len(outcomes) == 11, outcomes
    assert {outcomes[name] for name in outcomes.keys() - allowed} == {"EPERM"}, outcomes


# ----------------------------------------------------------------------------------------------- 4: socket families

def test_only_unix_sockets_can_be_created(sandbox: Sandbox):
    """Created only, never connected: AF_VSOCK would address a virtual machine's host, which no namespace covers."""
    source = """
        import socket
        families = {"unix": 1, "inet": 2, "inet6": 10, "netlink": 16, "packet": 17, "vsock": 40, "bluetooth": 31,
                    "alg": 38, "can": 29, "rds": 21, "tipc": 30, "xdp": 44, "unknown": 4242}
        for name, family in families.items():
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW):
                try:
                    socket.socket(family, kind).close()
                    print(name, kind, "created")
                except OSError as error:
                    print(name, kind, error.errno)
            try:
                a, b = socket.socketpair(family, socket.SOCK_STREAM)
                print(name, "pair", "created")
            except OSError as error:
                print(name, "pair", error.errno)
        """
    lines = hostile(sandbox, source).splitlines()
    assert len(lines) == 13 * 4, lines
    created = {tuple(line.split()[:2]) for line in lines if line.endswith("created")}
    assert created <= {("unix", "1"), ("unix", "2"), ("unix", "3"), ("unix", "pair")} and ("unix", "pair") in created
    assert all(line.endswith(" 97") for line in lines if not line.startswith("unix")), lines  # EAFNOSUPPORT


# ----------------------------------------------------------------------------------------------- 5: the host

OUTPUT_CAP = Limits().max_output_bytes
HOST_BUDGET = 8 * OUTPUT_CAP


def peak_bytes(judge) -> tuple[object, int]:
    """What `judge()` returns, and the most memory the host's Python allocated meanwhile (tracemalloc)."""
    tracemalloc.start()
    try:
        return judge(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("payload", ["[]", "{}", '{"t":[]}', "1", "1.5", '""'])
def test_a_reply_line_of_tiny_values_costs_the_host_little(payload: str):
    """16 MiB of one small value repeated, as the reply of a call: rejected before it is parsed."""
    program = textwrap.dedent(f"""
        import os
        def f():
            line = b'{{"value":[' + {payload.encode() + b","!r} * ({OUTPUT_CAP} // {len(payload) + 1} - 4) + b'0]}}'
            os.write(4, line + b"\\n")
        """)
    verdict, peak = peak_bytes(lambda: verify_call(program, "f", [{"input": [], "output": 0}], timeout_s=GENEROUS_S))
    assert not verdict.passed and verdict.verdict == "wrong_answer", verdict
    assert peak <= HOST_BUDGET, f"{peak / 2**20:.0f} MiB"


def test_the_largest_acceptable_reply_stays_within_the_budget(sandbox: Sandbox):
    """Just under the value cap, in the costliest shape measured (one-item lists: two lists parsed and two decoded
    per three values), received, decoded and compared; under a 2 MiB cap (the bound scales with it) to stay fast."""
    limits = Limits(timeout_s=GENEROUS_S, max_output_bytes=2 << 20)
    program = f"def f():\n    return [[[]] for _ in range({limits.max_output_bytes} // 16 // 3 - 16)]\n"

    def judge() -> bool:
        with sandbox.session(program, "f", limits) as session:
            return values_match(session.call(), [0])

    matched, peak = peak_bytes(judge)
    assert matched is False
    assert peak <= 8 * limits.max_output_bytes, f"{peak / 2**20:.1f} MiB"


def test_sixteen_mebibytes_of_words_cost_the_host_little():
    program = f"import sys\nsys.stdout.write('ab ' * ({OUTPUT_CAP} // 3))\n"
    verdict, peak = peak_bytes(lambda: verify_stdio(program, [{"input": "", "output": "ab ab"}],
                                                    timeout_s=GENEROUS_S))
    assert verdict.verdict == "wrong_answer", verdict
    assert peak <= HOST_BUDGET, f"{peak / 2**20:.0f} MiB"


def test_an_int_beyond_any_float_is_a_wrong_answer_not_an_error():
    verdict = verify_call("def f():\n    return 10 ** 400\n", "f", [{"input": [], "output": 1.5}],
                          timeout_s=GENEROUS_S)
    assert (verdict.passed, verdict.verdict) == (False, "wrong_answer"), verdict
    assert not verify_stdio(f"print({10 ** 400})", [{"input": "", "output": "1.5"}], timeout_s=GENEROUS_S).passed


WIRE_VALUES = [10 ** 400, -10 ** 4000, float("inf"), float("-inf"), float("nan"), 1e308, 0, True, None, "1.5", b"x",
               (10 ** 400,), [10 ** 400, float("nan")], {10 ** 400: 1.5}, {(1, 2): [1.5]}, frozenset({10 ** 400}),
               {float("nan")}, [[[[]]]], {"a": 10 ** 400}]
EXPECTED_VALUES = [1.5, 0.0, -1e-300, 1e308, [1.5], [1.5, 1.5], {"a": 1.5}, {"10": 1.5}, "x", 3, None, True, [[[[]]]]]


def test_no_comparison_raises_on_any_value_the_wire_carries():
    for actual in WIRE_VALUES:
        for expected in EXPECTED_VALUES:
            assert values_match(actual, expected) in (True, False)
            assert values_match([actual], expected) in (True, False)
    for token in ["1" * 5000, "1e999", "-1e999", "nan", "inf", "0x10", "1_0", "٣", "1.5"]:
        for expected in ["1.5", "1e308", "0", "nan", "x", "1" * 400]:
            assert tokens_match(token, expected) in (True, False)


def test_tokens_are_those_of_str_split():
    text = " a\tb\x1cc\u2003d\x85e\u200bf\n\n g\u3000h "
    assert tokens_match(text, " ".join(text.split())) and not tokens_match(text, " ".join(text.split()[:-1]))
    assert not tokens_match(text + " extra", " ".join(text.split()))
    assert tokens_match("0.3333333", "0.333333") and not tokens_match("1000001", "1000000")


COPYCAT = """
    import os
    with open("/proc/sys/kernel/ns_last_pid") as f:
        last_pid = int(f.read())
    fd = os.open("probe", os.O_CREAT | os.O_WRONLY)
    print(os.getpid() % 1000, last_pid % 1000, os.fstat(fd).st_ino % 1000)
    """


def test_a_sample_cannot_pass_a_number_to_the_next_through_the_pid_or_inode_counters():
    """A first sample sets the pid namespace's and the tmpfs's counters to its answer (mod 1000); what the next sees
    must not depend on the answer (it may learn that the sandbox was replaced: one bit, see docs/sandbox.md)."""
    setter = """
        import os
        while True:  # burn pids until the next is the answer
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            if (pid + 1) % 1000 == ANSWER:
                break
        while True:  # and inodes likewise
            fd = os.open("x", os.O_CREAT | os.O_WRONLY)
            ino = os.fstat(fd).st_ino
            os.close(fd)
            os.unlink("x")
            if (ino + 1) % 1000 == ANSWER:
                break
        print("set")
        """
    seen = {}
    for answer in (437, 611):
        with Sandbox() as sandbox:
            first = sandbox.run(Job(textwrap.dedent(setter.replace("ANSWER", str(answer)))), Limits(timeout_s=GENEROUS_S))
            assert first.stdout == "set\n", first
            seen[answer] = sandbox.run(Job(textwrap.dedent(COPYCAT))).stdout
            assert_honest_control(sandbox)
    assert seen[437] == seen[611], seen
