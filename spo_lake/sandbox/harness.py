"""The harness that runs inside the sandbox: one test per request, each in a freshly forked child.

The host starts it once per sandbox as `python -I -S -B -c <this file> BASE PIDNS SETUID` and reuses it for
many tests, so a test costs a fork instead of an interpreter start. Standard library only; the host never
imports it. Protocol: one JSON request per line on stdin, one JSON reply per line on stdout.

  request: {"source", "stdin", "fn_name", "args", "timeout_s", "memory_mb", "max_output_bytes",
            "max_processes", "max_open_files", "token"}   or {"ping": true}
  reply:   {"exit_code", "timed_out", "wall_s", "stdout", "stdout_bytes", "stderr", "stderr_bytes", "value", "dirty"}

A child runs the source as `__main__` (then calls `fn_name(*args)` if given, at top level or on
`Solution()`), and only after finishing normally writes the token and the JSON return value to fd 3.
Expected outputs never enter the sandbox, so a program cannot read them. After every test all other
processes of the sandbox are killed and the working directory is wiped.

PIDNS=1: the sandbox has its own pid namespace, so kill(-1) reaches exactly the leftovers of a test.
SETUID=1: the harness runs as root with a few capabilities (setuid, setgid, kill, file access for the
clean-up), and each test drops to a fresh random uid with none, which makes RLIMIT_NPROC count the
processes of that test alone and keeps the test from signalling, tracing or reading the harness.
Otherwise the harness makes itself undumpable, so tests under its own uid cannot read its memory or fds.
"""
import atexit
import gc
import json
import linecache
import os
import resource
import select
import shutil
import signal
import site
import sys
import time
import traceback
import types

# Imported once here so that programs importing them (most do) pay nothing; all are stateless at import
# (not `random`, whose seeded state every child would inherit).
PRELOADED = ("bisect", "collections", "functools", "heapq", "itertools", "math", "re", "string", "typing")
STDERR_TAIL_BYTES = 4096
FIRST_TEST_UID = 1 << 30  # far above real users; a random one of 2**24 per test


def read_requests():
    """Lines from fd 0, read unbuffered so a forked child inherits no half-read control data."""
    pending = b""
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield json.loads(line)


def reply(message):
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def make_undumpable():
    """Keep tests that run under the harness's own uid out of /proc/<harness>/mem and /proc/<harness>/fd."""
    import ctypes

    pr_set_dumpable = 4
    ctypes.CDLL(None).prctl(pr_set_dumpable, 0, 0, 0, 0)


def wipe(path):
    """Recreate an empty, world-writable directory; False if the old one could not be removed."""
    try:
        if os.lstat(path).st_mode == 0o40777 and not os.listdir(path):
            return True  # most programs write no files: nothing to do
    except FileNotFoundError:
        pass
    clean = True
    if os.path.lexists(path):
        try:
            shutil.rmtree(path)
        except OSError:
            clean = False
            os.rename(path, f"{path}.{time.monotonic_ns()}")
    os.mkdir(path)
    os.chmod(path, 0o777)
    return clean


def warm_up():
    """Pay first-use costs (the parser's start-up is about a millisecond) here, once, not in every child."""
    program = (
        "import sys\nclass A:\n    def f(self, x: int) -> list[int]:\n        return [i for i in range(x) if i % 2]\n"
        "print(f'{A().f(3)!r}', {1: (lambda: 2)}, *[3], sep='')\n"
    )
    compile(program, "warm_up.py", "exec")
    json.dumps({"token": "", "value": [0, 0.5, "", None, True]}, default=repr)


def enter_child(request, files, work_dir, own_pidns, drop_uid):
    """In the forked child: wire stdin, stdout, stderr and the value channel (fd 3), apply the limits, drop privileges."""
    for target, fd in enumerate(files):
        os.dup2(fd, target)
    os.closerange(len(files), 1 << 16)
    if not own_pidns:
        os.setpgid(0, 0)  # without a pid namespace the harness can only kill the test's process group
    os.chdir(work_dir)
    memory = request["memory_mb"] << 20
    cpu = int(request["timeout_s"]) + 1
    limits = {
        resource.RLIMIT_AS: (memory, memory),
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_FSIZE: (request["max_output_bytes"], request["max_output_bytes"]),
        resource.RLIMIT_NPROC: (request["max_processes"], request["max_processes"]),
        resource.RLIMIT_NOFILE: (request["max_open_files"], request["max_open_files"]),
        resource.RLIMIT_CORE: (0, 0),
    }
    for kind, limit in limits.items():
        resource.setrlimit(kind, limit)
    if drop_uid:
        uid = FIRST_TEST_UID + int.from_bytes(os.urandom(3), "little")
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def kill_leftovers(pid, own_pidns):
    """Kill every process the test left behind and wait until they are gone."""
    if not own_pidns:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    me = os.getpid()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)  # every process of the namespace but init and the harness
        except ProcessLookupError:
            pass
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not others:
            return
        time.sleep(0.001)


