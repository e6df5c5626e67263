"""The attack battery: each attack is contained, the host is unharmed, and the verdict is right."""
from __future__ import annotations

import os
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spo_lake.sandbox import Job, Limits, Sandbox, run_python
from spo_lake.sandbox.bwrap import interpreter

from .conftest import descendants, host_processes_with, requires_bwrap

pytestmark = requires_bwrap


def run(source: str, **limits) -> "object":
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
    baseline = len(descendants(sandbox.pid))
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
    assert len(descendants(sandbox.pid)) == baseline  # every forked process is gone
    assert run("print('still fine')").stdout == "still fine\n"


def test_memory_bombs(sandbox: Sandbox):
    growing = sandbox.run(Job("x = []\nwhile True:\n    x.append(bytearray(10 ** 7))\n"), Limits(memory_mb=256))
    at_once = sandbox.run(Job("x = 'a' * (10 ** 10)\n"), Limits(memory_mb=256))
    assert growing.verdict == at_once.verdict == "memory"


def test_cpu_spin_and_sleep_are_killed_on_the_wall_clock():
    for source in ["while True:\n    pass\n", "import time\ntime.sleep(60)\n", "import signal\nsignal.pause()\n"]:
        started = time.monotonic()
        result = run_python(source, timeout_s=1.0)
        assert result.verdict == "timeout" and time.monotonic() - started < 3.0


def test_a_gigabyte_of_output_is_cut_off():
    result = run("""
        import sys
        chunk = "x" * (1 << 20)
        for _ in range(1024):
            sys.stdout.write(chunk)
        """)
    assert result.verdict == "output_limit"
    assert len(result.stdout) <= Limits().max_output_bytes
    flood = run("import sys\nwhile True:\n    sys.stderr.write('e' * 65536)\n")
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
