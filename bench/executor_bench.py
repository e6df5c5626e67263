"""Rollout throughput (sample + sandboxed judging, written to the lake) of the local executor vs Ray with 2 workers.

Both run the real `sample(..., evaluate=True)` pipeline on fresh lakes of the same countdown prompts, same model and
settings: `local` samples in this process (torch on every core) and judges in threads; `ray` runs 2 rollout actors
(one CPU each, each loading the model) on a local Ray instance started once before the rounds. A Ray round includes
its actors' start-up (each run of the pipeline starts its own); the instance's start is printed apart. Rounds
alternate and the best of each side counts, so machine load hits both alike. The two runs' rows are also compared.
The same pair is timed without judging (sampling alone), to tell the engines' sampling from the overlap of sampling
and judging that the actors add.

    .venv/bin/python bench/executor_bench.py [--model DIR] [--prompts 64] [--n 4] [--max-new 32] [--rounds 2]

Without --model the tiny model is built first (a few CPU minutes).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import ray
from dry_run import parse_args, random_model, scratch

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.pipelines.sample import sample


def run(kind: str, judge: bool, policy: TransformersPolicy, root: Path, args: argparse.Namespace
        ) -> tuple[float, Lake, int]:
    """(seconds, lake, tokens) of one `sample [--evaluate]` run with executor `kind` on a fresh lake."""
    lake = Lake.init(Path(tempfile.mkdtemp(dir=root)) / "lake")
    ingest_dataset(lake, "countdown", None, n=args.prompts, seed=0)
    started = time.perf_counter()
    report = sample(lake, policy, n=args.n, max_new_tokens=args.max_new, batch=args.batch, seed=1, evaluate=judge,
                    executor=kind, workers=2 if kind == "ray" else None, show_progress=False)
    return time.perf_counter() - started, lake, report.tokens


def rows(lake: Lake) -> list[tuple]:
    found = lake.sql("""SELECT t.prompt_id, t.metadata, t.token_ids, e.passed FROM trajectories t
                        JOIN evaluations e USING (trajectory_id) WHERE t.source = 'reference'""").to_pylist()
    return sorted((r["prompt_id"], json.loads(r["metadata"])["sample_index"], r["token_ids"], r["passed"])
                  for r in found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: build the tiny model)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--max-new", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16, help="responses per sampling call")
    parser.add_argument("--rounds", type=int, default=2)
    args = parse_args(parser, prompts=4, n=2, max_new=4, batch=4, rounds=1)
    model_dir = args.model
    if model_dir is None and args.dry_run:
        from spo_lake.tasks.countdown import make_problems

        model_dir = random_model(scratch("executor-bench-"), [r["prompt"] for r in make_problems(8, seed=0)[0]])
    elif model_dir is None:
        from spo_lake.models.tiny import build_tiny_model

        model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="tiny-")))
    policy = TransformersPolicy.from_pretrained(model_dir)
    started = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"ray instance (2 CPUs) started in {time.perf_counter() - started:.1f} s")
    rollouts = args.prompts * args.n
    sides = [(kind, judge) for judge in (True, False) for kind in ("local", "ray")]
    best = {side: float("inf") for side in sides}
    tokens, last = {}, {}
    with tempfile.TemporaryDirectory() as root:
        try:
            for _ in range(args.rounds):
                for side in sides:
                    seconds, lake, tokens[side] = run(*side, policy, Path(root), args)
                    best[side] = min(best[side], seconds)
                    if side[1]:
                        last[side[0]] = rows(lake)
        finally:
            ray.shutdown()
    for judge, what in ((True, "sampled and judged"), (False, "sampled (no judging)")):
        for kind in ("local", "ray"):
            seconds = best[kind, judge]
            print(f"{kind:5}: {rollouts / seconds:7.1f} rollouts/s, {tokens[kind, judge] / seconds:7.0f} tokens/s "
                  f"({rollouts} {what} in {seconds:.2f} s)")
        print(f"ratio ray(2 workers)/local, {what}: {best['local', judge] / best['ray', judge]:.2f}x")
    print(f"same rows (prompt, sample index, token ids, verdict): {last['local'] == last['ray']}")


if __name__ == "__main__":
    main()