def read_file(path, limit, tail=False):
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if tail and size > limit:
            f.seek(size - limit)
        return f.read(limit).decode("utf-8", "replace"), size


def run_test(request, io_dir, work_dir, own_pidns, drop_uid):
    """Run one test; returns the request in the forked child and the reply in the harness."""
    dirty = not wipe(work_dir)
    with open(f"{io_dir}/stdin", "wb") as f:
        f.write((request.get("stdin") or "").encode("utf-8", "surrogatepass"))
    names = ("stdin", "stdout", "stderr", "value")
    files = [os.open(f"{io_dir}/{name}", os.O_RDONLY if name == "stdin" else os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o600) for name in names]
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            enter_child(request, files, work_dir, own_pidns, drop_uid)
        except BaseException as error:  # never fall back into the harness loop
            os.write(2, f"sandbox harness: {type(error).__name__}: {error}\n".encode())
            os._exit(125)
        return request
    for fd in files:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    timed_out = not select.select([pidfd], [], [], request["timeout_s"])[0]
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    wall_s = time.monotonic() - started
    os.close(pidfd)
    kill_leftovers(pid, own_pidns)
    cap = request["max_output_bytes"]
    stdout, stdout_bytes = read_file(f"{io_dir}/stdout", cap)
    stderr, stderr_bytes = read_file(f"{io_dir}/stderr", STDERR_TAIL_BYTES, tail=True)
    value, _ = read_file(f"{io_dir}/value", cap)
    return {
        "exit_code": os.waitstatus_to_exitcode(status), "timed_out": timed_out, "wall_s": wall_s,
        "stdout": stdout, "stdout_bytes": stdout_bytes,
        "stderr": stderr, "stderr_bytes": stderr_bytes, "value": value, "dirty": dirty,
    }


def serve(base, own_pidns, drop_uid):
    """Answer requests until stdin closes; returns only inside a forked child, with its request."""
    io_dir, work_dir = f"{base}/io", f"{base}/work"
    os.makedirs(io_dir, mode=0o700, exist_ok=True)
    if not drop_uid:
        make_undumpable()
    site.setquit()  # exit() and quit(), which -S leaves out
    for name in PRELOADED:
        __import__(name)
    warm_up()
    gc.freeze()  # children then neither scan nor copy-on-write the harness's own objects in collections
    for request in read_requests():
        if request.get("ping"):
            reply({"pong": True})
            continue
        try:
            outcome = run_test(request, io_dir, work_dir, own_pidns, drop_uid)
        except Exception as error:  # e.g. the tmpfs is full: the host marks the run sandbox_error
            outcome = {"harness_error": f"{type(error).__name__}: {error}"}
        if outcome is request:
            return request
        reply(outcome)
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


def run_program(request):
    """In a forked child: run the program as `python solution.py` would, then exit the way the interpreter does
    (threads joined, atexit handlers run, streams flushed) but without its slow teardown of every module.

    Normal completion writes the token and the JSON return value to fd 3: exit() or os._exit() skip it.
    """
    source = request["source"]
    linecache.cache["solution.py"] = (len(source), None, source.splitlines(True), "solution.py")  # for tracebacks
    main = types.ModuleType("__main__")
    main.__file__ = "solution.py"
    sys.modules["__main__"] = main  # so pickle & co. find the program's own definitions
    try:
        exec(compile(source, "solution.py", "exec"), main.__dict__)
        value = find_function(main.__dict__, request["fn_name"])(*request["args"]) if request["fn_name"] else None
        os.write(3, json.dumps({"token": request["token"], "value": value}, default=repr).encode())
        status = 0
    except SystemExit as exit_:
        status = exit_status(exit_.code)
    except BaseException as error:  # the traceback a script would print, without this frame
        error = error.with_traceback(error.__traceback__.tb_next)
        if sys.excepthook is sys.__excepthook__:  # the C hook reads source lines from disk, not linecache
            traceback.print_exception(error)
        else:
            sys.excepthook(type(error), error, error.__traceback__)
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


_request = serve(sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1")
if _request is not None:
    run_program(_request)
