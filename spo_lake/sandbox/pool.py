"""Many sandboxed runs in parallel: worker threads, each reusing its own long-lived sandbox.

Threads suffice because every test runs in a sandboxed process; the host only waits on pipes. A thread's
sandbox starts on its first run and dies with the thread (bwrap's --die-with-parent follows the thread
that started it), so a pool's sandboxes go away when the pool closes.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from spo_lake.sandbox.runner import Job, Limits, RunResult, Sandbox

T = TypeVar("T")
R = TypeVar("R")
_local = threading.local()


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_sandbox(mode: str = "bwrap") -> Sandbox:
    """The calling thread's sandbox for `mode`, started on first use and reused by every later run."""
    sandboxes: dict[str, Sandbox] = _local.__dict__.setdefault("sandboxes", {})
    if mode not in sandboxes:
        sandboxes[mode] = Sandbox(mode)
    return sandboxes[mode]


def run_python(source: str, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512,
               mode: str = "bwrap") -> RunResult:
    """Run `source` as a script with `stdin`, sandboxed, under the same limits as every other call.

    Never raises for anything the program does; raises SandboxUnavailable when bwrap cannot run here.
    """
    return thread_sandbox(mode).run(Job(source, stdin=stdin), Limits(timeout_s=timeout_s, memory_mb=memory_mb))


class SandboxPool:
    """`workers` threads (default: one per core); `map` keeps the order of its items."""

    def __init__(self, workers: int | None = None):
        self.workers = workers or default_workers()
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sandbox")

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """fn(item) on the worker threads, results lazily in input order (fn may call run_python or a verifier)."""
        return self._executor.map(fn, items)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def run_many(jobs: Sequence[Job], limits: Limits = Limits(), workers: int | None = None,
             mode: str = "bwrap") -> list[RunResult]:
    """Run every job in parallel; results in the order of `jobs`."""
    with SandboxPool(workers) as pool:
        return list(pool.map(lambda job: thread_sandbox(mode).run(job, limits), jobs))
