"""How a run ended, recorded even when Ctrl-C's watchdog ends the process.

A run records its end (its `runs` row: finished, failed, interrupted) as its body unwinds. Ctrl-C's watchdog
(`spo_lake.cli.interrupt`) leaves through os._exit GRACE_S after the first SIGINT, wherever the main thread is; a
pool that finishes its queued jobs before it lets the exception through, or a busy machine, can keep the main thread
from that record past the grace, and the run stayed `running` for ever (a loaded test run saw it). So an open run
registers its ending here, and the watchdog records the endings still open before it leaves.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_registry = threading.Lock()
_open: set[Ending] = set()


class Ending:
    """A run's end, recorded once: by the run, or by a forced exit, whichever comes first (the other waits for a
    record under way, then does nothing)."""

    def __init__(self, record: Callable[[str], None]):
        self._record = record
        self._lock = threading.Lock()
        self.recorded: str | None = None

    def __call__(self, status: str) -> None:
        with self._lock:
            if self.recorded is None:
                self._record(status)
                self.recorded = status


@contextmanager
def open_ending(record: Callable[[str], None]) -> Iterator[Ending]:
    """An Ending that a forced exit records as interrupted while this block is open."""
    ending = Ending(record)
    with _registry:
        _open.add(ending)
    try:
        yield ending
    finally:
        with _registry:
            _open.discard(ending)


def record_open_endings(status: str = "interrupted") -> None:
    """For a forced exit: record every open run's end as `status` (a record that fails is skipped: the process is
    leaving anyway)."""
    with _registry:
        endings = list(_open)
    for ending in endings:
        try:
            ending(status)
        except Exception:  # noqa: BLE001 (a lake that cannot take the row must not keep the process alive)
            pass
