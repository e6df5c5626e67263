"""The zygote that runs inside the sandbox, and the sample process it forks for every run.

The host starts it once per sandbox as `python -I -S -B -c <wire.py + this file> BASE PIDNS SETUID FDS` and reuses
it for many samples, so a sample costs a fork instead of an interpreter start. Standard library only; the host never
imports it.

The zygote never sees a program, an input or an output: it imports a few modules, then only forks on command and
reports how the sample ended. So every sample starts from an interpreter that never held another sample's data.
Control lines (JSON) on fd 0/1:

  host -> zygote: {"ping": true} | {"spawn": {limits}} | {"kill": true} (while a sample runs)
  zygote -> host: {"pong": true} | {"started": true, "at"} as soon as a spawned sample's process exists (its
                  clock starts then: nothing before, such as the previous sample's clean-up, is charged to it), then
                  {"exit_code", "files_exceeded", "clean", "ended_at"} once it is over; or {"spawn_failed",
                  "clean": false}. "at" and "ended_at" read CLOCK_MONOTONIC, which the host shares: a report the
                  host reads late is judged by when the sample really ended.

The sample reads its own request from the data pipe (FDS["data_in"]): {"source", "stdin", "fn_name"}. Its stdout and
stderr are pipes the host reads directly. With a `fn_name` it runs the source, says {"ready": true} on the data pipe
out, then answers one {"args": [...]} line at a time with {"value"}, {"error"} or {"unserialisable"} (values encoded
by wire.py), or a {"batch": [args, ...]} line with {"batch": [reply, ...]}. Everything the sample writes is untrusted
data to the host, which alone decides verdicts.

After every sample all other processes of the sandbox are killed (and reaped) and /tmp (the working directory) is
emptied by a bounded, iterative clean-up; a sandbox it cannot clear or empty reports "clean": false and the host
replaces it.

PIDNS=1: the sandbox has its own pid namespace, so kill(-1) reaches exactly the leftovers of a sample. Two counters
of the sandbox outlive a sample and are visible to the next: the pid namespace's last pid and the tmpfs's next
inode number (a sample could set them to its answer, for a copycat after it to read). So the zygote reads both after
every sample, and a sample that moved either (it made a process, a thread or a file) leaves an unclean sandbox,
which the host replaces: the next sample sees the same counters whatever the previous one computed.
SETUID=1: the zygote runs as root with a few capabilities (setuid, setgid, kill, file access for the clean-up), and
each sample drops to a fresh random uid with none, which makes RLIMIT_NPROC count that sample's processes alone and
keeps it from signalling the zygote. Otherwise the zygote makes itself undumpable, so samples under its own uid
cannot read its memory or fds.
"""
import atexit
import fcntl
import gc
import json
import linecache
import os
import resource
import select
import signal
import site
import sys
import time
import traceback
import types

# Imported once here so that programs importing them (most do) pay nothing; all are stateless at import
# (not `random`, whose seeded state every child would inherit).
PRELOADED = ("bisect", "collections", "functools", "heapq", "itertools", "math", "re", "string", "typing")
FIRST_TEST_UID = 1 << 30  # far above real users; a random one of 2**24 per sample
POLL_S = 0.01  # how often the zygote counts the files of a running sample
CLEAN_SECONDS = 2.0  # the time a clean-up may take (and the spawn's "clean_entries" the entries it may touch)


class Lines:
    """Lines from an fd, read unbuffered (a forked child must inherit no half-read data)."""

    def __init__(self, fd):
        self.fd, self.pending = fd, b""

    def next(self):
        """The next line without its newline, or None at end of file."""
        while b"\n" not in self.pending:
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                return None
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line


def send(fd, message):
    data = message_line(message)
    while data:
        data = data[os.write(fd, data):]


def make_undumpable():
    """Keep samples that run under the zygote's own uid out of /proc/<zygote>/mem and /proc/<zygote>/fd."""
    import ctypes

    pr_set_dumpable = 4
    ctypes.CDLL(None).prctl(pr_set_dumpable, 0, 0, 0, 0)


