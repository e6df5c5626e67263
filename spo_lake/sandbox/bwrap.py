"""The bubblewrap command line that confines the harness, and the interpreter it runs.

Inside the sandbox there is no network (fresh net namespace), no other process (pid namespace), no host
IPC or hostname, and a filesystem of read-only system directories, the interpreter's own prefix,
/proc, a read-only minimal /dev and one size-capped private tmpfs at /tmp (every sample's writable working
directory, emptied after each; the harness caps its file count). No home, no lake, no project
checkout, no /etc beyond the dynamic loader's cache. The environment is cleared. The root is read-only.

Running as real root changes one thing: a user namespace would map the sandbox to host uid 0, which the
kernel exempts from RLIMIT_NPROC (a fork bomb would exhaust the host's pids). So under root the sandbox
keeps the host user namespace, bwrap keeps only the capabilities the harness needs, and the harness runs
every test as a fresh unprivileged uid with no capabilities at all (see harness.py). The seccomp filter
refuses new namespaces in both cases.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap) and make "
    "sure unprivileged user namespaces are enabled; running untrusted code unsandboxed needs an explicit "
    "mode='none' (CLI: --sandbox none)"
)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
SYSTEM_FILES = ("/etc/ld.so.cache",)  # the loader's index of /usr libraries: no secrets in it
HARNESS_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER")
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}
SANDBOX_TMP = "/tmp"


class SandboxUnavailable(RuntimeError):
    """bwrap is missing or cannot create a sandbox on this machine."""


def interpreter() -> tuple[str, str]:
    """(python executable, its installation prefix): the base interpreter, never a virtualenv's packages."""
    prefix = os.path.realpath(sys.base_prefix)
    executable = os.path.realpath(sys.executable)
    if not executable.startswith(prefix + os.sep):
        executable = os.path.join(prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    return executable, prefix


def python_command(harness_source: str, base: str, fds: str, *, own_pidns: bool, drop_uid: bool) -> list[str]:
    """The interpreter running the harness: isolated (-I), no site-packages (-S), no bytecode writes (-B)."""
    executable, _ = interpreter()
    return [executable, "-I", "-S", "-B", "-c", harness_source, base, str(int(own_pidns)), str(int(drop_uid)), fds]


def require_bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(f"bwrap (bubblewrap) is not installed: {INSTALL_HINT}")
    return path


def running_as_root() -> bool:
    return os.geteuid() == 0


def bwrap_command(command: list[str], *, tmpfs_mb: int, seccomp_fd: int | None) -> list[str]:
    """`bwrap ... command`: see the module docstring for what the sandbox contains."""
    argv = [require_bwrap(), "--die-with-parent", "--new-session", "--clearenv"]
    for name, value in SANDBOX_ENV.items():
        argv += ["--setenv", name, value]
    argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if running_as_root():
        argv += ["--cap-drop", "ALL"] + [arg for cap in HARNESS_CAPS for arg in ("--cap-add", cap)]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    _, prefix = interpreter()
    binds = [path for path in SYSTEM_FILES if os.path.isfile(path)]
    binds += [] if any(prefix == d or prefix.startswith(d + os.sep) for d in SYSTEM_DIRS) else [prefix]
    for path in binds:
        argv += _parent_dirs(path) + ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    argv += ["--size", str(tmpfs_mb << 20), "--tmpfs", SANDBOX_TMP, "--remount-ro", "/", "--chdir", SANDBOX_TMP]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv + command


def _parent_dirs(path: str) -> list[str]:
    """Create `path`'s parents world-readable: bwrap would copy modes such as /root's 0700, and tests run as other
    uids."""
    parents = [str(parent) for parent in reversed(Path(path).parents) if str(parent) != "/"]
    return [arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)]
