"""One long-lived sandbox: bwrap around the zygote, which forks a fresh sample process for every run.

Starting bwrap and an interpreter costs tens of milliseconds, more than most runs; forking the already-running
zygote costs about one. So a `Sandbox` starts once and runs sample after sample, each in a fresh child of a zygote
that never held a program (see harness.py), and is replaced whenever something went wrong (the zygote died, missed
its deadline, could not clean up, or its group refused new limits). A `Sandbox` is not thread-safe: use one per
thread (`spo_lake.sandbox.pool.thread_sandbox`).

Two ways to run a program:
- `run(Job(source, stdin))`: a script; the host collects its stdout, stderr and exit status.
- `session(source, fn_name, limits, budget_s)`: the program runs once, then `call(*args)` sends arguments as data
  and gets the return value back as data (wire.py), so the caller compares results in its own process, where the
  program cannot reach. Any failure (exception, timeout, crash, a value that is not plain data, malformed channel
  data) is sticky: every later call raises `CallFailed` with it.

Nothing a program writes can make the host raise: every channel is read with a size cap and parsed by
`wire.read_message`. The host decides deadlines and kills a sample through the zygote. A sample's clock starts when
the zygote reports its process started: the sandbox's start-up and the previous sample's clean-up are never charged
to it.

mode="none" runs the same harness WITHOUT any isolation: the program sees the host's files, network and processes
with your user's rights. Only for trusted code or machines without bubblewrap, never for model output you have not
read.
"""
from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from spo_lake.errors import InputError
from spo_lake.sandbox import wire
from spo_lake.sandbox.bwrap import (
    INSTALL_HINT,
    SANDBOX_ENV,
    SANDBOX_TMP,
    SandboxUnavailable,
    bwrap_command,
    python_command,
    require_bwrap,
    running_as_root,
)
from spo_lake.sandbox.cgroups import Cgroup, new_cgroup
from spo_lake.sandbox.seccomp import seccomp_filter

MODES = ("bwrap", "none")
RUN_VERDICTS = ("ok", "runtime_error", "timeout", "memory", "output_limit", "sandbox_error")
_HERE = Path(__file__).parent
HARNESS_SOURCE = (_HERE / "wire.py").read_text(encoding="utf-8") + (_HERE / "harness.py").read_text(encoding="utf-8")
START_TIMEOUT_S = 30.0
REPLY_GRACE_S = 10.0  # the zygote's kill and bounded clean-up after a sample's deadline; also its time to start one
STDERR_TAIL_BYTES = 4096
CONTROL_MAX_BYTES = 1 << 16  # the zygote's own reports are tiny


