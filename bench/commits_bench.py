"""Write-back at scale: append latency and a count query from 100 to 10,000 commits.

The trainer writes its online rollouts back to the lake as it trains; every flush is one Delta commit of a small
file. This bench commits one step's worth of trajectories (--rows, default 16) per commit through the trainer's
`BufferedAppender` (one flush per step), which runs the lake's upkeep after each commit (compaction of the files
under 1 MiB every 50 versions, a Delta checkpoint every 100: spo_lake/lake/upkeep.py), and prints the curve: at
each mark, the mean latency of the last --window commits (upkeep included, so compactions are amortised in), their
median, their mean CPU time (the process's own work, which other jobs on a shared machine do not inflate), and the
time of `SELECT count(*) FROM trajectories` through `lake.sql` (what `spolake sql` runs). `--no-upkeep` commits the
same rows with `Lake.append_many` alone: the baseline the upkeep is measured against (slow: stop it at ~1,000).

    .venv/bin/python bench/commits_bench.py                      # 10,000 commits (~30 min at load average 5-10 on 2 cores)
    .venv/bin/python bench/commits_bench.py --commits 1000 --no-upkeep

Target (issue 15): append latency at 10,000 commits <= 2x that at 100.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dry_run import parse_args

from spo_lake.lake import Lake
from spo_lake.lake.appender import BufferedAppender

MARKS = (100, 300, 1000, 3000, 10_000, 30_000)


def step_rows(step: int, rows: int) -> list[dict]:
    """One training step's write-back: `rows` sampled responses with token ids and behaviour log-probs."""
    return [{"trajectory_id": f"run-bench/{step}/{i}", "prompt_id": f"countdown/0/{(step * rows + i) % 500}",
             "source": "spo", "model_id": "bench", "run_id": "run-bench", "policy_version": step // 10,
             "temperature": 0.5, "top_p": 0.95, "response_text": f"print({step} * {i} + 7)\n" * 4,
             "token_ids": list(range(step % 97, step % 97 + 64)), "behavior_logprobs": [-0.25] * 64,
             "tokenizer_id": "bench", "response_hash": f"h{step}-{i}"} for i in range(rows)]


def count_query_s(lake: Lake, repeat: int = 3) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(repeat):
        started = time.perf_counter()
        n = lake.sql("SELECT count(*) AS n FROM trajectories").column("n")[0].as_py()
        best = min(best, time.perf_counter() - started)
    return best, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=16, help="trajectories per commit (one step's rollouts)")
    parser.add_argument("--window", type=int, default=50, help="commits averaged at each mark")
    parser.add_argument("--no-upkeep", action="store_true", help="baseline: plain appends, no compaction/checkpoints")
    args = parse_args(parser, commits=100, window=10)

    work = Path(tempfile.mkdtemp(prefix="commits_bench_"))
    try:
        lake = Lake.init(work / "lake")
        appender = BufferedAppender(lake, flush_rows=args.rows)
        marks = [m for m in MARKS if m <= args.commits]
        mode = "plain appends (no upkeep)" if args.no_upkeep else "BufferedAppender + upkeep"
        print(f"{mode}: {args.rows} trajectories per commit; load average {os.getloadavg()[0]:.1f} on "
              f"{len(os.sched_getaffinity(0))} cores")
        print(f"{'commits':>8}{'mean ms':>9}{'median ms':>11}{'max ms':>9}{'CPU ms':>8}{'count(*) ms':>13}{'files':>7}"
              f"{'load':>6}")
        latencies: list[float] = []
        cpu: list[float] = []  # the process's CPU time per commit: its work, whatever else loads the machine
        first = first_cpu = None
        for step in range(1, args.commits + 1):
            rows = step_rows(step, args.rows)
            started, cpu_started = time.perf_counter(), time.process_time()
            if args.no_upkeep:
                lake.append_many({"trajectories": rows})
            else:
                appender.add("trajectories", rows)  # flush_rows = one step: commits now, then upkeep
            latencies.append(time.perf_counter() - started)
            cpu.append(time.process_time() - cpu_started)
            if step in marks:
                window = latencies[-args.window:]
                query_s, n = count_query_s(lake)
                assert n == step * args.rows, (n, step)
                mean, mean_cpu = statistics.mean(window), statistics.mean(cpu[-args.window:])
                first, first_cpu = first or mean, first_cpu or mean_cpu
                print(f"{step:>8}{mean * 1e3:>9.1f}{statistics.median(window) * 1e3:>11.1f}{max(window) * 1e3:>9.1f}"
                      f"{mean_cpu * 1e3:>8.1f}{query_s * 1e3:>13.1f}{len(lake.files('trajectories')):>7}{os.getloadavg()[0]:>6.1f}",
                      flush=True)
        if first and len(marks) > 1:
            ratio = statistics.mean(latencies[-args.window:]) / first
            cpu_ratio = statistics.mean(cpu[-args.window:]) / first_cpu
            print(f"append latency at {marks[-1]:,} / at {marks[0]:,} commits: {ratio:.2f}x  (target <= 2.0) "
                  f"{'OK' if ratio <= 2.0 else 'MISSED'}; CPU time per append: {cpu_ratio:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