def warm_up():
    """Pay first-use costs (the parser's start-up is about a millisecond) here, once, not in every child."""
    program = (
        "import sys\nclass A:\n    def f(self, x: int) -> list[int]:\n        return [i for i in range(x) if i % 2]\n"
        "print(f'{A().f(3)!r}', {1: (lambda: 2)}, *[3], sep='')\n"
    )
    compile(program, "warm_up.py", "exec")
    message_line({"value": encode([0, 0.5, "", None, True, (1,), {1: {2}}])})


def files_in(base):
    """Inodes in use on the sample's tmpfs."""
    stat = os.statvfs(base)
    return stat.f_files - stat.f_ffree


def clean(base, budget):
    """Empty `base` without recursion: each directory's entries are moved up into `base`, then it is removed, so
    depth costs nothing and every entry is touched about twice. False when the budget ran out or something
    could not be removed; the host then replaces the sandbox."""
    deadline, touched = time.monotonic() + CLEAN_SECONDS, 0
    prefix = f".spo-clean-{os.urandom(4).hex()}-"
    top = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while True:
            with os.scandir(top) as entries:
                batch = [(e.name, e.is_dir(follow_symlinks=False)) for _, e in zip(range(4096), entries)]
            if not batch:
                return True
            for name, is_dir in batch:
                touched += 1
                if touched > budget or time.monotonic() > deadline:
                    return False
                if not is_dir:
                    os.unlink(name, dir_fd=top)
                    continue
                os.chmod(name, 0o700, dir_fd=top)  # a sample may have made it unreadable
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
                try:
                    with os.scandir(sub) as inner:
                        children = [e.name for _, e in zip(range(4096), inner)]
                    for child in children:
                        touched += 1
                        os.rename(child, f"{prefix}{touched}", src_dir_fd=sub, dst_dir_fd=top)
                finally:
                    os.close(sub)
                if not children:
                    os.rmdir(name, dir_fd=top)
    except OSError:
        return False
    finally:
        os.close(top)
        os.chmod(base, 0o1777)


def kill_leftovers(pid, own_pidns):
    """Kill every process the sample left behind, reap those that are the zygote's own children (a sample cannot
    make any: seccomp refuses CLONE_PARENT; this is the second line), and wait until all are gone. False if some
    are still there at the deadline: the host then replaces the sandbox."""
    if not own_pidns:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + CLEAN_SECONDS  # a killed child becomes reapable a moment later (under load)
        while reap_children() and time.monotonic() < deadline:
            time.sleep(0.001)
        return True
    me = os.getpid()
    deadline = time.monotonic() + CLEAN_SECONDS
    while True:
        try:
            os.kill(-1, signal.SIGKILL)  # every process of the namespace but init and the zygote
        except ProcessLookupError:
            pass  # none to signal: zombies (if any) are all that is left
        reap_children()
        if not [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)


def reap_children():
    """Reap every child of the zygote that has exited (the sample itself is waited for by pid before); True while
    some child is still running."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


class Counters:
    """The pid namespace's last pid and the tmpfs's next inode, as a sample that makes nothing leaves them."""

    def __init__(self, base):
        self.base = base
        self.inode = self.probe_inode()

    def probe_inode(self):
        """The inode number a new file gets now (the probe costs one; it is gone again at once)."""
        probe = os.path.join(self.base, f".spo-probe-{os.urandom(4).hex()}")
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            return os.fstat(fd).st_ino
        finally:
            os.close(fd)
            os.unlink(probe)

    def unmoved(self, sample_pid):
        """Whether the sample (pid `sample_pid`) left both counters where the next sample of an untouched sandbox
        would find them: no pid allocated after its own, no inode after the last probe's."""
        with open("/proc/sys/kernel/ns_last_pid") as f:
            last_pid = int(f.read())
        inode, expected = self.probe_inode(), self.inode + 1
        self.inode = inode
        return last_pid == sample_pid and inode == expected