@dataclass(frozen=True)
class Limits:
    """Applied to every run: wall clock and memory, plus caps on output, processes, open files, files and CPU."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_bytes: int = 16 << 20  # stdout, and each value a call returns
    max_processes: int = 64
    max_open_files: int = 256
    max_files: int = 10_000  # files and directories a run may create in /tmp
    cpu_share: float = 1.0  # CPUs the whole sandbox may use at once (cgroup modes only)


@dataclass(frozen=True)
class Job:
    """One run of a program as a script, with `stdin`."""

    source: str
    stdin: str = ""


@dataclass(frozen=True)
class RunResult:
    verdict: str  # one of RUN_VERDICTS
    exit_code: int | None  # negative: killed by that signal
    stdout: str
    stderr: str  # the last 4 KiB
    wall_s: float
    detail: str = ""


class CallFailed(Exception):
    """A call (or the session's start) did not return a value; `verdict` says why (RUN_VERDICTS or wrong_answer)."""

    def __init__(self, verdict: str, detail: str):
        super().__init__(f"{verdict}: {detail}")
        self.verdict, self.detail = verdict, detail


@dataclass
class _Sample:
    """What the host has collected so far from one running sample."""

    limits: Limits
    spawned: float = field(default_factory=time.monotonic)  # when the host asked the zygote for it
    started: float | None = None  # when the zygote reported its process started: its clock starts then
    zygote_started: float | None = None  # the zygote's reading of the same clock at that start
    outbound: bytearray = field(default_factory=bytearray)  # to the sample's data pipe
    stdout: bytearray = field(default_factory=bytearray)
    stdout_bytes: int = 0
    stderr: bytearray = field(default_factory=bytearray)
    stderr_bytes: int = 0
    data: bytearray = field(default_factory=bytearray)  # from the sample's data pipe, up to a newline
    messages: list[bytes | bytearray] = field(default_factory=list)  # complete lines from the data pipe
    report: dict[str, Any] | None = None  # the zygote's, once the sample is over
    overflow: str = ""  # which cap was passed
    killed: bool = False
    zygote_died: bool = False

    def deadline(self, budget_s: float, since: float = 0.0) -> float:
        """`budget_s` after the sample's start (or after `since`, if later); while it has not started, the time
        the zygote has to start it."""
        if self.started is None:
            return self.spawned + REPLY_GRACE_S
        return max(self.started, since) + budget_s

    def wall_s(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started


class Sandbox:
    """bwrap around the zygote, started on the first run and replaced after any trouble."""

    def __init__(self, mode: str = "bwrap", tmpfs_mb: int = 256, cgroups: bool = True):
        """`cgroups=False` keeps this sandbox on the rlimits fallback whatever the machine offers (for comparison)."""
        if mode not in MODES:
            raise InputError(f"unknown sandbox mode {mode!r}; expected one of {', '.join(MODES)}")
        if mode == "none":
            warnings.warn("sandbox mode 'none': untrusted code runs WITHOUT isolation", RuntimeWarning, stacklevel=2)
        self.mode, self.tmpfs_mb, self.cgroups = mode, tmpfs_mb, cgroups
        self._proc: subprocess.Popen | None = None
        self._fds: dict[str, int] = {}
        self._control_pending = b""  # the control channel's line so far, up to its newline
        self._cgroup: Cgroup | None = None
        self._group_limits: tuple | None = None
        self._oom_kills = 0  # the group's count when last read
        self._stopping: _Sample | None = None
        self._close: weakref.finalize | None = None
        self._started_once = False

    @property
    def pid(self) -> int | None:
        """Host pid of the outermost sandbox process (bwrap), while one is running."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def cgroup(self) -> Cgroup | None:
        return self._cgroup

    def run(self, job: Job, limits: Limits = Limits()) -> RunResult:
        """Run one script. Raises only SandboxUnavailable, and only if no sandbox ever started in this object."""
        sample = self._spawn({"source": job.source, "stdin": job.stdin, "fn_name": None}, limits, limits.timeout_s)
        if isinstance(sample, RunResult):
            return sample
        self._pump(sample, lambda: sample.report is not None or bool(sample.overflow),
                   lambda: sample.deadline(limits.timeout_s))
        return self._finish(sample, _timed_out(sample) or _overran(sample, limits.timeout_s))

    def session(self, source: str, fn_name: str, limits: Limits = Limits(),
                budget_s: float | None = None) -> Session:
        """Start `source` and make `fn_name` callable through the returned `Session` (use it as a context manager).
        Each call gets `limits.timeout_s`, all of them together `budget_s` (default: no more than one call's)."""
        return Session(self, source, fn_name, limits, budget_s or limits.timeout_s)

    def close(self) -> None:
        if self._close is not None:
            self._close()
            self._close = None
        self._proc, self._fds, self._cgroup, self._group_limits, self._oom_kills = None, {}, None, None, 0
        self._stopping = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ one sample

    def _spawn(self, request: dict[str, Any], limits: Limits, cpu_s: float) -> _Sample | RunResult:
        """Fork a sample in the zygote and queue its request; or the RunResult of why that failed."""
        started = time.monotonic()
        self._settle()
        if self.pid is not None and self._cgroup is not None and not self._limit_group(limits):
            self.close()  # e.g. memory in use above a lower new limit: a fresh group instead
        if self.pid is None:
            try:
                self._start(limits)
            except SandboxUnavailable as error:
                if not self._started_once:
                    raise
                return _failed("sandbox_error", str(error), started)
        sample = _Sample(limits)
        sample.outbound += (json.dumps(request) + "\n").encode("utf-8", "surrogatepass")
        spawn = {
            "memory_mb": limits.memory_mb, "cpu_s": int(cpu_s) + 1, "max_processes": limits.max_processes,
            "max_open_files": limits.max_open_files, "max_files": limits.max_files,
            "max_file_bytes": limits.max_output_bytes, "clean_entries": 4 * limits.max_files + 1000,
        }
        if not self._send_control({"spawn": spawn}):
            self.close()
            return _failed("sandbox_error", "the sandbox's zygote is gone", started)
        return sample

    def _finish(self, sample: _Sample, timed_out: bool) -> RunResult:
        """Stop the sample if it still runs, wait for the zygote's report, and classify the run."""
        limits = sample.limits
        never_started = sample.started is None and sample.report is None  # the zygote's fault, not the program's
        if sample.report is None:
            self._kill(sample)
            grace = time.monotonic() + REPLY_GRACE_S
            self._pump(sample, lambda: sample.report is not None, lambda: grace)
        self._drain(sample)
        report, wall_s = sample.report, sample.wall_s()
        exit_code = report.get("exit_code") if report else None
        exit_code = exit_code if type(exit_code) is int else None
        oom = False
        if self._cgroup is not None and not sample.killed and (exit_code is None or exit_code < 0):
            oom_kills = self._cgroup.oom_kills()  # read only when a process died of a signal: it costs a file read
            oom, self._oom_kills = oom_kills > self._oom_kills, oom_kills
        if report is None or not report.get("clean", False) or never_started:
            self.close()  # no answer, a mess it could not clean, or too slow to start: the next run gets a fresh one
        stdout = sample.stdout.decode("utf-8", "replace")
        stderr = sample.stderr[-STDERR_TAIL_BYTES:].decode("utf-8", "replace")
        last_line = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")

        def result(verdict: str, detail: str = "") -> RunResult:
            return RunResult(verdict, exit_code, stdout, stderr, wall_s, detail)

        if timed_out or exit_code == -signal.SIGXCPU:
            return result("timeout", f"exceeded {limits.timeout_s:g} s")
        if sample.overflow:
            return result("output_limit", sample.overflow)
        if sample.zygote_died:
            return result("runtime_error", "the sandbox's zygote died during the run")
        if never_started:
            return result("sandbox_error", f"the sandbox did not start the program within {REPLY_GRACE_S:g} s")
        if report is None:
            return result("sandbox_error", f"no report from the sandbox {REPLY_GRACE_S:g} s after the run")
        if "spawn_failed" in report:
            return result("sandbox_error", f"the sandbox could not start the program: {report['spawn_failed']}"[:500])
        if report.get("files_exceeded") is True:
            return result("output_limit", f"created more than {limits.max_files} files")
        if oom:
            return result("memory", f"exceeded {limits.memory_mb} MB (whole sandbox)")
        if exit_code == 0:
            return result("ok")
        if last_line.startswith("MemoryError") or "Cannot allocate memory" in last_line:
            return result("memory", f"exceeded {limits.memory_mb} MB")
        return result("runtime_error", last_line or f"exit code {exit_code}")

    def _stop_later(self, sample: _Sample) -> None:
        """Kill a sample whose outcome the caller already has; its clean-up overlaps the caller's next work, and the
        next spawn settles it (`_settle`)."""
        self._kill(sample)
        self._stopping = sample

    def _settle(self) -> None:
        """Wait for the report of a sample stopped with `_stop_later`; replace the sandbox if it did not come clean."""
        sample, self._stopping = self._stopping, None
        if sample is not None and self._proc is not None:
            grace = time.monotonic() + REPLY_GRACE_S
            self._pump(sample, lambda: sample.report is not None, lambda: grace)
            self._drain(sample)
            if sample.report is None or not sample.report.get("clean", False):
                self.close()

    def _kill(self, sample: _Sample) -> None:
        if not sample.killed:
            sample.killed = True
            self._send_control({"kill": True})

    def _pump(self, sample: _Sample, done: Callable[[], bool], deadline: Callable[[], float]) -> bool:
        """Move data between the host and the sample until `done()` or `deadline()` (read anew after every event:
        a sample's clock starts only when the zygote says so); True if done."""
        if sample.outbound and not sample.killed and self._proc is not None:
            self._write_data(sample)  # small messages go out at once, without waiting to be writable
        writing = False
        while not done():
            if self._proc is None:
                return False
            # Past the deadline, one last look without waiting: a report or reply may have been waiting since before
            # it, unread while this process was busy (another thread held the GIL), and it counts as in time.
            remaining = deadline() - time.monotonic()
            wants_write = bool(sample.outbound) and not sample.killed
            if wants_write and not writing:
                self._selector.register(self._fds["data_in"], selectors.EVENT_WRITE, "data_in")
            elif writing and not wants_write:
                self._selector.unregister(self._fds["data_in"])
            writing = wants_write
            for key, _ in self._selector.select(max(remaining, 0)):
                if key.data == "data_in":
                    self._write_data(sample)
                elif not self._read(sample, key.data, key.fd):
                    sample.zygote_died = True  # only the sample can have killed it (or garbled its report)
                    self.close()
                    break
            if remaining <= 0:
                break
        if writing and self._proc is not None:
            self._selector.unregister(self._fds["data_in"])
        return done()

    def _write_data(self, sample: _Sample) -> None:
        try:
            del sample.outbound[: os.write(self._fds["data_in"], sample.outbound[: 1 << 16])]
        except BlockingIOError:
            pass

    def _read(self, sample: _Sample, channel: str, fd: int) -> bool:
        """Take what is available on one channel; False if the zygote is gone or unreadable."""
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            return True
        if channel == "control":
            return self._take_control(sample, chunk)
        _collect(sample, channel, chunk)
        if sample.overflow:
            self._kill(sample)
        return True

    def _take_control(self, sample: _Sample, chunk: bytes) -> bool:
        """Every complete line of the zygote's: "started" starts the sample's clock, anything else is its report."""
        if not chunk:
            return False
        self._control_pending += chunk
        while b"\n" in self._control_pending:
            line, _, self._control_pending = self._control_pending.partition(b"\n")
            try:
                message = wire.read_message(line, CONTROL_MAX_BYTES)
            except wire.BadData:
                return False
            if type(message) is dict and message.get("started") is True:
                sample.started = time.monotonic()
                sample.zygote_started = _clock(message.get("at"))
            else:
                sample.report = message
        return len(self._control_pending) <= CONTROL_MAX_BYTES

    def _drain(self, sample: _Sample) -> None:
        """After the zygote's report every writer is dead: take what is left in the pipes, and empty the data pipe
        in, so that nothing of this sample reaches the next."""
        if self._proc is None:
            return
        for channel in ("out", "err", "data"):
            for chunk in _available(self._fds["data_out" if channel == "data" else channel]):
                _collect(sample, channel, chunk)
        for _ in _available(self._fds["data_in_r"]):
            pass

    def _send_control(self, message: dict[str, Any]) -> bool:
        if self._proc is None or self._proc.stdin is None:
            return False
        try:
            self._proc.stdin.write(wire.message_line(message))
            self._proc.stdin.flush()
        except (OSError, ValueError):
            return False
        return True

    def _limit_group(self, limits: Limits) -> bool:
        wanted = (limits.memory_mb, limits.max_processes, limits.cpu_share)
        if wanted == self._group_limits:
            return True
        assert self._cgroup is not None  # callers limit only a sandbox that has a group
        try:
            self._cgroup.limit(limits.memory_mb, limits.max_processes + 3, limits.cpu_share)  # + bwrap x2, zygote
        except OSError:
            return False
        self._group_limits = wanted
        return True

    # ------------------------------------------------------------------------------------------ lifecycle

    def _start(self, limits: Limits) -> None:
        self.close()
        pipes = {name: os.pipe() for name in ("data_in", "data_out", "out", "err")}
        inside = {"data_in": pipes["data_in"][0], "data_out": pipes["data_out"][1], "out": pipes["out"][1],
                  "err": pipes["err"][1]}
        seccomp_fd = None
        if self.mode == "bwrap":
            require_bwrap()
            workdir = None
            seccomp_fd = _memfd(seccomp_filter())
            command = python_command(HARNESS_SOURCE, SANDBOX_TMP, json.dumps(inside), own_pidns=True,
                                     drop_uid=running_as_root())
            argv, env = bwrap_command(command, tmpfs_mb=self.tmpfs_mb, seccomp_fd=seccomp_fd), {}
            self._cgroup = new_cgroup() if self.cgroups else None
            if self._cgroup is not None:
                if not self._limit_group(limits):
                    self._cgroup.remove()
                    raise SandboxUnavailable(f"cgroup {self._cgroup.dirs['memory']} refused its limits")
                argv = _enter_cgroup(self._cgroup) + argv
        else:
            workdir = tempfile.mkdtemp(prefix="spo-lake-unsandboxed-")
            argv = python_command(HARNESS_SOURCE, workdir, json.dumps(inside), own_pidns=False, drop_uid=False)
            env = {**SANDBOX_ENV, "HOME": workdir}
        pass_fds = tuple(inside.values()) + (() if seccomp_fd is None else (seccomp_fd,))
        # the host empties it between samples, through its own (non-blocking) open file description
        data_in_r = os.open(f"/proc/self/fd/{pipes['data_in'][0]}", os.O_RDONLY | os.O_NONBLOCK)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    pass_fds=pass_fds, env=env, cwd=workdir, start_new_session=True)
        except OSError as error:
            raise SandboxUnavailable(f"could not start {argv[0]}: {error}\nHint: {INSTALL_HINT}") from error
        finally:
            for fd in pass_fds:
                os.close(fd)
        assert proc.stdout is not None and proc.stderr is not None  # both are PIPEs
        host = {"data_in": pipes["data_in"][1], "data_out": pipes["data_out"][0], "out": pipes["out"][0],
                "err": pipes["err"][0], "data_in_r": data_in_r}
        for fd in [proc.stdout.fileno(), proc.stderr.fileno(), *host.values()]:
            os.set_blocking(fd, False)
        self._proc, self._fds, self._control_pending = proc, host, b""
        self._selector = selectors.DefaultSelector()
        for fd, channel in [(proc.stdout.fileno(), "control"), (host["data_out"], "data"), (host["out"], "out"),
                            (host["err"], "err")]:
            self._selector.register(fd, selectors.EVENT_READ, channel)
        self._close = weakref.finalize(self, _terminate, proc, list(host.values()), workdir, self._cgroup,
                                       self._selector)
        errors = os.dup(proc.stderr.fileno())  # still readable if the zygote dies and the pump closes the sandbox
        try:
            alive = self._ping()
            problem = "" if alive else _read_available(errors).strip() or "no answer from the zygote"
        finally:
            os.close(errors)
        if not alive:
            self.close()
            raise SandboxUnavailable(f"could not start a {self.mode} sandbox: {problem[-2000:]}\nHint: {INSTALL_HINT}")
        self._started_once = True

    def _ping(self) -> bool:
        probe = _Sample(Limits())
        if not self._send_control({"ping": True}):
            return False
        deadline = time.monotonic() + START_TIMEOUT_S
        self._pump(probe, lambda: probe.report is not None, lambda: deadline)
        return probe.report == {"pong": True}


class Session:
    """One sample whose function the caller calls with data and gets data back from; see the module docstring."""

    def __init__(self, sandbox: Sandbox, source: str, fn_name: str, limits: Limits, budget_s: float):
        self.sandbox, self.limits = sandbox, limits
        self.failure: CallFailed | None = None
        self.result: RunResult | None = None
        spawned = sandbox._spawn({"source": source, "stdin": "", "fn_name": fn_name}, limits, budget_s)
        self.budget_s = budget_s  # from the sample's start, for all calls together
        if isinstance(spawned, RunResult):
            self.sample, self.result = None, spawned
            self.failure = CallFailed(spawned.verdict, spawned.detail)
            return
        self.sample, self._ready = spawned, False  # "ready" is read with the first reply: one round trip less

    def call(self, *args: Any) -> Any:
        """fn_name(*args) in the sandbox; its return value, decoded. Raises CallFailed for anything else."""
        outcome = _outcome(self._ask({"args": list(args)}))
        if isinstance(outcome, CallFailed):
            self.fail(outcome.verdict, outcome.detail)
        return outcome

    def call_many(self, arg_lists: list[list[Any]]) -> list[Any]:
        """Several calls in one round trip, in order: each one's value, or a CallFailed that is NOT yet this
        session's failure (the caller decides with `fail` whether that call counts). A crash or timeout during
        the batch fails the session and raises."""
        replies = self._ask({"batch": arg_lists}).get("batch")
        if type(replies) is not list or len(replies) != len(arg_lists):
            self.fail("wrong_answer", "malformed batch reply from the program")
        return [_outcome(reply) for reply in replies]

    def fail(self, verdict: str, detail: str) -> NoReturn:
        """Make this the session's failure, stop the sample, and raise it."""
        self.failure = CallFailed(verdict, detail)
        self.close()
        raise self.failure

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.failure is not None:
            raise self.failure
        assert self.sample is not None  # only a failed spawn has none, and that set self.failure
        try:
            encoded = {key: [wire.encode(list(args)) for args in value] if key == "batch" else wire.encode(value)
                       for key, value in request.items()}
            self.sample.outbound += wire.message_line(encoded)
        except (wire.Unserialisable, ValueError) as error:
            self.fail("sandbox_error", f"the arguments cannot be sent as data: {error}")
        if not self._ready:
            if self._message() != {"ready": True}:
                self.fail("wrong_answer", "malformed start message from the program")
            self._ready = True
        return self._message()

    def close(self) -> RunResult:
        """Stop the sample (if still running); how its run went ("ok" while no call failed)."""
        sample = self.sample
        if self.result is None and self.failure is None:
            assert sample is not None  # only a failed spawn has none, and that set self.result
            self.sandbox._stop_later(sample)
            self.result = RunResult("ok", None, sample.stdout.decode("utf-8", "replace"),
                                    sample.stderr[-STDERR_TAIL_BYTES:].decode("utf-8", "replace"), sample.wall_s())
        elif self.result is None:
            assert sample is not None  # as above
            self.result = self.sandbox._finish(sample, timed_out=False)
        return self.result

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _message(self) -> dict[str, Any]:
        """The next message from the program, within this call's time; raises CallFailed if there is none."""
        sample = self.sample
        assert sample is not None  # _ask checked
        asked = time.monotonic()  # this call's clock starts now, or when the sample starts if that is later
        self.sandbox._pump(sample, lambda: bool(sample.messages or sample.report or sample.overflow),
                           lambda: min(sample.deadline(self.limits.timeout_s, asked), sample.deadline(self.budget_s)))
        if sample.messages:
            try:
                return wire.read_message(sample.messages.pop(0), self.limits.max_output_bytes)
            except wire.BadData as error:
                self.fail("wrong_answer", str(error))
        self.result = self.sandbox._finish(sample, _timed_out(sample))
        if self.result.verdict == "ok":
            self.failure = CallFailed("runtime_error", "the program exited instead of returning")
        else:
            self.failure = CallFailed(self.result.verdict, self.result.detail)
        raise self.failure


def _clock(value: Any) -> float | None:
    """A CLOCK_MONOTONIC reading the zygote sent (the same clock as this process's time.monotonic)."""
    return float(value) if type(value) in (int, float) and math.isfinite(value) else None


def _overran(sample: _Sample, timeout_s: float) -> bool:
    """Whether the zygote's own clock says the sample ran past `timeout_s`: a report read late (this process was
    busy) still times out a sample that really ran too long, and only such a one."""
    ended = _clock(sample.report.get("ended_at")) if type(sample.report) is dict else None
    return sample.zygote_started is not None and ended is not None and ended - sample.zygote_started > timeout_s


def _timed_out(sample: _Sample) -> bool:
    """After a pump: the sample started and its deadline passed (a sample never started, or whose zygote died, is
    not a timeout)."""
    return sample.started is not None and sample.report is None and not sample.overflow and not sample.zygote_died


def _outcome(reply: Any) -> Any:
    """A reply's decoded value, or the CallFailed it stands for."""
    if type(reply) is not dict:
        return CallFailed("wrong_answer", "malformed reply from the program")
    if "value" in reply:
        try:
            return wire.decode(reply["value"])
        except wire.BadData as error:
            return CallFailed("wrong_answer", f"malformed return value: {error}")
    if type(reply.get("unserialisable")) is str:
        return CallFailed("wrong_answer", f"returned something that is not plain data ({reply['unserialisable']})")
    if type(reply.get("error")) is str:
        return CallFailed("runtime_error", reply["error"])
    return CallFailed("wrong_answer", "malformed reply from the program")


def _collect(sample: _Sample, channel: str, chunk: bytes) -> None:
    """Add a chunk of the sample's stdout, stderr or data pipe to what it has written, within the caps."""
    limit = sample.limits.max_output_bytes
    if channel == "out":
        sample.stdout_bytes += len(chunk)
        sample.stdout += chunk[: max(0, limit - len(sample.stdout))]
        if sample.stdout_bytes > limit and not sample.overflow:
            sample.overflow = f"wrote more than {limit} bytes"
    elif channel == "err":
        sample.stderr_bytes += len(chunk)
        sample.stderr = sample.stderr[-STDERR_TAIL_BYTES:] + chunk[-STDERR_TAIL_BYTES:]
        if sample.stderr_bytes > limit and not sample.overflow:
            sample.overflow = f"wrote more than {limit} bytes to stderr"
    else:
        if b"\n" in chunk:  # split only what just came: a long line costs linear time, not quadratic
            first, *lines, rest = chunk.split(b"\n")
            sample.data += first  # the line itself becomes the message: no copy of up to the output cap
            sample.messages += [sample.data, *lines]
            sample.data = bytearray(rest)
        else:
            sample.data += chunk
        if len(sample.data) > limit and not sample.overflow:
            sample.overflow = f"returned more than {limit} bytes"


def _available(fd: int):
    """Chunks readable from a non-blocking fd right now."""
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except (BlockingIOError, OSError):
            return
        if not chunk:
            return
        yield chunk


def _enter_cgroup(cgroup: Cgroup) -> list[str]:
    """A shell prefix that moves itself into the group, then becomes bwrap: nothing of the sandbox runs outside."""
    script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *cgroup.procs_files(), "--"]


def _failed(verdict: str, detail: str, started: float) -> RunResult:
    return RunResult(verdict, None, "", "", time.monotonic() - started, detail)


def _memfd(data: bytes | None) -> int | None:
    if data is None:
        return None
    fd = os.memfd_create("spo-lake-seccomp")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_available(fd: int) -> str:
    return b"".join(_available(fd)).decode("utf-8", "replace")


def _terminate(proc: subprocess.Popen, fds: list[int], workdir: str | None, cgroup: Cgroup | None,
               selector: selectors.BaseSelector) -> None:
    """End the sandbox: the zygote exits when its stdin closes; if it does not, kill bwrap, whose death takes
    the pid namespace, and with it every process inside, along."""
    selector.close()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass
    for fd in fds:
        os.close(fd)
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
    if cgroup is not None:
        cgroup.remove()
