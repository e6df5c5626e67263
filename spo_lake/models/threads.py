"""How many intra-op threads torch uses: one policy for every verb that runs a model.

torch's own default is every core of the machine, which is wrong twice over: in a container or under `taskset` the
process may use fewer cores than the machine has, and when the rollout worker samples while the trainer updates, both
run torch at once, so each of them taking every core makes them fight (on a busy 2-core machine an update that takes
0.15 s with one thread swung between 0.2 and 2.7 s with two). `torch.set_num_threads` is process-wide (threads started
later follow it), so the count is per torch user times the users running at once. OMP_NUM_THREADS, which torch's
own default follows, caps the count here too: a user (or a parent such as `spolake demo`) who set it gets no more.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from spo_lake.errors import InputError

CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def cgroup_cpu_quota(v2: Path = CGROUP_V2_MAX, v1_quota: Path = CGROUP_V1_QUOTA,
                     v1_period: Path = CGROUP_V1_PERIOD) -> float | None:
    """CPUs' worth of time the container may use per period (e.g. 1.5), or None when unlimited or unknown."""
    try:
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if v1_quota.exists():
            quota_us = int(v1_quota.read_text())
            return None if quota_us <= 0 else quota_us / int(v1_period.read_text())
    except (OSError, ValueError):
        return None
    return None


def available_cores() -> int:
    """Cores this process may actually run on: its CPU affinity, capped by the cgroup CPU quota (rounded down, at
    least 1: a 1.5-CPU quota gives 1 thread that never waits for its share rather than 2 that do)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, math.floor(quota))) if quota else cores


def thread_cap() -> int | None:
    """OMP_NUM_THREADS, the usual way to cap a process's compute threads (its first level: OpenMP allows a list);
    None when unset or not a positive count (OpenMP ignores those too)."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else None


def default_threads(concurrent: int = 1) -> int:
    """Threads for each of `concurrent` torch users running at once (trainer + rollout worker = 2), at most
    OMP_NUM_THREADS when that is set (`spolake demo` sets 1 for its training children)."""
    share = max(1, available_cores() // concurrent)
    cap = thread_cap()
    return min(share, cap) if cap else share


def use_threads(threads: int | None = None, concurrent: int = 1) -> int:
    """Set torch's intra-op threads to `threads` (None or 0: `default_threads(concurrent)`); returns the count."""
    import torch

    if threads is not None and threads < 0:
        raise InputError(f"threads must be >= 0 (0 = from the available cores), got {threads}")
    n = threads or default_threads(concurrent)
    torch.set_num_threads(n)
    return n
