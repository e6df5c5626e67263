"""Peak memory of the policy's token log-probs at a real vocabulary, before and after issue 15.

before: the logits of the last T+1 positions, sliced to T, and a float32 log-softmax over the whole [B, T, V].
after:  the trainer's `spo_lake.rl.scoring.response_log_probs` as it is now: logits of exactly the T scoring positions
        and the chunked selective log-softmax (`spo_lake.models.sampling.gather_token_log_probs`).

A randomly initialised Llama with a Qwen-sized vocabulary (151,936) and a small body, one forward and backward pass of
`sum(log p(response tokens))` over --batch x --tokens response tokens. Each variant runs in its own subprocess;
peak = high-water resident memory during the pass minus the resident memory before it (on a GPU:
torch.cuda.max_memory_allocated minus allocated before), so the model's weights are not counted but everything the
pass creates is (logits, their gradient, the log-softmax, weight gradients).

    .venv/bin/python bench/logprobs_memory_bench.py [--tokens 1024] [--batch 1] [--vocab 151936] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from dry_run import parse_args


def before(model: torch.nn.Module, batch) -> torch.Tensor:
    """response_log_probs and gather_token_log_probs as they were before issue 15."""
    width = batch.response_ids.shape[1]
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                   logits_to_keep=width + 1).logits[:, :-1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)


def resident_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def run_variant(args: argparse.Namespace) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from spo_lake.models.threads import use_threads
    from spo_lake.rl.examples import Example, collate
    from spo_lake.rl.scoring import response_log_probs

    use_threads()
    device = "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                         max_position_embeddings=2 * args.tokens + 64, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).to(device=device, dtype=getattr(torch, args.dtype))
    ids = torch.randint(0, args.vocab, (args.batch, 32 + args.tokens)).tolist()
    batch = collate([Example(0, "p", row[:32], row[32:], 0.0, 0.0) for row in ids], pad_id=0).to(device)
    log_probs = response_log_probs if args.variant == "after" else before

    def step() -> None:
        model.zero_grad(set_to_none=True)
        log_probs(model, batch).sum().backward()

    step()  # warm-up: allocator pools, lazily created gradients
    model.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        baseline = resident_mb()
        Path("/proc/self/clear_refs").write_text("5")  # restart the high-water mark at the current RSS
    started = time.perf_counter()
    step()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - baseline) / 2**20
    else:
        peak = resident_mb("VmHWM") - baseline
    return {"variant": args.variant, "device": device, "peak_mb": peak, "seconds": time.perf_counter() - started,
            "logits_mb": args.batch * args.tokens * args.vocab * torch.finfo(getattr(torch, args.dtype)).bits / 8
            / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024, help="response tokens per sequence")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--device", default="auto", help="auto (cuda when available) or cpu")
    parser.add_argument("--variant", choices=("before", "after"), help=argparse.SUPPRESS)  # child mode
    args = parse_args(parser, tokens=16, vocab=1000, hidden=32, layers=1, device="cpu")
    if args.variant:
        print(json.dumps(run_variant(args)))
        return
    results = {}
    for variant in ("before", "after"):
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", variant],
                               capture_output=True, text=True)
        if child.returncode != 0:
            sys.exit(f"{variant} failed:\n{child.stderr[-3000:]}")
        results[variant] = json.loads(child.stdout.strip().splitlines()[-1])
    old, new = results["before"], results["after"]
    print(f"vocabulary {args.vocab:,}, {args.batch} x {args.tokens} response tokens, {args.dtype} on {old['device']}; "
          f"one [B, T, V] logits tensor = {old['logits_mb']:,.0f} MB; load average {os.getloadavg()[0]:.1f}")
    for r in (old, new):
        print(f"{r['variant']:<8} peak {r['peak_mb']:>8,.0f} MB  ({r['peak_mb'] / r['logits_mb']:.1f}x the logits)  "
              f"{r['seconds']:.2f} s")
    print(f"peak memory after / before: {new['peak_mb'] / old['peak_mb']:.2f}")


if __name__ == "__main__":
    main()