def supervise(pid, control, limits, base, own_pidns, counters):
    """Wait for the sample to end (or for the host's kill, or for its files to pass the cap); then clean up."""
    pidfd = os.pidfd_open(pid)
    files_before, files_exceeded, host_gone = files_in(base), False, False
    while True:
        ready = select.select([pidfd, control.fd], [], [], 0 if b"\n" in control.pending else POLL_S)[0]
        if pidfd in ready:
            break
        if control.fd in ready or b"\n" in control.pending:
            host_gone = control.next() is None  # any line is a kill order
            os.kill(pid, signal.SIGKILL)
        elif not files_exceeded and files_in(base) - files_before > limits["max_files"]:
            files_exceeded = True
            os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    ended_at = time.monotonic()  # the sample's end, before the clean-up (never charged to it)
    os.close(pidfd)
    cleared = kill_leftovers(pid, own_pidns)
    report = {"exit_code": os.waitstatus_to_exitcode(status), "files_exceeded": files_exceeded, "ended_at": ended_at,
              "clean": cleared and clean(base, limits["clean_entries"])
              and (counters is None or counters.unmoved(pid))}
    return report, host_gone


def enter_sample(fds, limits, base, own_pidns, drop_uid):
    """In the forked child: read the request, wire stdio and the data pipes, apply the limits, drop privileges."""
    data = Lines(fds["data_in"])
    request = json.loads(data.next())
    stdin = os.memfd_create("stdin")
    os.write(stdin, request["stdin"].encode("utf-8", "surrogatepass"))
    os.lseek(stdin, 0, os.SEEK_SET)
    wiring = [stdin, fds["out"], fds["err"]] + ([fds["data_in"], fds["data_out"]] if request["fn_name"] else [])
    for target, fd in enumerate(wiring):
        os.dup2(fd, target)
    os.closerange(len(wiring), 1 << 16)
    data.fd = 3
    if not own_pidns:
        os.setpgid(0, 0)  # without a pid namespace the zygote can only kill the sample's process group
    os.chdir(base)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # when the sandbox's memory runs out, the kernel kills samples, not the zygote
    except OSError:
        pass
    memory = limits["memory_mb"] << 20
    for kind, limit in {
        resource.RLIMIT_AS: memory,
        resource.RLIMIT_CPU: limits["cpu_s"],
        resource.RLIMIT_FSIZE: limits["max_file_bytes"],
        resource.RLIMIT_NPROC: limits["max_processes"],
        resource.RLIMIT_NOFILE: limits["max_open_files"],
        resource.RLIMIT_CORE: 0,
    }.items():
        resource.setrlimit(kind, (limit, limit + 1 if kind == resource.RLIMIT_CPU else limit))
    if drop_uid:
        uid = FIRST_TEST_UID + int.from_bytes(os.urandom(3), "little")
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return request, data


