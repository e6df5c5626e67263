"""The GPU check (scripts/gpu_check.sh): bf16 SPO and PPO training steps at 135 M and ~1 B parameters, and vLLM
rollouts where vLLM is importable, written as one JSON of figures.

It runs where only torch and transformers are installed (a lent GPU machine has no duckdb, deltalake, polars or
datasets, and no package index): no lake. The steps are the trainer's math on synthetic batches, imported from the
modules that are pure tensor code: `spo_lake.rl.losses.spo_loss`, `spo_lake.rl.ppo_math` (KL-penalised rewards,
GAE, clipped surrogate, value loss) and `spo_lake.models.sampling.gather_token_log_probs` (the chunked token
log-probs), with the model forward exactly as `spo_lake.rl.scoring.response_log_probs` does it. Models are
random-weight Llamas with SmolLM2-135M-Instruct's configuration (vocabulary 49,152) and a ~1 B one of the same
family: step time and memory do not depend on the weights, and the real weights (517 MB) exceed what travels to
the machine.

Variants per model: spo_cached (policy only; π0's log-probs given, as from the lake's cache), spo_live (policy +
a no-grad π0 forward), ppo (policy + value model + live π0; one AdamW over both, as the trainer), grpo (policy
only: TRL's default has no KL term, so no π0; group-relative advantages over groups of 4, `spo_lake.rl.grpo_math`). Per variant:
median step time over --steps after --warmup, response tokens/s, peak allocated memory (torch.cuda), and MFU =
achieved FLOP/s over --peak-tflops (790 = H100/H200 dense bf16 as the issue counts it): FLOPs per response-bearing
token 6N for each trained model and 2N for each no-grad forward, over all prompt+response tokens.

    scripts/gpu_check.sh [--out gpu_check.json]        # on a GPU: bf16, the sizes above (≤ 8 minutes)
    scripts/gpu_check.sh --dry-run --out /tmp/x.json   # on CPU: tiny sizes, float32, one step: checks it still runs
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's spo_lake, without installing it

from spo_lake.models.sampling import gather_token_log_probs, positions_from_mask  # noqa: E402
from spo_lake.rl.grpo_math import group_advantages, grpo_loss  # noqa: E402
from spo_lake.rl.losses import spo_loss  # noqa: E402
from spo_lake.rl.ppo_math import gae, kl_penalized_rewards, ppo_policy_loss, value_loss, whiten  # noqa: E402

BETA = 0.1
GROUP = 4  # GRPO: rollouts per prompt
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
# Llama-3.2-1B's body with SmolLM2's vocabulary: ~1.07 B parameters
LLAMA_1B = dict(vocab_size=49152, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True)
DRY = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
           num_key_value_heads=1, tie_word_embeddings=True)


def make_model(shape: dict, dtype: torch.dtype, device: str, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**shape, max_position_embeddings=4096)
    config._attn_implementation = "sdpa"
    with torch.device(device):  # initialised where it runs: a 1 B model's CPU init alone would take a minute
        return LlamaForCausalLM(config).to(dtype=dtype)


class ValueHead(torch.nn.Module):
    """The PPO value model as the trainer builds it (spo_lake.rl.ppo.ValueModel): a backbone plus a scalar head."""

    def __init__(self, shape: dict, dtype: torch.dtype, device: str):
        super().__init__()
        self.backbone = make_model(shape, dtype, device, seed=1).model
        self.head = torch.nn.Linear(shape["hidden_size"], 1).to(device=device, dtype=dtype)

    def forward(self, input_ids, attention_mask, width: int) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=positions_from_mask(attention_mask), use_cache=False).last_hidden_state
        return self.head(hidden[:, -(width + 1):-1]).squeeze(-1).float()


def token_log_probs(model, input_ids, attention_mask, width: int) -> torch.Tensor:
    """spo_lake.rl.scoring.response_log_probs on plain tensors: logits of the response positions only."""
    start = input_ids.shape[1] - width - 1
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=positions_from_mask(attention_mask), use_cache=False,
                   logits_to_keep=torch.arange(start, start + width, device=input_ids.device)).logits
    return gather_token_log_probs(logits, input_ids[:, start + 1:])


def run_variant(variant: str, shape: dict, args, dtype: torch.dtype, device: str) -> dict:
    policy = make_model(shape, dtype, device, seed=0)
    n_params = sum(p.numel() for p in policy.parameters())
    live_reference = variant in ("spo_live", "ppo")  # GRPO as TRL runs it by default: no KL term, no π0
    reference = make_model(shape, dtype, device, seed=0).requires_grad_(False) if live_reference else None
    value = ValueHead(shape, dtype, device) if variant == "ppo" else None
    params = list(policy.parameters()) + (list(value.parameters()) if value is not None else [])
    optimizer = torch.optim.AdamW(params, lr=1e-6)
    gen = torch.Generator().manual_seed(0)
    width, length = args.response_tokens, args.prompt_tokens + args.response_tokens
    input_ids = torch.randint(0, shape["vocab_size"], (args.batch, length), generator=gen).to(device)
    attention_mask = torch.ones_like(input_ids)
    mask = torch.ones(args.batch, width, dtype=torch.bool, device=device)
    reward = -(torch.rand(args.batch, generator=gen) < 0.5).float().to(device)
    cached = (-torch.rand(args.batch, width, generator=gen) * 3).to(device)  # π0's log-probs as if from the lake

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        logp = token_log_probs(policy, input_ids, attention_mask, width)
        if reference is not None:
            with torch.no_grad():
                ref = token_log_probs(reference, input_ids, attention_mask, width)
        else:
            ref = cached
        if variant == "grpo":  # on-policy (ratio 1), groups of GROUP rollouts of one prompt, no KL (TRL's default)
            advantages = group_advantages(reward, torch.arange(args.batch, device=device) // GROUP)
            loss = grpo_loss(logp, logp.detach(), advantages, mask).loss
        elif value is None:
            loss = spo_loss(logp, ref, mask, reward, torch.full_like(reward, 0.3), BETA, loss="ce").loss
        else:
            values = value(input_ids, attention_mask, width)
            old = logp.detach()  # π_old: on-policy rollouts (ratio 1), as at zero staleness
            rewards = kl_penalized_rewards(reward, old, ref, mask, BETA)
            advantages, returns = gae(rewards, values.detach(), mask, 1.0, 0.95)
            loss = ppo_policy_loss(logp, old, whiten(advantages, mask), mask, 0.2).loss \
                + 0.5 * value_loss(values, returns, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    trained = 6 * n_params * (2 if value is not None else 1)
    flops = (trained + (2 * n_params if reference is not None else 0)) * args.batch * length
    out = {"variant": variant, "parameters": n_params, "step_s": seconds,
           "response_tokens_per_s": args.batch * width / seconds, "tflops": flops / seconds / 1e12,
           "mfu": flops / seconds / (args.peak_tflops * 1e12),
           "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None}
    return out  # the models go with this frame: the next variant starts from empty memory


def vllm_rollouts(shape: dict, args) -> dict:
    """Sampling throughput of vLLM on the 135 M shape (random weights, token-id prompts: no tokenizer needed)."""
    try:
        from vllm import LLM, SamplingParams
    except Exception as exc:  # not installed, or installed without a usable GPU build
        return {"skipped": f"vllm not importable: {type(exc).__name__}: {exc}"[:300]}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        make_model(shape, torch.bfloat16, "cpu", seed=0).save_pretrained(tmp)
        llm = LLM(model=tmp, skip_tokenizer_init=True, dtype="bfloat16", gpu_memory_utilization=0.3, seed=0)
        prompts = [{"prompt_token_ids": list(range(100 + i, 100 + i + args.prompt_tokens))}
                   for i in range(args.rollout_prompts)]
        params = SamplingParams(n=8, temperature=1.0, max_tokens=args.response_tokens, ignore_eos=True,
                                detokenize=False)
        llm.generate(prompts[:2], params)  # warm-up: graphs, kernels
        started = time.perf_counter()
        outputs = llm.generate(prompts, params)
        seconds = time.perf_counter() - started
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"sequences": sum(len(o.outputs) for o in outputs), "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, float32, one step: does it run")
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (8: PPO at 1 B fits 78 GiB)")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--response-tokens", type=int, default=768)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rollout-prompts", type=int, default=64)
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="the accelerator's dense bf16 peak")
    args = parser.parse_args()
    if args.dry_run:
        args.batch, args.prompt_tokens, args.response_tokens, args.steps, args.warmup = 2, 8, 8, 1, 0
        device, dtype, models = "cpu", torch.float32, {"dry": DRY}
    else:
        if not torch.cuda.is_available():
            sys.exit("gpu_check: no CUDA device (use --dry-run to check the script on CPU)")
        device, dtype, models = "cuda", torch.bfloat16, {"smollm2-135m": SMOLLM2_135M, "llama-1b": LLAMA_1B}
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:], "dry_run": args.dry_run,
                    "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
                    "torch": torch.__version__, "dtype": str(dtype), "batch": args.batch,
                    "prompt_tokens": args.prompt_tokens, "response_tokens": args.response_tokens, "models": {}}
    for name, shape in models.items():
        results = {}
        for variant in ("spo_cached", "spo_live", "ppo", "grpo"):
            results[variant] = run_variant(variant, shape, args, dtype, device)
            if device == "cuda":
                torch.cuda.empty_cache()
        for r in results.values():
            print(f"{name:<14}{r['variant']:<12}{r['step_s']:>8.3f} s/step{r['response_tokens_per_s']:>10.0f} tok/s"
                  f"  MFU {r['mfu']:.3f}" + (f"  peak {r['peak_memory_gib']:.1f} GiB" if r["peak_memory_gib"] else ""),
                  flush=True)
        ratios = {f"{a}_over_{v}_{k}": results[a][k] / results[v][k]
                  for a in ("ppo", "grpo") for v in ("spo_cached", "spo_live") for k in ("step_s", "peak_memory_gib")
                  if results[v][k] is not None}
        report["models"][name] = {"variants": results, "ratios": ratios}
    report["vllm"] = vllm_rollouts(SMOLLM2_135M, args) if device == "cuda" else {"skipped": "dry run (CPU)"}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"gpu_check: figures written to {args.out}")


if __name__ == "__main__":
    main()
