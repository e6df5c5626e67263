"""Shared helpers for the sandbox tests: they run the real bwrap sandbox and skip only where bwrap is missing."""
from __future__ import annotations

import os
import shutil
import time

import pytest

from spo_lake.sandbox import Sandbox, thread_sandbox

requires_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


def descendants(pid: int) -> list[int]:
    """Host pids of every process below `pid`, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
        children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def pid_namespace(sandbox: Sandbox) -> str:
    """The pid namespace of a running sandbox (its bwrap's first child is the namespace's init)."""
    assert sandbox.pid is not None
    return os.readlink(f"/proc/{descendants(sandbox.pid)[0]}/ns/pid")


def processes_in(namespace: str, wait_s: float = 60.0) -> list[int]:
    """Host pids still in pid namespace `namespace` once they are gone or `wait_s` (a generous bound) has passed."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                    found.append(int(entry))
            except OSError:
                continue  # exited while we looked
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def host_processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture
def sandbox() -> Sandbox:
    """The test thread's long-lived sandbox, as run_python uses it."""
    return thread_sandbox("bwrap")
