"""Online step time against a peer: SPO (`Trainer`, online rollouts judged in the sandbox, live π0) with and without
overlapped rollouts, and TRL's GRPOTrainer on the same model, prompts, batch, response length and reward.

Both sides generate --batch responses per step (--batch / --samples prompts x --samples samples) of up to --tokens
tokens at temperature 1, judge every one with the same sandboxed verifier (`spo_lake.rewards.verifier_reward` for
TRL, the trainer's own judge for SPO), score them under the policy (with gradient) and a live reference model (TRL:
beta 0.04, which makes GRPO load one), and take one AdamW step.

- spo_sync: model_update_interval 1, rollout_lag 0: every step's rollouts wait for the previous update.
- spo_overlap: model_update_interval --interval, rollout_lag 1: the rollout worker generates the next steps while the
  trainer updates (see docs/demo.md, "Determinism", and docs/scaling.md for each mode).
- grpo: trl.GRPOTrainer; step time from its on_step_begin to on_step_end (generation, reward, loss, update).

Each variant runs in its own subprocess, once with 1 torch thread and once with the default threads (SPO: the thread
policy of spo_lake.models.threads, i.e. the available cores split between the rollout worker and the trainer; TRL:
torch's own default, every core), rounds interleaved; the figure is the median step time of the measured steps
(the --warmup first steps are dropped), the best over rounds. The model is randomly initialised with the tiny model's
architecture (same throughput, and neither side stops early at EOS, so both generate --tokens tokens).

    .venv/bin/python bench/peer_bench.py [--batch 16] [--samples 4] [--tokens 32] [--steps 8] [--rounds 1]

Target (issue 15): SPO online step >= 1.5x TRL's GRPO step with overlap on.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from dry_run import parse_args  # noqa: E402
from train_bench import build  # noqa: E402  (the same random-weight model and countdown lake)

VARIANTS = ("spo_sync", "spo_overlap", "grpo")


def spo_step_seconds(root: Path, args: argparse.Namespace, overlap: bool) -> tuple[list[float], list[float]]:
    """Seconds per measured step, and of those the seconds the trainer waited for its rollouts."""
    from spo_lake.lake import Lake
    from spo_lake.rl.config import load_config
    from spo_lake.rl.run import read_metrics
    from spo_lake.rl.trainer import Trainer

    settings = dict(model=str(root / "model"), snapshot="bench", run_dir=str(root / "runs"), device="cpu",
                    steps=args.warmup + args.steps, batch_size=args.batch, samples_per_prompt=args.samples,
                    max_new_tokens=args.tokens, temperature_min=1.0, temperature_max=1.0, top_p=1.0, lr=1e-5,
                    warmup_steps=0, judge_workers=args.judge_workers, threads=args.threads,
                    model_update_interval=args.interval if overlap else 1, rollout_lag=1 if overlap else 0)
    lines = [f"{k}={json.dumps(v)}" for k, v in settings.items()]
    trainer = Trainer(load_config(None, lines + ['streams.online.kind="online"', "streams.online.fraction=1.0"]),
                      Lake.open(root / "lake"), show_progress=False)
    trainer.train()
    measured = read_metrics(trainer.run_dir)[args.warmup:]
    return [m["seconds"] for m in measured], [m["wait_s"] for m in measured]


def grpo_step_seconds(root: Path, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from spo_lake import Lake, export, verifier_reward
    from spo_lake.tasks import SandboxOptions

    if args.threads:
        torch.set_num_threads(args.threads)

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.started, self.seconds = 0.0, []

        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.seconds.append(time.perf_counter() - self.started)

    data = export(Lake.open(root / "lake"), "bench", "prompt").to_dataset()
    config = trl.GRPOConfig(output_dir=str(root / "grpo"), num_generations=args.samples,
                            per_device_train_batch_size=args.batch, max_completion_length=args.tokens,
                            temperature=1.0, top_p=1.0, beta=0.04, learning_rate=1e-5,
                            max_steps=args.warmup + args.steps, use_cpu=True, report_to=[], save_strategy="no",
                            logging_steps=10_000, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    timer = StepTimer()
    trainer = trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(root / "model"),
                              reward_funcs=verifier_reward(SandboxOptions(), workers=args.judge_workers),
                              args=config, train_dataset=data,
                              processing_class=AutoTokenizer.from_pretrained(root / "model"), callbacks=[timer])
    trainer.train()
    return timer.seconds[args.warmup:], []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="responses per step")
    parser.add_argument("--samples", type=int, default=4, help="responses per prompt")
    parser.add_argument("--tokens", type=int, default=32, help="response length (max new tokens)")
    parser.add_argument("--steps", type=int, default=8, help="measured steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--interval", type=int, default=4, help="model_update_interval with overlap")
    parser.add_argument("--judge-workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parse_args(parser, batch=4, samples=2, tokens=4, steps=1, warmup=0, interval=1, judge_workers=1, rounds=1)
    if args.variant:
        root = Path(args.root)
        seconds, waits = grpo_step_seconds(root, args) if args.variant == "grpo" else \
            spo_step_seconds(root, args, overlap=args.variant == "spo_overlap")
        print(json.dumps({"seconds": seconds, "wait_s": waits}))
        return

    root = Path(tempfile.mkdtemp(prefix="peer-bench-"))
    build(root, argparse.Namespace(hidden=128, layers=4, batch=args.batch, lines=1, model=None, like=None))
    best: dict[tuple[str, int], tuple[float, float]] = {}  # (median step s, median wait s) of the best round
    loads = []
    counts = (0,) if args.dry_run else (1, 0)  # torch threads: 1, and the default (0)
    for _ in range(args.rounds):
        for threads in counts:
            for variant in VARIANTS:
                child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", variant,
                                        "--threads", str(threads), "--root", str(root)], capture_output=True, text=True)
                if child.returncode != 0:
                    sys.exit(f"{variant} failed:\n{child.stderr[-3000:]}")
                out = json.loads(child.stdout.strip().splitlines()[-1])
                this = statistics.median(out["seconds"]), statistics.median(out["wait_s"] or [float("nan")])
                best[variant, threads] = min(best.get((variant, threads), (float("inf"), 0.0)), this)
                loads.append(os.getloadavg()[0])
    print(f"{args.batch} responses/step ({args.batch // args.samples} prompts x {args.samples}), {args.tokens} tokens, "
          f"{len(os.sched_getaffinity(0))} cores, load average {min(loads):.1f}-{max(loads):.1f} during the runs")
    print("step seconds (median; SPO: of which waiting for rollouts), and GRPO's step time / SPO's")
    print(f"{'threads':<10}{'spo_sync s':>18}{'spo_overlap s':>18}{'grpo s':>9}{'sync':>8}{'overlap':>9}")
    for threads in counts:
        (sync, sync_wait), (overlap, overlap_wait), (grpo, _) = (best[v, threads] for v in VARIANTS)
        print(f"{'1' if threads else 'default':<10}{sync:>8.3f} ({sync_wait:.3f}){overlap:>9.3f} ({overlap_wait:.3f})"
              f"{grpo:>9.3f}{grpo / sync:>7.2f}x{grpo / overlap:>8.2f}x")
    ratio = best["grpo", 0][0] / best["spo_overlap", 0][0]
    print(f"SPO step speed with overlap / TRL GRPO (default threads): {ratio:.2f}x  (target >= 1.5) "
          f"{'OK' if ratio >= 1.5 else 'MISSED'}")


if __name__ == "__main__":
    main()
