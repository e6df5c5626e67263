"""One long-lived sandbox: bwrap around the harness, fed one test at a time over a JSON-lines pipe.

Starting bwrap and an interpreter costs tens of milliseconds, more than most tests; forking the
already-running harness costs about one. So a `Sandbox` starts once and runs test after test, each in a
fresh child with the limits of its `Limits`, and is restarted whenever something went wrong (the harness
died, missed its deadline or could not clean up). A `Sandbox` is not thread-safe: use one per thread
(`spo_lake.sandbox.pool.thread_sandbox`).

mode="none" runs the same harness WITHOUT any isolation: the program sees the host's files, network and
processes with your user's rights. Only for trusted code or machines without bubblewrap, never for model
output you have not read.
"""
from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spo_lake.sandbox.bwrap import (
    INSTALL_HINT, SANDBOX_ENV, SANDBOX_TMP, SandboxUnavailable, bwrap_command, python_command, require_bwrap,
    running_as_root,
)
from spo_lake.sandbox.seccomp import seccomp_filter

MODES = ("bwrap", "none")
RUN_VERDICTS = ("ok", "runtime_error", "timeout", "memory", "output_limit", "sandbox_error")
HARNESS_SOURCE = (Path(__file__).with_name("harness.py")).read_text(encoding="utf-8")
START_TIMEOUT_S = 30.0
REPLY_GRACE_S = 5.0  # the harness's own kill, clean-up and reply after a test's wall clock ran out


@dataclass(frozen=True)
class Limits:
    """Applied to every test: wall clock and address space, plus fixed caps on output, processes and files."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_bytes: int = 16 << 20
    max_processes: int = 64
    max_open_files: int = 256


@dataclass(frozen=True)
class Job:
    """One run of a program: with `stdin`, or calling `fn_name(*args)` after running the source."""

    source: str
    stdin: str = ""
    fn_name: str | None = None
    args: tuple[Any, ...] | list[Any] = ()
    must_finish: bool = False  # exiting (exit(), os._exit) before the end of the source counts as a failure


@dataclass(frozen=True)
class RunResult:
    verdict: str  # one of RUN_VERDICTS
    exit_code: int | None  # negative: killed by that signal
    stdout: str
    stderr: str  # the last 4 KiB
    wall_s: float
    value: Any = None  # the JSON-decoded return value of a call job that finished
    detail: str = ""


class Sandbox:
    """bwrap around the harness, started on the first run and restarted after any trouble."""

    def __init__(self, mode: str = "bwrap", tmpfs_mb: int = 256):
        if mode not in MODES:
            raise ValueError(f"unknown sandbox mode {mode!r}; expected one of {', '.join(MODES)}")
        if mode == "none":
            warnings.warn("sandbox mode 'none': untrusted code runs WITHOUT isolation", RuntimeWarning, stacklevel=2)
        self.mode, self.tmpfs_mb = mode, tmpfs_mb
        self._proc: subprocess.Popen | None = None
        self._close: weakref.finalize | None = None
        self._started_once = False

    @property
    def pid(self) -> int | None:
        """Host pid of the outermost sandbox process (bwrap), while one is running."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def run(self, job: Job, limits: Limits = Limits()) -> RunResult:
        """Run one test. Raises only SandboxUnavailable, and only if no sandbox ever started in this object."""
        started = time.monotonic()
        if self.pid is None:
            try:
                self._start()
            except SandboxUnavailable as error:
                if not self._started_once:
                    raise
                return _failed("sandbox_error", str(error), started)
        token = secrets.token_hex(16)
        request = {
            "source": job.source, "stdin": job.stdin, "fn_name": job.fn_name, "args": list(job.args),
            "timeout_s": limits.timeout_s, "memory_mb": limits.memory_mb, "max_output_bytes": limits.max_output_bytes,
            "max_processes": limits.max_processes, "max_open_files": limits.max_open_files, "token": token,
        }
        reply = self._exchange(request, limits.timeout_s + REPLY_GRACE_S)
        if isinstance(reply, str) or "harness_error" in reply or reply.get("dirty"):
            self.close()  # the next run starts a fresh sandbox
        if reply == "died":  # only the test can have killed it
            return _failed("runtime_error", "the sandbox harness died during the test", started)
        if reply == "silent":
            return _failed("timeout", f"no answer from the sandbox {REPLY_GRACE_S:g} s after the test's limit", started)
        if reply == "garbled":
            return _failed("sandbox_error", "unreadable answer from the sandbox harness", started)
        if "harness_error" in reply:
            return _failed("sandbox_error", reply["harness_error"], started)
        return classify(reply, job, limits, token)

    def close(self) -> None:
        if self._close is not None:
            self._close()
            self._close = None
        self._proc = None

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _start(self) -> None:
        self.close()
        pass_fds: tuple[int, ...] = ()
        if self.mode == "bwrap":
            require_bwrap()
            workdir = None
            seccomp_fd = _memfd(seccomp_filter())
            pass_fds = () if seccomp_fd is None else (seccomp_fd,)
            command = python_command(HARNESS_SOURCE, SANDBOX_TMP, own_pidns=True, drop_uid=running_as_root())
            argv, env = bwrap_command(command, tmpfs_mb=self.tmpfs_mb, seccomp_fd=seccomp_fd), {}
        else:
            workdir = tempfile.mkdtemp(prefix="spo-lake-unsandboxed-")
            argv = python_command(HARNESS_SOURCE, workdir, own_pidns=False, drop_uid=False)
            env = {**SANDBOX_ENV, "HOME": f"{workdir}/work"}
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    pass_fds=pass_fds, env=env, cwd=workdir, start_new_session=True)
        except OSError as error:
            raise SandboxUnavailable(f"could not start {argv[0]}: {error}\nHint: {INSTALL_HINT}") from error
        finally:
            for fd in pass_fds:
                os.close(fd)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            os.set_blocking(pipe.fileno(), False)
        self._proc = proc
        self._close = weakref.finalize(self, _terminate, proc, workdir)
        if self._exchange({"ping": True}, START_TIMEOUT_S) != {"pong": True}:
            problem = _read_available(proc.stderr.fileno()).strip() or "no answer from the harness"
            self.close()
            raise SandboxUnavailable(f"could not start a {self.mode} sandbox: {problem[-2000:]}\nHint: {INSTALL_HINT}")
        self._started_once = True

    def _exchange(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any] | str:
        """Write one request line and read one reply line; or why not: "died", "silent" (deadline), "garbled"."""
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        payload = memoryview((json.dumps(request) + "\n").encode())
        out_fd, in_fd = self._proc.stdin.fileno(), self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        received = bytearray()
        with selectors.DefaultSelector() as selector:
            selector.register(out_fd, selectors.EVENT_WRITE)
            selector.register(in_fd, selectors.EVENT_READ)
            while (remaining := deadline - time.monotonic()) > 0:
                for key, _ in selector.select(remaining):
                    if key.fd == out_fd:
                        try:
                            payload = payload[os.write(out_fd, payload[: 1 << 16]):]
                        except BrokenPipeError:
                            return "died"
                        if not payload:
                            selector.unregister(out_fd)
                        continue
                    chunk = os.read(in_fd, 1 << 20)
                    if not chunk:
                        return "died"
                    received += chunk
                    if b"\n" in chunk:
                        try:
                            reply = json.loads(received[: received.index(b"\n")])
                        except ValueError:
                            return "garbled"
                        return reply if isinstance(reply, dict) else "garbled"
                    if len(received) > (request.get("max_output_bytes") or 0) * 8 + (16 << 20):
                        return "garbled"  # far more than any honest reply
        return "silent"


