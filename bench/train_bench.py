"""Training-step throughput and peak memory: SFT (the floor), SPO with cached π0 log-probs, SPO with a live π0,
PPO with its value model, and GRPO (no value model; TRL's default of no KL term, so no π0) — same model, same
batch, same run.

Every variant runs the trainer's own update (`Trainer.update`) on one fixed batch drawn from a lake stream (SFT:
the same forward pass with the token cross-entropy), in its own subprocess so that memory is measured cleanly:
peak = high-water resident memory during the measured steps minus the resident memory before any model was built
(on a GPU: torch.cuda.max_memory_allocated), the largest over rounds. Throughput = non-padding tokens per second
of the fastest measured step over rounds (rounds interleave the variants, so a loaded machine hits all alike), in
wall time and in the process's CPU time (at --threads 1 the CPU time is the step's work, whatever else runs on the
machine: the steadier figure on a shared box).

The cached variant asserts that every row carries π0's cached log-probs and that the trainer never loaded a live
π0; the live variants assert that it did.

Targets: SPO with cache >= 0.9x SFT tokens/s (issue 5), >= 1.0x (issue 15); PPO peak memory >= 1.3x SPO's.

    .venv/bin/python bench/train_bench.py [--hidden 512] [--layers 6] [--batch 16] [--lines 8] [--steps 5] [--threads N]

--threads 0 (the default) applies the trainer's thread policy (spo_lake.models.threads: the cores available).

--model DIR trains a given model directory instead (e.g. the imported SmolLM2-135M-Instruct: `spolake model import
--from-gguf smollm2 --out models/smollm2`); --like DIR with --hidden/--layers/--intermediate builds a random-weight
model of DIR's architecture and tokenizer at another size (--heads: attention heads, a third of them key-value heads).
Besides RSS, each variant reports the training state by tensor accounting: bytes of parameters (policy, value model,
live π0), gradients, optimiser states, and the activations autograd saves for the backward pass (a saved-tensors
hook over one update, counting each storage once). --json FILE writes every figure.

The model is a randomly initialised Llama of the tiny model's architecture scaled up (throughput does not depend
on the weights); the lake holds countdown problems with multi-line solutions, Q0 counts and cached log-probs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from dry_run import parse_args

VARIANTS = ("sft", "spo_cached", "spo_live", "ppo", "grpo")
GRPO_GROUP = 4  # rollouts per prompt in the GRPO variant


def resident_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


# ---------------------------------------------------------------------------------------------- setup (parent)


def build(root: Path, args: argparse.Namespace) -> None:
    """A model directory and a lake with long-ish correct responses, Q0 counts and cached π0 log-probs."""
    from spo_lake.ingest import (
        PROMPT_FIELDS,
        TRAJECTORY_FIELDS,
        add_prompts,
        from_records,
        ingest_trajectories,
        located,
    )
    from spo_lake.lake import Lake
    from spo_lake.models.backend import TransformersPolicy
    from spo_lake.models.tiny import TinyConfig, build_tokenizer, make_model
    from spo_lake.pipelines.refprobs import refprobs
    from spo_lake.tasks.countdown import make_problems

    prompts, solutions = make_problems(args.batch * 2, seed=5)
    responses = {s["prompt_id"]: "\n".join([s["response"]] * args.lines) for s in solutions}
    if args.model:  # trained as it is: the lake's ids resolve through the link to the same directory
        (root / "model").symlink_to(Path(args.model).resolve())
    elif args.like:
        build_like(Path(args.like), root / "model", args)
    else:
        tokenizer = build_tokenizer([p["prompt"] for p in prompts] + list(responses.values()))
        config = TinyConfig(hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_layers=args.layers,
                            num_heads=max(1, args.hidden // 64), max_position_embeddings=2048)
        model = make_model(config, tokenizer)
        model.save_pretrained(root / "model")
        tokenizer.save_pretrained(root / "model")

    lake = Lake.init(root / "lake")
    add_prompts(lake, from_records(located(prompts, "bench"), PROMPT_FIELDS, "prompts"))
    records = [{"prompt_id": pid, "response": text, "reward": 0.0} for pid, text in responses.items()]
    ingest_trajectories(lake, from_records(located(records, "bench"), TRAJECTORY_FIELDS, "trajectories"),
                        source="human", defaults={"model": "solver"})
    # Q0 counts under the model's canonical id, the one refprobs records the cached log-probs under and the trainer
    # looks both up by (config.model.pi0_id): under another id the stream would find no cache and π0 would run live.
    pi0 = TransformersPolicy.from_pretrained(str(root / "model"))
    lake.append("values", [{"prompt_id": p["prompt_id"], "trajectory_id": None, "position": None, "model_id": pi0.model_id,
                            "temperature": 1.0, "top_p": 1.0, "n": 8, "n_success": 2} for p in prompts])
    refprobs(lake, pi0, show_progress=False)
    lake.snapshot("bench")


def build_like(like: Path, out: Path, args: argparse.Namespace) -> None:
    """A random-weight model of `like`'s architecture and tokenizer, resized."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(like)
    heads = args.heads or max(1, args.hidden // 64)
    config.update({"hidden_size": args.hidden, "num_hidden_layers": args.layers, "num_attention_heads": heads,
                   "num_key_value_heads": max(1, heads // 3), "head_dim": args.hidden // heads,
                   "intermediate_size": args.intermediate or 3 * args.hidden})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(like).save_pretrained(out)


# ---------------------------------------------------------------------------------------------- one variant (child)


def sft_update(trainer, examples) -> dict:
    """The floor: the same forward pass and optimizer, loss = mean token cross-entropy of the responses."""
    from spo_lake.rl.examples import collate
    from spo_lake.rl.scoring import response_log_probs

    trainer.model.train()
    trainer.optimizer.zero_grad(set_to_none=True)
    batch = collate(examples, trainer.policy.pad_id).to(trainer.device)
    logprobs = response_log_probs(trainer.model, batch)
    loss = -(logprobs * batch.response_mask).sum() / batch.response_mask.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1.0)
    trainer.optimizer.step()
    return {"tokens": batch.tokens}


def run_variant(root: Path, variant: str, args: argparse.Namespace) -> dict:
    from spo_lake.lake import Lake
    from spo_lake.models.backend import TransformersPolicy
    from spo_lake.models.threads import use_threads
    from spo_lake.rl.config import StreamConfig, load_config
    from spo_lake.rl.data import LakeStream, StreamSettings
    from spo_lake.rl.trainer import Trainer

    args.threads = use_threads(args.threads)
    model_id = str(root / "model")
    device = "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    lines = [f'model="{model_id}"', 'snapshot="bench"', f'run_dir="{root / "runs"}"', f"batch_size={args.batch}",
             f"threads={args.threads}", 'loss="squared"', "lr=1e-5", "warmup_steps=0", f'device="{device}"', "write_back=false"]
    online = ['streams.online.kind="online"', "streams.online.fraction=1.0"]
    lines += {"ppo": ['algorithm="ppo"', *online],
              "grpo": ['algorithm="grpo"', f"samples_per_prompt={GRPO_GROUP}", *online]}.get(
        variant, ['streams.lake.kind="lake"', "streams.lake.fraction=1.0"])
    config = load_config(None, lines)
    lake = Lake.open(root / "lake")
    tokenizer_only = TransformersPolicy.from_pretrained(model_id)  # tokenises the stream's rows
    stream = LakeStream(lake, "bench", StreamConfig("lake", "lake", 1.0), 0,
                        StreamSettings(config.model.pi0_id, 0.1, 0, max_response_tokens=4096), tokenizer_only)
    examples = stream.take(args.batch)
    # The stream finds π0's cached log-probs by the id the trainer uses: every row has them, none was recomputed.
    assert stream.ref_recomputed == 0 and all(e.ref_logprobs is not None for e in examples), \
        f"{variant}: rows without cached π0 log-probs under {config.model.pi0_id}"
    if variant in ("spo_live", "ppo", "grpo"):  # online rows: no cached π0 (SPO, PPO run it live; GRPO has no KL)
        # PPO's and GRPO's π_old: here π0's log-probs; GRPO's groups: GRPO_GROUP consecutive rows
        sampled = ("behavior_logprobs", "policy_logprobs") if variant != "spo_live" else ()
        examples = [type(e)(**{**vars(e), "ref_logprobs": None, "behavior_logprobs": None,
                               **{k: e.ref_logprobs for k in sampled},
                               **({"group": i // GRPO_GROUP} if variant == "grpo" else {})})
                    for i, e in enumerate(examples)]
    stream.close()
    del tokenizer_only

    baseline = torch.cuda.memory_allocated() / 2**20 if device == "cuda" else resident_mb()
    trainer = Trainer(config, lake, show_progress=False)
    state: dict = {}  # the trainer counts its training state by tensor on its first update (spo_lake.rl.memory)

    def update() -> dict:
        metrics = sft_update(trainer, examples) if variant == "sft" else trainer.update(examples)
        state.update({k.removeprefix("state/"): v for k, v in metrics.items() if k.startswith("state/")})
        return metrics

    for _ in range(args.warmup):
        update()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # restart the high-water mark at the current RSS
    seconds, cpu_seconds, tokens = [], [], 0
    for _ in range(args.steps):
        started, cpu_started = time.perf_counter(), time.process_time()
        tokens = update()["tokens"]
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
        cpu_seconds.append(time.process_time() - cpu_started)
    peak = torch.cuda.max_memory_allocated() / 2**20 - baseline if device == "cuda" else resident_mb("VmHWM") - baseline
    trainer.close()
    # The trainer loads π0 on first use: the cached variant must never have needed it, the live one must have.
    live_reference = trainer._reference is not None
    assert live_reference == (variant in ("spo_live", "ppo")), f"{variant}: live π0 loaded = {live_reference}"
    return {"variant": variant, "device": device, "threads": args.threads, "step_seconds": seconds,
            "step_cpu_seconds": cpu_seconds, "tokens_per_step": tokens,
            "peak_mb": peak, "parameters": sum(p.numel() for p in trainer.model.parameters()), **state}


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lines", type=int, default=8, help="solution lines per response (response length)")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="subprocess runs per variant, interleaved")
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = the thread policy's default")
    parser.add_argument("--device", default="auto", help="auto (cuda when available) or cpu")
    parser.add_argument("--model", help="train this model directory (its own tokenizer) instead of a random one")
    parser.add_argument("--like", help="a random-weight model of this directory's architecture, resized")
    parser.add_argument("--heads", type=int, default=0, help="--like: attention heads (default hidden / 64)")
    parser.add_argument("--intermediate", type=int, default=0, help="--like: MLP width (default 3 x hidden)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    parser.add_argument("--json", help="write the figures to this JSON file")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parse_args(parser, hidden=64, layers=1, batch=GRPO_GROUP, lines=1, steps=1, warmup=0, rounds=1)
    if args.variant:
        print(json.dumps(run_variant(Path(args.root), args.variant, args)))
        return

    root = Path(tempfile.mkdtemp(prefix="train-bench-"))
    try:
        build(root, args)
        runs: dict[str, list[dict]] = {v: [] for v in args.variants.split(",")}
        for _ in range(args.rounds):  # rounds alternate the variants, so machine load hits all of them alike
            for variant in runs:
                child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", variant,
                                        "--root", str(root)], capture_output=True, text=True)
                if child.returncode != 0:
                    sys.exit(f"{variant} failed:\n{child.stderr[-3000:]}")
                runs[variant].append(json.loads(child.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {}
    for variant, rs in runs.items():  # the fastest step and the largest peak over all rounds
        step_s = min(t for r in rs for t in r["step_seconds"])
        cpu_s = min(t for r in rs for t in r["step_cpu_seconds"])
        results[variant] = {**rs[0], "step_s": step_s, "tokens_per_s": rs[0]["tokens_per_step"] / step_s,
                            "cpu_s": cpu_s, "tokens_per_cpu_s": rs[0]["tokens_per_step"] / cpu_s,
                            "peak_mb": max(r["peak_mb"] for r in rs)}
    first = results.get("sft") or next(iter(results.values()))
    print(f"model {first['parameters'] / 1e6:.1f} M parameters on {first['device']}, batch {args.batch}, "
          f"{first['tokens_per_step']:.0f} tokens/step, {first['threads']} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'variant':<12}{'tokens/s':>10}{'s/step':>9}{'CPU s/step':>12}{'peak MB':>10}"
          f"{'params':>9}{'π0':>7}{'grads':>8}{'optim':>8}{'activ':>8}  (MiB)")
    for name, r in results.items():
        print(f"{name:<12}{r['tokens_per_s']:>10.0f}{r['step_s']:>9.3f}{r['cpu_s']:>12.3f}{r['peak_mb']:>10.0f}"
              + "".join(f"{r.get(k, float('nan')):>{w}.0f}" for k, w in (("params_mb", 9), ("reference_mb", 7),
                        ("grads_mb", 8), ("optimizer_mb", 8), ("activations_mb", 8))))
    ratios = {}
    if {"sft", "spo_cached"} <= set(results):
        ratios["spo_cached_over_sft_tokens_per_s"] = results["spo_cached"]["tokens_per_s"] / first["tokens_per_s"]
    state = ("params_mb", "reference_mb", "grads_mb", "optimizer_mb", "activations_mb")
    for peer in ("ppo", "grpo"):
        for spo in ("spo_cached", "spo_live"):
            if {peer, spo} <= set(results):
                for key in ("peak_mb", "step_s", "cpu_s"):
                    ratios[f"{peer}_over_{spo}_{key}"] = results[peer][key] / results[spo][key]
                ratios[f"{peer}_over_{spo}_state"] = (sum(results[peer][k] for k in state)
                                                      / sum(results[spo][k] for k in state))
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "load_average": os.getloadavg()[0],
                                               "results": results, "ratios": ratios}, indent=2, default=str))


if __name__ == "__main__":
    main()
