"""Ctrl-C: every verb stops within a couple of seconds, says so in one line, and exits 130 (128 + SIGINT). `kill`
(SIGTERM) stops it the same way and exits 143 (128 + SIGTERM): a run it ends is recorded interrupted, not left
`running` (a demo terminating its training children, a scheduler stopping a job).

The first signal raises `Interrupted` in the main thread, so `finally` blocks and context managers run as usual
(a run's `runs` row says interrupted, a trainer closes its worker). Some waits cannot be cut short from Python:
a `with ThreadPoolExecutor` block finishes every queued job before it exits, a sandbox run its test. So the
first signal also arms a watchdog: GRACE_S later, or at a second Ctrl-C, the process leaves through os._exit
wherever it is (the watchdog first records the runs still open as interrupted: `spo_lake.ending`). That is safe
for the lake for the same reason a SIGKILL is: every write is a Delta commit, which either lands whole or not at
all, and every verb skips what earlier commits hold, so a rerun continues.

`Interrupted` is not a KeyboardInterrupt on purpose: click turns those into "Aborted!" and exit 1.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

from spo_lake.ending import record_open_endings

EXIT_CODE = 130  # Ctrl-C's; SIGTERM's is 143: 128 + the signal's number, as a shell reports a process it killed
GRACE_S = 1.5
MESSAGE = "interrupted; rerun to continue"

_fired = threading.Event()
_said = threading.Lock()
_exit_code = EXIT_CODE


class Interrupted(BaseException):
    """Raised in the main thread by the first Ctrl-C or SIGTERM."""


def install() -> None:
    """Handle SIGINT and SIGTERM as above. Installed even where SIGINT was inherited as ignored (a job started with
    `&` from a script): a user who presses Ctrl-C or sends SIGINT to a verb wants it to stop."""
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def _on_signal(signum: int, frame: object) -> None:
    global _exit_code
    if _fired.is_set():
        if signum == signal.SIGINT:  # a second Ctrl-C: no more waiting
            leave()
        # a SIGTERM while stopping already (a parent passing on the Ctrl-C this process got from the terminal too)
        # waits for the watchdog, which records the open runs before it leaves
        return
    _exit_code = 128 + signum
    _fired.set()
    watchdog = threading.Timer(GRACE_S, _force_exit)
    watchdog.daemon = True
    watchdog.start()
    raise Interrupted


def _force_exit() -> None:
    """The watchdog: record the open runs as interrupted (spo_lake.ending: their own records may be stuck behind a
    pool), then leave. A second Ctrl-C leaves at once, even while a record is under way."""
    record_open_endings()
    leave()


def leave() -> None:
    """Print the one line (once, whichever thread gets here first) and exit now, skipping every teardown."""
    _said.acquire()  # never released: a second caller waits here until the first one's os._exit
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe has nothing left to flush to
            pass
    os.write(2, f"\n{MESSAGE}\n".encode())  # the newline ends the terminal's "^C" (or a progress line)
    os._exit(_exit_code)
