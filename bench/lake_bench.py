"""Lake benchmark: ingest throughput and snapshot-query time against plain Parquet, measured in the same run.

1. Ingest N synthetic trajectories (~200 token ids each, code-like text, log-probs, rewards, metadata) through
   `ingest_trajectories(lake, from_arrow(...))` (validation, ids, response hashes, imported verdicts, Delta commit)
   and write the same Arrow table with plain `pyarrow.parquet.write_table` (same compression and row-group size as
   the lake's files, default encodings otherwise). Rounds alternate and the best of each side counts, so machine
   load hits both alike. The lake's writer differs from the baseline in encodings (token ids delta-encoded, no
   dictionary or statistics on list columns; see spo_lake/lake/writer.py) and writes files on all cores; the CPU
   seconds printed beside each time show what a single core would see.
2. Run a group-by aggregate at a snapshot through `lake.sql` (snapshot lookup and view set-up included) and with
   plain DuckDB over the plain Parquet file.
3. `--rss-rows 125000,1000000,4000000`: peak RSS of one `spolake ingest` process (from wait4) of a Parquet file of
   that many rows, next to its throughput. The file is written in chunks, so the bench itself stays small.

    .venv/bin/python bench/lake_bench.py               # 1,000,000 rows (needs ~10 GiB RAM, a few minutes)
    .venv/bin/python bench/lake_bench.py --rows 50000  # quick check
    .venv/bin/python bench/lake_bench.py --rows 0 --rss-rows 125000,1000000,4000000  # memory ceiling (~10 min)

Targets (issue 2): ingest >= 0.7x raw Parquet throughput; snapshot query <= 1.2x plain-Parquet time.
Target (issue 18): ingest peak RSS <= 1 GiB whatever the input size (default --batch-rows).
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from dry_run import parse_args

from spo_lake.ingest import PROMPT_FIELDS, TRAJECTORY_FIELDS, add_prompts, from_arrow, ingest_trajectories
from spo_lake.lake import Lake
from spo_lake.lake.writer import COMPRESSION, ROW_GROUP_ROWS

N_PROMPTS = 5000
QUERY = """SELECT prompt_id, count(*) AS n, round(avg(len(token_ids)), 6) AS mean_tokens,
                  round(avg(temperature), 6) AS mean_temperature,
                  max(policy_version) AS last_policy
           FROM {table} GROUP BY prompt_id ORDER BY prompt_id"""

_NAMES = ["x", "y", "total", "count", "items", "result", "left", "right", "node", "seen", "memo", "queue", "grid", "n"]
_LINES = [
    "def solve({a}, {b}):", "    {a} = {b} + 1", "    for {a} in range(len({b})):", "        if {a} > {b}:",
    "            {a}.append({b})", "    return {a}", "    while {a} < {b}:", "        {a} += {b} * 2",
    "    {a} = sorted({b}, key=lambda v: -v)", "    {a} = {{}}", "        {a}[{b}] = {a}.get({b}, 0) + 1",
    "import sys", "    {a} = list(map(int, sys.stdin.readline().split()))", "print({a})", "    # check the {a} case",
    "    if not {a}:", "        return {b}", "    {a}, {b} = {b}, {a}", "        break", "    {a} = max({a}, {b})",
]


def synthetic_trajectories(rows: int, seed: int = 0) -> pa.Table:
    """Realistic-looking trajectory records: code-like responses, 150-250 token ids, per-token log-probs."""
    rng = np.random.default_rng(seed)
    pool = [line.format(a=a, b=b) for line in _LINES for a in _NAMES for b in _NAMES[:5]]
    lengths = rng.integers(150, 251, rows).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total = int(offsets[-1])
    token_ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 50_000, total, dtype=np.int32)))
    logprobs = pa.ListArray.from_arrays(pa.array(offsets), pa.array(-rng.exponential(0.3, total).astype(np.float32)))
    picks = rng.integers(0, len(pool), (rows, 24))
    n_lines = (lengths // 9).astype(np.int64)  # ~4 characters a token, ~36 characters a line
    responses = ["\n".join(pool[j] for j in picks[i, : n_lines[i]]) + "\n" for i in range(rows)]
    prompt_idx = rng.integers(0, N_PROMPTS, rows)
    return pa.table({
        "prompt_id": pa.array([f"bench/{i:05d}" for i in range(N_PROMPTS)]).take(pa.array(prompt_idx)),
        "response": pa.array(responses, pa.string()),
        "token_ids": token_ids,
        "logprobs": logprobs,
        "tokenizer": pa.repeat(pa.scalar("gpt2"), rows),
        "model": pa.repeat(pa.scalar("tiny-ref"), rows),
        "run_id": pa.repeat(pa.scalar("bench-run"), rows),
        "policy_version": pa.array(rng.integers(0, 20, rows)),
        "temperature": pa.array(rng.uniform(0.1, 0.8, rows)),
        "top_p": pa.repeat(pa.scalar(0.95), rows),
        "reward": pa.array(np.where(rng.random(rows) < 0.3, 0.0, -1.0)),
        "metadata": pa.array([f'{{"attempt": {int(a)}, "seed": {int(s)}}}'
                              for a, s in zip(rng.integers(0, 20, rows), rng.integers(0, 10**6, rows))]),
    })


def prompts_table() -> pa.Table:
    ids = [f"bench/{i:05d}" for i in range(N_PROMPTS)]
    return pa.table({"prompt_id": ids, "task": ["countdown"] * N_PROMPTS,
                     "prompt": [f"Reach target {i} with the numbers given." for i in range(N_PROMPTS)]})


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(fn, repeat: int = 1) -> tuple[float, float, object]:
    """Best wall-clock seconds, the CPU seconds of that run (all threads), and the result."""
    best, cpu, out = float("inf"), 0.0, None
    for _ in range(repeat):
        gc.collect()
        c0, t0 = _cpu(), time.perf_counter()
        out = fn()
        wall = time.perf_counter() - t0
        if wall < best:
            best, cpu = wall, _cpu() - c0
    return best, cpu, out


def write_input(path: Path, rows: int, chunk: int = 125_000) -> None:
    """`rows` synthetic trajectories as one Parquet file, generated and written a chunk at a time."""
    writer = None
    for i, start in enumerate(range(0, rows, chunk)):
        part = synthetic_trajectories(min(chunk, rows - start), seed=i)
        writer = writer or pq.ParquetWriter(path, part.schema)
        writer.write_table(part)
    writer.close()


def ingest_rss(work: Path, rows: int) -> tuple[float, float]:
    """(seconds, peak RSS in GiB) of one `spolake ingest` of `rows` rows into a fresh lake."""
    src, lake_dir = work / f"rss-{rows}.parquet", work / f"rss-lake-{rows}"
    write_input(src, rows)
    lake = Lake.init(lake_dir)
    add_prompts(lake, from_arrow(prompts_table(), PROMPT_FIELDS, "bench-prompts", "prompts"))
    spolake = str(Path(sys.executable).with_name("spolake"))
    t0 = time.perf_counter()
    proc = subprocess.Popen([spolake, "--lake", str(lake_dir), "ingest", str(src), "--source", "policy"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read().decode()[-2000:]
    assert Lake.open(lake_dir).count("trajectories") == rows
    shutil.rmtree(lake_dir)
    src.unlink()
    return wall, usage.ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=2, help="alternating raw/lake write rounds; the best of each counts")
    ap.add_argument("--query-repeats", type=int, default=5)
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir, removed afterwards)")
    ap.add_argument("--rss-rows", default="", help="comma-separated input sizes for the peak-RSS run, e.g. "
                                                  "125000,1000000,4000000")
    args = parse_args(ap, rows=2000, repeats=1, query_repeats=1, rss_rows="")

    work = Path(args.dir or tempfile.mkdtemp(prefix="lake_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        for rows in [int(r) for r in args.rss_rows.split(",") if r]:
            wall, rss = ingest_rss(work, rows)
            print(f"spolake ingest {rows:>10,} rows (Parquet): {wall:7.1f}s {rows / wall:9,.0f} rows/s  "
                  f"peak RSS {rss:5.2f} GiB", flush=True)
        if not args.rows:
            return
        t0 = time.perf_counter()
        data = synthetic_trajectories(args.rows)
        print(f"generated {args.rows:,} trajectories ({data.nbytes / 2**30:.2f} GiB in Arrow) "
              f"in {time.perf_counter() - t0:.1f}s; {os.cpu_count()} CPUs")
        plain = work / "plain.parquet"
        raw = lake_run = (float("inf"), 0.0)
        for _ in range(args.repeats):  # alternate, so both see the same machine load
            wall, cpu, _ = timed(lambda: pq.write_table(data, plain, compression=COMPRESSION,
                                                        row_group_size=ROW_GROUP_ROWS))
            raw = min(raw, (wall, cpu))
            shutil.rmtree(work / "lake", ignore_errors=True)
            lake = Lake.init(work / "lake")
            add_prompts(lake, from_arrow(prompts_table(), PROMPT_FIELDS, "bench-prompts", "prompts"))
            wall, cpu, report = timed(lambda lake=lake: ingest_trajectories(
                lake, from_arrow(data, TRAJECTORY_FIELDS, "bench", "trajectories"), source="policy"))
            assert report.new == args.rows, report
            lake_run = min(lake_run, (wall, cpu))
        lake.snapshot("bench")

        lake_q = timed(lambda: lake.sql(QUERY.format(table="trajectories"), snapshot="bench"), args.query_repeats)
        plain_sql = QUERY.format(table=f"read_parquet('{plain}')")
        plain_q = timed(lambda: duckdb.connect().sql(plain_sql).to_arrow_table(), args.query_repeats)
        assert lake_q[2].equals(plain_q[2]), "lake and plain Parquet disagree"

        lake_bytes = sum(p.stat().st_size for p in (work / "lake").rglob("*.parquet"))
        print(f"raw pyarrow.parquet write : {raw[0]:7.2f}s (cpu {raw[1]:6.2f}s) {args.rows / raw[0]:10,.0f} rows/s "
              f"({plain.stat().st_size / 2**20:,.0f} MiB)")
        print(f"lake ingest, validated    : {lake_run[0]:7.2f}s (cpu {lake_run[1]:6.2f}s) "
              f"{args.rows / lake_run[0]:10,.0f} rows/s ({lake_bytes / 2**20:,.0f} MiB, all tables)")
        print(f"group-by, plain Parquet   : {plain_q[0] * 1e3:7.1f} ms")
        print(f"group-by, lake @ snapshot : {lake_q[0] * 1e3:7.1f} ms")
        ingest_ratio, query_ratio = raw[0] / lake_run[0], lake_q[0] / plain_q[0]
        print(f"ingest throughput ratio (lake / raw)  : {ingest_ratio:.2f}x  (target >= 0.70) "
              f"{'OK' if ingest_ratio >= 0.7 else 'MISSED'}")
        print(f"snapshot query time ratio (lake/plain): {query_ratio:.2f}x  (target <= 1.20) "
              f"{'OK' if query_ratio <= 1.2 else 'MISSED'}")
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
