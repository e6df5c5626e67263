"""Sampling and scoring throughput of TransformersPolicy against transformers' own `generate`, same run.

1. Sampling: `policy.sample` (our KV-cache loop that also reports sampled-from log-probs) versus
   `model.generate(do_sample=True, output_scores=True)` on the same left-padded prompts, same batch size,
   temperature and max_new_tokens; generated tokens/s of each and the ratio (target: >= 0.8x generate).
2. Scoring: `policy.score` in batches versus one sequence at a time; scored tokens/s and the ratio.
3. A temperature per prompt drawn from U(0.1, 0.8) (the paper's reference sampling, `spolake sample
   --temperature-range`): the prompts in shared batches, each row at its own temperature, versus one call per
   temperature (what the sample pipeline did before 2026-11-27: every prompt its own batch); tokens/s and the ratio.

Rounds alternate and the best of each side counts, so machine load hits both alike.

    .venv/bin/python bench/sample_bench.py [--model DIR] [--prompts 128] [--max-new 32] [--threads 2]

Without --model the tiny model is built first (a few CPU minutes).
"""
from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch
from dry_run import parse_args, random_model, scratch

from spo_lake.models.backend import TransformersPolicy
from spo_lake.tasks.countdown import make_problems


def best_of(rounds: int, fn) -> tuple[float, int]:
    """(best seconds, tokens) over rounds of fn() -> tokens."""
    best, tokens = float("inf"), 0
    for _ in range(rounds):
        started = time.perf_counter()
        tokens = fn()
        best = min(best, time.perf_counter() - started)
    return best, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (default: build the tiny model)")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--max-new", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=3)
    args = parse_args(parser, prompts=8, max_new=4, batch_size=4, rounds=1)
    torch.set_num_threads(args.threads)
    records, _ = make_problems(args.prompts, seed=99)
    model_dir = args.model
    if model_dir is None and args.dry_run:
        model_dir = random_model(scratch("sample-bench-"), [r["prompt"] for r in records])
    elif model_dir is None:
        from spo_lake.models.tiny import build_tiny_model

        model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="tiny-")))
    policy = TransformersPolicy.from_pretrained(model_dir, batch_size=args.batch_size)
    prompts = [r["prompt"] for r in records]

    def ours() -> int:
        return sum(len(r.token_ids) for r in policy.sample(prompts, max_new_tokens=args.max_new, seed=0))

    tokenizer = policy.tokenizer
    tokenizer.padding_side = "left"

    def generate() -> int:
        tokens = 0
        for start in range(0, len(prompts), args.batch_size):
            batch = tokenizer(prompts[start : start + args.batch_size], return_tensors="pt", padding=True)
            with torch.inference_mode():
                out = policy.model.generate(
                    **batch, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new,
                    output_scores=True, return_dict_in_generate=True, pad_token_id=policy.pad_id,
                )
            new = out.sequences[:, batch.input_ids.shape[1] :]
            # Count up to and including each row's EOS, as `sample` does.
            for row in new.tolist():
                tokens += row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        return tokens

    ours_s, ours_tokens = best_of(args.rounds, ours)
    gen_s, gen_tokens = best_of(args.rounds, generate)
    print(f"sample:   {ours_tokens / ours_s:10.0f} tokens/s  (policy.sample, {ours_tokens} tokens in {ours_s:.2f} s)")
    print(f"generate: {gen_tokens / gen_s:10.0f} tokens/s  (model.generate, {gen_tokens} tokens in {gen_s:.2f} s)")
    print(f"ratio sample/generate: {(ours_tokens / ours_s) / (gen_tokens / gen_s):.2f}x")

    results = policy.sample(prompts, max_new_tokens=args.max_new, seed=1)
    prompt_ids = [policy.encode_prompt(prompts[r.prompt_index]) for r in results]
    response_ids = [r.token_ids for r in results]
    n_tokens = sum(len(r) for r in response_ids)
    batched_s, _ = best_of(args.rounds, lambda: len(policy.score(prompt_ids, response_ids, batch_size=args.batch_size)))
    single_s, _ = best_of(args.rounds, lambda: len(policy.score(prompt_ids, response_ids, batch_size=1)))
    print(f"score batched: {n_tokens / batched_s:10.0f} tokens/s; one at a time: {n_tokens / single_s:10.0f} tokens/s; "
          f"ratio {single_s / batched_s:.2f}x")

    rng = random.Random(0)
    temperatures = [rng.uniform(0.1, 0.8) for _ in prompts]

    def shared() -> int:
        results = policy.sample(prompts, n=2, temperature=temperatures, max_new_tokens=args.max_new, seed=2)
        return sum(len(r.token_ids) for r in results)

    def per_temperature() -> int:
        return sum(len(r.token_ids) for p, t in zip(prompts, temperatures)
                   for r in policy.sample([p], n=2, temperature=t, max_new_tokens=args.max_new, seed=2))

    shared_s, shared_tokens = best_of(args.rounds, shared)
    alone_s, alone_tokens = best_of(args.rounds, per_temperature)
    print(f"temperature per prompt, shared batches: {shared_tokens / shared_s:10.0f} tokens/s; one batch per "
          f"temperature: {alone_tokens / alone_s:10.0f} tokens/s; ratio {(shared_tokens / shared_s) / (alone_tokens / alone_s):.2f}x")


if __name__ == "__main__":
    main()
