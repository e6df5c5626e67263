"""PTS cost and sampling throughput on the tiny model.

1. Rollouts per trajectory: Pivotal Token Search (bisection) versus estimating S(t) at every position, same k and
   threshold, on successful trajectories (the model's own and the solver's answers). Every position's estimate is drawn once with real rollouts; the bisection is then replayed on those
   same estimates, so both see identical noise and the comparison is exact: PTS pays k rollouts per position it
   visits, the exhaustive scan pays k for every position. S(0) comes from q0 counts and S(T) = 1 from the verdict
   for both, as in the pipeline.
2. Sampling throughput in generated tokens/s: batched `sample` versus a batch-size-1 loop (the baseline).

    .venv/bin/python bench/pts_bench.py [--model DIR] [--trajectories 12] [--k 10] [--threshold 0.2] [--threads N]

Without --model the tiny model is built first (a few CPU minutes).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from dry_run import parse_args, random_model

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.models.tokens import render_prompt, tokenizer_id, trajectory_token_ids
from spo_lake.pipelines.judge import judge
from spo_lake.pipelines.pts import TOLERANCE, rollouts, search
from spo_lake.pipelines.q0 import latest_prompt_values, q0
from spo_lake.pipelines.sample import select_prompts
from spo_lake.rollouts.engine import RolloutWorker
from spo_lake.tasks import Problem, SandboxOptions
from spo_lake.tasks.countdown import make_problems


def successful_trajectories(lake: Lake, model: TransformersPolicy, count: int,
                            s0_range: tuple[float, float]) -> list[tuple[dict, float]]:
    """(row, S0) of successful trajectories (the model's samples and the solver's answers) whose prompt has S0 in
    s0_range, at most 2 per prompt so a few easy prompts do not dominate."""
    s0 = {r["prompt_id"]: r["n_success"] / r["n"] for r in latest_prompt_values(lake, model.model_id)}
    rows = lake.sql("""SELECT t.*, p.task, p.prompt, p.tests FROM trajectories t JOIN prompts p USING (prompt_id)
                       JOIN evaluations e USING (trajectory_id) WHERE e.passed AND e.verifier = 'countdown'
                       AND t.source IN ('reference', 'human') ORDER BY t.source DESC, t.trajectory_id""").to_pylist()
    picked, per_prompt = [], {}
    for r in rows:
        if s0_range[0] <= s0[r["prompt_id"]] <= s0_range[1] and per_prompt.get(r["prompt_id"], 0) < 2:
            per_prompt[r["prompt_id"]] = per_prompt.get(r["prompt_id"], 0) + 1
            picked.append((r, s0[r["prompt_id"]]))
    return picked[:count]


def pts_versus_exhaustive(lake: Lake, model: TransformersPolicy, count: int, k: int, threshold: float,
                          max_new_tokens: int, s0_range: tuple[float, float]) -> None:
    picked = successful_trajectories(lake, model, count, s0_range)
    if not picked:
        raise SystemExit(f"no successful trajectory with S0 in {s0_range}; widen --s0-range")
    tok_id, options, worker = tokenizer_id(model), SandboxOptions(), RolloutWorker(model, None)
    pts_rollouts = all_rollouts = pts_pivots = all_pivots = 0
    started = time.perf_counter()
    for n, (row, s0) in enumerate(picked):
        prompt_ids, tokens, _ = trajectory_token_ids(model, tok_id, row)
        problem, T = Problem.from_row(row), len(tokens)
        estimates = {0: s0, T: 1.0}
        for t in range(1, T):
            drawn = rollouts(worker, problem, prompt_ids, tokens[:t], k, max(max_new_tokens - t, 1), seed=n * 1000 + t,
                             options=options)
            estimates[t] = sum(bool(r.verdict and r.verdict.passed) for r in drawn) / k
        result = search(T, estimates.__getitem__, threshold)
        pts_rollouts += k * len(set(result.estimates) - {0, T})
        all_rollouts += k * (T - 1)
        pts_pivots += len(result.pivots)
        all_pivots += sum(abs(estimates[i + 1] - estimates[i]) + TOLERANCE >= threshold for i in range(T))
    seconds = time.perf_counter() - started
    m = len(picked)
    tokens = sum(len(trajectory_token_ids(model, tok_id, r)[1]) for r, _ in picked) / m
    print(f"PTS vs every position: {m} successful trajectories (S0 in {list(s0_range)}, {tokens:.1f} tokens on "
          f"average), k={k}, threshold={threshold}")
    print(f"  rollouts per trajectory: PTS {pts_rollouts / m:.1f}, every position {all_rollouts / m:.1f} "
          f"-> PTS spends {pts_rollouts / all_rollouts:.2f}x ({all_rollouts / max(pts_rollouts, 1):.1f}x fewer)")
    print(f"  pivotal tokens found: PTS {pts_pivots}, every position (consecutive changes >= threshold) {all_pivots}")
    print(f"  {all_rollouts / seconds:.0f} rollouts/s (sampled and judged in the sandbox)")


def sampling_throughput(model: TransformersPolicy, prompts: list[str], max_new_tokens: int) -> None:
    def tokens_per_second(policy: TransformersPolicy) -> float:
        started = time.perf_counter()
        results = policy.sample(prompts, n=1, temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens, seed=0)
        return sum(len(r.token_ids) for r in results) / (time.perf_counter() - started)

    one_at_a_time = TransformersPolicy(model.model, model.tokenizer, model.model_id, batch_size=1)
    tokens_per_second(model)  # warm-up
    batched, single = tokens_per_second(model), tokens_per_second(one_at_a_time)
    print(f"sampling {len(prompts)} responses (max {max_new_tokens} new tokens): batched (batch {model.batch_size}) "
          f"{batched:.0f} tokens/s, batch-size-1 loop {single:.0f} tokens/s -> {batched / single:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="tiny model directory (default: build one)")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--q0-k", type=int, default=32)
    parser.add_argument("--trajectories", type=int, default=12)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--threshold", type=float, default=0.2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--s0-range", type=float, nargs=2, default=(0.0, 0.8),
                        help="prompts to search by S0 (Phi-4: 0.2 0.8; the default also admits hard prompts)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    args = parse_args(parser, prompts=2, q0_k=2, trajectories=1, k=2, max_new_tokens=4)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.dry_run:
            prompts, solutions = make_problems(8, seed=7)
            args.model = random_model(Path(tmp) / "random", [p["prompt"] for p in prompts]
                                      + [s["response"] for s in solutions])
        elif args.model is None:
            from spo_lake.models.tiny import build_tiny_model

            args.model = str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        model = TransformersPolicy.from_pretrained(args.model)
        lake = Lake.init(Path(tmp) / "lake")
        ingest_dataset(lake, "countdown", None, n=args.prompts, seed=7)
        report = q0(lake, model, k=args.q0_k, max_new_tokens=args.max_new_tokens, show_progress=False)
        print(f"q0: {report.summary()}")
        judge(lake, where="t.source = 'human'", show_progress=False)
        pts_versus_exhaustive(lake, model, args.trajectories, args.k, args.threshold, args.max_new_tokens,
                              tuple(args.s0_range))
        prompts = [render_prompt(p) for p in select_prompts(lake, None)]
        sampling_throughput(model, (prompts * 4)[:64], args.max_new_tokens)


if __name__ == "__main__":
    main()
