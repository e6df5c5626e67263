"""`spolake view` on a large lake: how long the site takes to build and how big its pages get.

Builds a synthetic lake (N trajectories over N/100 prompts, three sources, five runs, every row judged), then
writes its site. Prints the build time, its ratio to a baseline measured in the same run (one full read of the
trajectories with their verdicts: the least any site of them costs), the page count and the largest page.

    python bench/view_bench.py                  # 100k trajectories
    python bench/view_bench.py --dry-run        # 300 trajectories (tests/view/test_view_bench.py runs it)
"""
from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from spo_lake.lake import Lake
from spo_lake.lake.rows import evaluation_row, trajectory_row
from spo_lake.lake.sql import VERDICT_SQL
from spo_lake.view.site import build_site

WORDS = ["def", "solve", "(", ")", ":", "return", "x", "+", "*", "7", "8", "for", "i", "in", "range", "n", "\n", " "]
VERDICTS = ["ok", "wrong_answer", "runtime_error", "timeout", "syntax"]


def fill(lake: Lake, trajectories: int, response_chars: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    prompts = max(1, trajectories // 100)
    lake.append("prompts", [{"prompt_id": f"bench/{p}", "task": "countdown", "prompt": f"Reach {p} with [7, 8]",
                             "tests": f'{{"target": {p}, "numbers": [7, 8]}}'} for p in range(prompts)])
    chunk = 20_000
    for start in range(0, trajectories, chunk):
        rows, verdicts = [], []
        for i in range(start, min(start + chunk, trajectories)):
            tid = f"t{i:08d}"
            text = "".join(rng.choice(WORDS) for _ in range(response_chars // 3))[:response_chars]
            source = ("policy", "grpo", "human")[i % 3]
            rows.append(trajectory_row(
                trajectory_id=tid, prompt_id=f"bench/{i % prompts}", source=source, model_id="m",
                run_id=None if source == "human" else f"run-{i % 5}", policy_version=i % 7, temperature=1.0,
                top_p=1.0, response_text=text, token_ids=None, behavior_logprobs=None, tokenizer_id=None,
                response_hash=tid, metadata={}))
            verdict = VERDICTS[i % len(VERDICTS)]
            verdicts.append(evaluation_row(trajectory_id=tid, verifier="countdown", passed=verdict == "ok",
                                           reward=0.0 if verdict == "ok" else -1.0, verdict=verdict,
                                           first_failing_test=None, detail="Traceback ...\n" * 3, duration_s=0.01,
                                           extraction="raw"))
        lake.append("trajectories", rows)
        lake.append("evaluations", verdicts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--response-chars", type=int, default=400)
    parser.add_argument("--dry-run", action="store_true", help="300 trajectories: checks the script still works")
    parser.add_argument("--keep", type=Path, help="build the lake and site here instead of a temporary directory")
    args = parser.parse_args()
    n = 300 if args.dry_run else args.trajectories
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        lake = Lake.init(root / "lake")
        began = time.perf_counter()
        fill(lake, n, args.response_chars)
        print(f"lake: {n} trajectories over {max(1, n // 100)} prompts written in {time.perf_counter() - began:.1f} s")
        began = time.perf_counter()
        lake.sql(f"SELECT * FROM trajectories t LEFT JOIN ({VERDICT_SQL}) v USING (trajectory_id)")
        baseline = time.perf_counter() - began
        began = time.perf_counter()
        summary = build_site(lake, root / "site", show_progress=False)
        seconds = time.perf_counter() - began
        total = sum(p.stat().st_size for p in (root / "site").rglob("*") if p.is_file())
        print(f"baseline (one read of the trajectories with their verdicts): {baseline:.2f} s")
        print(f"site: {seconds:.1f} s ({seconds / baseline:.1f}x the baseline), {summary.pages} pages, "
              f"{summary.trajectories} trajectories shown, largest page {summary.largest_page_bytes / 1e6:.2f} MB, "
              f"{total / 1e6:.0f} MB in all (plotly.js 4.8 MB once)")


if __name__ == "__main__":
    main()
