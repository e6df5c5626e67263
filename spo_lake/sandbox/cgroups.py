"""Limits on a whole sandbox (every process in it together): memory, process count and CPU share, by cgroup.

rlimits bound each process alone, so a program that forks could otherwise hold several memory limits' worth or
starve concurrent judgments of CPU. Each sandbox therefore gets its own cgroup, created under a `spo-lake` group:

- cgroup v2 (what most machines have): under $SPO_LAKE_CGROUP if set (a directory delegated to you, e.g. by
  `systemd-run --user -p Delegate=yes`), else under the root of the unified hierarchy (needs root). The memory,
  pids and cpu controllers must be available there.
- cgroup v1 (as root, where the memory, pids and cpu hierarchies are mounted and writable): one group per
  controller, under this process's own group in each.
- Otherwise, or with SPO_LAKE_CGROUP=off: the fallback is rlimits alone (address space and process count per
  process, CPU time per process); nothing bounds a sandbox's processes together.

`cgroup_mode()` decides once per process and prints one line to stderr saying which applies.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
HEADROOM_MB = 64  # bwrap and the zygote live in the sandbox's group too
_lock = threading.Lock()
_mode: tuple[str, dict[str, Path]] | None = None
_names = itertools.count()


@dataclass
class Cgroup:
    """One sandbox's group: a directory per controller (v1) or one directory for all (v2)."""

    version: str
    dirs: dict[str, Path]  # controller -> directory

    def procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def limit(self, memory_mb: int, processes: int, cpu_share: float) -> None:
        """Bound the group: memory (no swap), processes, and `cpu_share` CPUs. Raises OSError if refused."""
        memory, quota = (memory_mb + HEADROOM_MB) << 20, int(CPU_PERIOD_US * cpu_share)
        mem, pids, cpu = self.dirs["memory"], self.dirs["pids"], self.dirs["cpu"]
        if self.version == "v2":
            _write(mem / "memory.max", memory)
            if (mem / "memory.swap.max").exists():
                _write(mem / "memory.swap.max", 0)
            _write(pids / "pids.max", processes)
            _write(cpu / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            return
        files = [mem / "memory.limit_in_bytes", mem / "memory.memsw.limit_in_bytes"]
        files = [f for f in files if f.exists()]
        current = int((mem / "memory.limit_in_bytes").read_text())
        for file in files if memory <= current else reversed(files):  # memsw must stay >= the memory limit
            _write(file, memory)
        _write(pids / "pids.max", processes)
        _write(cpu / "cpu.cfs_period_us", CPU_PERIOD_US)
        _write(cpu / "cpu.cfs_quota_us", quota)

    def oom_kills(self) -> int:
        """How many processes the kernel has killed in this group for want of memory."""
        file = self.dirs["memory"] / ("memory.events" if self.version == "v2" else "memory.oom_control")
        try:
            for line in file.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        """Remove the group once its processes are gone (a killed pid namespace takes a moment to empty)."""
        deadline = time.monotonic() + 2.0
        for directory in set(self.dirs.values()):
            while directory.exists():
                try:
                    directory.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break  # still busy: an empty group left behind is harmless
                    time.sleep(0.01)


def cgroup_mode() -> str:
    """"v2", "v1" or "rlimits", decided on first use (with its one-line notice on stderr)."""
    return _detect()[0]


def new_cgroup() -> Cgroup | None:
    """A fresh, empty group for one sandbox, or None under the rlimits fallback."""
    version, bases = _detect()
    if version == "rlimits":
        return None
    name = f"{os.getpid()}-{next(_names)}"
    dirs = {controller: base / name for controller, base in bases.items()}
    for directory in set(dirs.values()):
        directory.mkdir(exist_ok=True)
    return Cgroup(version, dirs)


def _detect() -> tuple[str, dict[str, Path]]:
    global _mode
    with _lock:
        if _mode is None:
            _mode, notice = _choose()
            print(f"spo-lake sandbox: {notice}", file=sys.stderr, flush=True)
    return _mode


def _choose() -> tuple[tuple[str, dict[str, Path]], str]:
    setting = os.environ.get("SPO_LAKE_CGROUP", "")
    fallback = "limits are per process (rlimits): memory and CPU are not bounded across a sandbox's processes"
    if setting == "off":
        return ("rlimits", {}), f"SPO_LAKE_CGROUP=off; {fallback}"
    mounts = _cgroup_mounts()
    reasons = []
    for attempt in (_v2, _v1):
        try:
            bases = attempt(mounts, setting)
        except OSError as error:
            reasons.append(f"{attempt.__name__[1:]}: {error.strerror or error}")
            continue
        where = ", ".join(sorted({str(path) for path in bases.values()}))
        return (attempt.__name__[1:], bases), f"whole-sandbox limits by cgroup {attempt.__name__[1:]} " \
                                              f"(memory, pids, cpu) under {where}"
    return ("rlimits", {}), f"no usable cgroup ({'; '.join(reasons)}); {fallback}"


def _v2(mounts: dict[str, Path], setting: str) -> dict[str, Path]:
    if "cgroup2" not in mounts:
        raise OSError("no cgroup2 hierarchy mounted")
    root = mounts["cgroup2"]
    parent = Path(setting) if setting else root
    available = (parent / "cgroup.controllers").read_text().split() if (parent / "cgroup.controllers").exists() else []
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        raise OSError(f"controllers {', '.join(missing)} not available in {parent}")
    base = parent / "spo-lake"
    if not setting:
        _write(root / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
    base.mkdir(exist_ok=True)
    _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
    return {c: base for c in CONTROLLERS}


def _v1(mounts: dict[str, Path], setting: str) -> dict[str, Path]:
    own = _own_groups()
    bases = {}
    for controller in CONTROLLERS:
        if controller not in mounts:
            raise OSError(f"no {controller} hierarchy mounted")
        parent = mounts[controller] / own.get(controller, "").lstrip("/")
        base = (parent if parent.is_dir() else mounts[controller]) / "spo-lake"
        base.mkdir(exist_ok=True)
        probe = base / f"probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)  # writable for us, not just present
        probe.rmdir()
        bases[controller] = base
    return bases


def _cgroup_mounts() -> dict[str, Path]:
    """Mount points: "cgroup2" for the unified hierarchy, each controller's name for a v1 hierarchy."""
    mounts: dict[str, Path] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            separator = fields.index("-")
            fstype, options = fields[separator + 1], fields[separator + 3].split(",")
            if fstype == "cgroup2":
                mounts.setdefault("cgroup2", Path(fields[4]))
            elif fstype == "cgroup":
                for controller in CONTROLLERS:
                    if controller in options:
                        mounts.setdefault(controller, Path(fields[4]))
    return mounts


def _own_groups() -> dict[str, str]:
    """This process's v1 group in each controller's hierarchy."""
    groups = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(","):
                groups[controller] = path
    return groups


def _write(file: Path, value: object) -> None:
    file.write_text(f"{value}\n")