def classify(reply: dict[str, Any], job: Job, limits: Limits, token: str) -> RunResult:
    """The verdict of one finished test from the harness's facts about it."""
    exit_code, stderr = reply.get("exit_code"), str(reply.get("stderr", ""))
    value, finished = None, False
    try:
        record = json.loads(reply.get("value") or "null")
        finished = isinstance(record, dict) and record.get("token") == token
        value = record["value"] if finished else None
    except ValueError:
        pass
    last_line = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    if reply.get("timed_out") or exit_code == -signal.SIGXCPU:
        verdict, detail = "timeout", f"exceeded {limits.timeout_s:g} s"
    elif max(reply.get("stdout_bytes", 0), reply.get("stderr_bytes", 0)) >= limits.max_output_bytes:
        verdict, detail = "output_limit", f"wrote more than {limits.max_output_bytes} bytes"
    elif exit_code == 0 and (finished or not (job.fn_name or job.must_finish)):
        verdict, detail = "ok", ""
    elif exit_code == 0:
        verdict, detail = "runtime_error", "exited before the end of the program"
    elif last_line.startswith("MemoryError") or "Cannot allocate memory" in last_line:
        verdict, detail = "memory", f"exceeded {limits.memory_mb} MB"
    else:
        verdict, detail = "runtime_error", last_line or f"exit code {exit_code}"
    return RunResult(verdict, exit_code, str(reply.get("stdout", "")), stderr, float(reply.get("wall_s", 0.0)),
                     value, detail)


def _failed(verdict: str, detail: str, started: float) -> RunResult:
    return RunResult(verdict, None, "", "", time.monotonic() - started, None, detail)


def _memfd(data: bytes | None) -> int | None:
    if data is None:
        return None
    fd = os.memfd_create("spo-lake-seccomp")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_available(fd: int) -> str:
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except (BlockingIOError, OSError):
        pass
    return b"".join(chunks).decode("utf-8", "replace")


def _terminate(proc: subprocess.Popen, workdir: str | None) -> None:
    """End the sandbox: the harness exits when its stdin closes; if it does not, kill bwrap, whose death takes
    the pid namespace, and with it every process inside, along."""
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)