def serve(base, own_pidns, drop_uid, fds):
    """Answer control lines until stdin closes; returns only inside a forked child, with its request."""
    if not drop_uid:
        make_undumpable()
    # Out of the way of the sample's 0-4: each to the lowest free number from 100, which can be none of the others
    # (dup2 to fixed numbers clobbered one passed as that number, or closed it, once the host's fds reached 100).
    passed = dict(fds)
    for name, fd in passed.items():
        fds[name] = fcntl.fcntl(fd, fcntl.F_DUPFD, 100)
    for fd in passed.values():
        os.close(fd)
    os.chmod(base, 0o1777)  # a writable private /tmp for every sample's uid
    site.setquit()  # exit() and quit(), which -S leaves out
    for name in PRELOADED:
        __import__(name)
    warm_up()
    gc.freeze()  # children then neither scan nor copy-on-write the zygote's own objects in collections
    counters = Counters(base) if own_pidns else None  # without a namespace of its own there is nothing to keep
    control = Lines(0)
    while (line := control.next()) is not None:
        command = json.loads(line)
        if command.get("ping"):
            send(1, {"pong": True})
            continue
        if "spawn" not in command:
            continue  # a kill that arrived after its sample had ended
        limits = command["spawn"]
        try:
            pid = os.fork()
        except OSError as error:  # e.g. the pids limit: this sandbox is spent, the host replaces it
            send(1, {"spawn_failed": f"{type(error).__name__}: {error}", "clean": False})
            continue
        if pid == 0:
            try:
                return enter_sample(fds, limits, base, own_pidns, drop_uid)
            except BaseException as error:  # never fall back into the zygote's loop
                os.write(fds["err"], f"sandbox harness: {type(error).__name__}: {error}\n".encode())
                os._exit(125)
        send(1, {"started": True, "at": time.monotonic()})
        report, host_gone = supervise(pid, control, limits, base, own_pidns, counters)
        if host_gone:
            return None
        send(1, report)
    return None


def find_function(namespace, name):
    if callable(namespace.get(name)):
        return namespace[name]
    solution = namespace.get("Solution")
    if isinstance(solution, type) and callable(getattr(solution, name, None)):
        return getattr(solution(), name)
    raise NameError(f"no function {name!r} defined, neither at top level nor in class Solution")


def exit_status(code):
    """The process exit status for `SystemExit(code)`, as the interpreter computes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def print_traceback(error):
    """The traceback a script would print, without the harness's frame."""
    error = error.with_traceback(error.__traceback__.tb_next)
    if sys.excepthook is sys.__excepthook__:  # the C hook reads source lines from disk, not linecache
        traceback.print_exception(error)
    else:
        sys.excepthook(type(error), error, error.__traceback__)


def answer_call(function, args):
    """The reply to one call: {"value"}, {"unserialisable"} or {"error"} (its traceback goes to stderr)."""
    try:
        value = function(*decode(args))
    except SystemExit:
        return {"error": "SystemExit: the function exited instead of returning"}
    except BaseException as error:
        print_traceback(error)
        return {"error": f"{type(error).__name__}: {error}"}
    try:
        reply = {"value": encode(value)}
        message_line(reply)  # json itself may refuse it (an int of more than 4300 digits)
        return reply
    except (Unserialisable, ValueError, RecursionError) as error:
        return {"unserialisable": f"{type(error).__name__}: {error}"}


def answer_calls(function, data):
    """Answer {"args": [...]} (one call) or {"batch": [[...], ...]} (several, in order) lines on fd 3 on fd 4,
    until the host stops the sample."""
    send(4, {"ready": True})
    while (line := data.next()) is not None:
        request = json.loads(line)
        if "batch" in request:
            reply = {"batch": [answer_call(function, args) for args in request["batch"]]}
        else:
            reply = answer_call(function, request["args"])
        sys.stdout.flush()
        send(4, reply)


def run_program(request, data):
    """In a forked child: run the program as `python solution.py` would (then answer calls if it has a
    `fn_name`), and exit the way the interpreter does (threads joined, atexit handlers run, streams flushed)
    but without its slow teardown of every module."""
    source = request["source"]
    linecache.cache["solution.py"] = (len(source), None, source.splitlines(True), "solution.py")  # for tracebacks
    main = types.ModuleType("__main__")
    main.__file__ = "solution.py"
    sys.modules["__main__"] = main  # so pickle & co. find the program's own definitions
    try:
        exec(compile(source, "solution.py", "exec"), main.__dict__)
        if request["fn_name"]:
            answer_calls(find_function(main.__dict__, request["fn_name"]), data)
        status = 0
    except SystemExit as exit_:
        status = exit_status(exit_.code)
    except BaseException as error:
        print_traceback(error)
        status = 1
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            status = 120
    os._exit(status)


_sample = serve(sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1", json.loads(sys.argv[4]))
if _sample is not None:
    run_program(*_sample)
