"""Ingest of tool-shaped inputs against canonical ones, measured in the same run.

The same N trajectories (code-like responses, 150-250 token ids with log-probs) are written as Parquet three ways and
ingested into fresh lakes through `spo_lake.ingest` (the `spolake ingest` path):
1. canonical columns: checked column-wise (the baseline);
2. the same plus one extra column (kept in metadata): reshaped record by record;
3. TRL's prompt/completion shape: no prompt_id (hashed from the prompt), `completion` for `response`, a 1/0 reward
   mapped with `--reward-map binary`: record by record.
Then a re-ingest of (1) without its model column, which looks the rows up by content (`adopt_unattributed`), against
a plain re-ingest of (1). Ratios are times against the baseline of the same run.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dry_run import parse_args

from bench.lake_bench import prompts_table, synthetic_trajectories
from spo_lake.ingest import ingest, ingest_prompts
from spo_lake.lake import Lake


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def fresh_lake(root: Path, name: str, prompts: pa.Table) -> Lake:
    lake = Lake.init(root / name)
    ingest_prompts(lake, prompts)
    return lake


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    args = parse_args(ap, rows=300)
    canonical = synthetic_trajectories(args.rows)
    prompts = prompts_table()
    text = dict(zip(prompts["prompt_id"].to_pylist(), prompts["prompt"].to_pylist()))
    extra = canonical.append_column("judge", pa.repeat(pa.scalar("gpt"), args.rows))
    trl = pa.table({"prompt": pa.array([text[p] for p in canonical["prompt_id"].to_pylist()]),
                    "completion": canonical["response"], "token_ids": canonical["token_ids"],
                    "logprobs": canonical["logprobs"], "model": canonical["model"],
                    "reward": pc.add(canonical["reward"], 1.0)})  # 1 pass / 0 fail
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, table in (("canonical", canonical), ("extra", extra), ("trl", trl)):
            pq.write_table(table, root / f"{name}.parquet")
        lakes = {name: fresh_lake(root, name, prompts) for name in ("canonical", "extra", "trl")}
        base, _ = timed(lambda: ingest(lakes["canonical"], str(root / "canonical.parquet")))
        print(f"canonical columns:           {base:7.2f} s  (baseline, {args.rows / base:,.0f} rows/s)")
        t, _ = timed(lambda: ingest(lakes["extra"], str(root / "extra.parquet")))
        print(f"+ one extra column:          {t:7.2f} s  {t / base:5.2f}x")
        t, _ = timed(lambda: ingest(lakes["trl"], str(root / "trl.parquet"), task="countdown", reward_map="binary"))
        print(f"TRL prompt/completion shape: {t:7.2f} s  {t / base:5.2f}x")
        lake = lakes["canonical"]
        again, report = timed(lambda: ingest(lake, str(root / "canonical.parquet")))
        assert report.new == 0
        pq.write_table(canonical.drop_columns(["model"]), root / "no_model.parquet")
        t, report = timed(lambda: ingest(lake, str(root / "no_model.parquet")))
        assert report.new == 0, report
        print(f"re-ingest: {again:.2f} s; without the model column (content lookup): {t:.2f} s  {t / again:5.2f}x")


if __name__ == "__main__":
    main()
