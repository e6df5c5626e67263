"""Peak memory of `spolake ingest` on hostile sizes (issue 43): one huge Parquet string cell, one huge CSV field,
a one-row Parquet file with very many columns, against an ordinary small file as the baseline.

    python tests/security/rss_probe.py [--scale 1.0] [--dir /tmp/spolake-rss]

prints a Markdown table (peak RSS of each ingest process from wait4, and its wall time). At --scale 1 the sizes are
the issue's: a 300 MB cell, a 350 MB field, 100,000 columns, under the default limits; a smaller scale shrinks the
sizes and the limits alike (the test runs --scale 0.001).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from spo_lake.ingest.readers import DEFAULT_MAX_COLUMNS, DEFAULT_MAX_LINE_BYTES

CLI = [sys.executable, "-m", "spo_lake.cli.app", "--lake"]


def generate(root: Path, s: float) -> None:
    """The input files. Run in a child: Linux keeps a process's peak RSS across fork and exec, so the measuring
    parent must never hold them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    (root / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt_id": f"p{i}", "task": "countdown", "prompt": "reach 10"}) + "\n" for i in range(100)))
    (root / "small.jsonl").write_text("".join(
        json.dumps({"prompt_id": f"p{i}", "response": "x = 1"}) + "\n" for i in range(100)))
    pq.write_table(pa.table({"prompt_id": ["p1"], "response": ["x" * int(300e6 * s)]}), root / "cell.parquet")
    hidden = ["x = 1"] * 9_999 + ["x" * int(300e6 * s)]  # a row group whose average cell is small
    pq.write_table(pa.table({"prompt_id": ["p1"] * 10_000, "response": hidden}), root / "hidden.parquet")
    del hidden
    with (root / "field.csv").open("w") as fh:
        fh.write('prompt_id,response\np1,"')
        for _ in range(int(350 * s)):
            fh.write("y" * 1_000_000)
        fh.write("y" * int((350e6 * s) % 1_000_000) + '"\n')
    columns = {"prompt_id": ["p1"], "response": ["r"], **{f"c{i}": [i] for i in range(int(100_000 * s))}}
    pq.write_table(pa.table(columns), root / "wide.parquet")


def ingest(lake: Path, path: Path, env: dict[str, str]) -> tuple[str, float, float]:
    """(last stderr line or 'ok', peak RSS MiB, seconds) of one `spolake ingest` child."""
    started = time.monotonic()
    child = subprocess.Popen([*CLI, str(lake), "ingest", str(path)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    assert child.stderr is not None
    err = child.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    said = "ok" if child.returncode == 0 else (err.strip().splitlines() or ["?"])[-1]
    return said, usage.ru_maxrss / 1024, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--dir", default="/tmp/spolake-rss")
    parser.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    root, s = Path(args.dir), args.scale
    if args.generate:
        return generate(root, s)
    subprocess.run([sys.executable, __file__, "--generate", "--scale", str(s), "--dir", str(root)], check=True)
    env = {**os.environ, "SPOLAKE_MAX_LINE_BYTES": str(max(1000, int(DEFAULT_MAX_LINE_BYTES * s))),
           "SPOLAKE_MAX_COLUMNS": str(max(10, int(DEFAULT_MAX_COLUMNS * s)))}
    lake = root / "lake"
    for args_ in (["init"], ["prompts", "add", str(root / "prompts.jsonl")]):
        subprocess.run([*CLI, str(lake), *args_], check=True, env=env, stdout=subprocess.DEVNULL)
    print("| input | size | ingest says | peak RSS (MiB) | seconds |\n|---|---|---|---|---|")
    for name, file, size in [("baseline: 100 small JSONL rows", "small.jsonl", "4 KB"),
                             ("one Parquet string cell", "cell.parquet", f"{300 * s:g} MB cell"),
                             ("the same cell among 9,999 small rows", "hidden.parquet", f"{300 * s:g} MB cell"),
                             ("one CSV field", "field.csv", f"{350 * s:g} MB field"),
                             ("one-row Parquet, many columns", "wide.parquet", f"{int(100_000 * s) + 2} columns")]:
        said, rss, seconds = ingest(lake, root / file, env)
        verdict = "accepted" if said == "ok" else f"refused: {said.removeprefix('error: ').split(': ', 1)[-1][:80]}"
        print(f"| {name} | {size} | {verdict} | {rss:.0f} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
