"""Isolated execution of untrusted Python: bubblewrap namespaces, seccomp, rlimits, a wall clock, a pool.

    run_python(source, stdin="", timeout_s=5.0, memory_mb=512, mode="bwrap") -> RunResult
    run_many(jobs, limits, workers, mode) / SandboxPool(workers).map(fn, items)
    Sandbox(mode).run(Job(...), Limits(...))  -- one script run; many runs reuse one sandbox
    Sandbox(mode).session(source, fn_name, limits, budget_s).call(*args)  -- call a function with data, get data

mode="none" runs WITHOUT isolation (CLI: --sandbox none); only for code you trust.
"""
from spo_lake.sandbox.bwrap import SandboxUnavailable
from spo_lake.sandbox.pool import SandboxPool, default_workers, run_many, run_python, thread_sandbox
from spo_lake.sandbox.runner import MODES, RUN_VERDICTS, CallFailed, Job, Limits, RunResult, Sandbox, Session

__all__ = [
    "MODES", "RUN_VERDICTS", "CallFailed", "Job", "Limits", "RunResult", "Sandbox", "SandboxPool", "SandboxUnavailable",
    "Session",
    "default_workers", "run_many", "run_python", "thread_sandbox",
]
