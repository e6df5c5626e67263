"""Trainer steps/s under `torchrun --nproc_per_node 2` vs one process, same global batch, same run.

Both sides run `spolake train` through torchrun (gloo on CPU, NCCL on a GPU) on a lake-only stream (the trainer
alone: no rollouts), with the trainer's default thread policy (one process takes every core, two processes half
each) or --threads per process.
One process trains on batches of --batch sequences, each of the 2 on --batch / 2: the same sequences per step. Step
time = the trainer's own `seconds` metric, median of the steps after --warmup, best over rounds (rounds alternate the
two sides, so a loaded machine hits both alike).

    .venv/bin/python bench/ddp_bench.py [--hidden 512] [--layers 6] [--batch 16] [--lines 8] [--steps 8] [--rounds 2] [--threads 0]

The model and lake are train_bench.py's: a randomly initialised Llama of the tiny model's architecture scaled up,
countdown problems with multi-line solutions, Q0 counts and cached π0 log-probs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from dry_run import parse_args
from train_bench import build  # bench/ is this script's directory, first on sys.path


def train(root: Path, processes: int, run: str, args: argparse.Namespace) -> float:
    """Median step seconds of one `spolake train` with `processes` ranks."""
    keys = dict(model=str(root / "model"), snapshot="bench", run_dir=str(root / "runs"), run_name=run,
                batch_size=args.batch // processes, steps=args.steps, loss="squared", lr=1e-5, warmup_steps=0,
                write_back=False, max_response_tokens=4096, threads=args.threads)
    sets = [a for k, v in keys.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    sets += ["--set", 'streams.lake.kind="lake"', "--set", "streams.lake.fraction=1.0"]
    env = {**os.environ, "SPOLAKE_LAKE": str(root / "lake"), "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(processes), "-m", "spo_lake", "train", "--quiet", *sets],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{processes} process(es) failed:\n{done.stderr[-3000:]}")
    lines = (root / "runs" / run / "metrics.jsonl").read_text().splitlines()
    return statistics.median(json.loads(line)["seconds"] for line in lines[args.warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=16, help="global batch (even)")
    parser.add_argument("--lines", type=int, default=8, help="solution lines per response (response length)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process; 0 = the thread policy's")
    args = parse_args(parser, hidden=64, layers=1, batch=2, lines=1, steps=2, warmup=0, rounds=1)

    root = Path(tempfile.mkdtemp(prefix="ddp-bench-"))
    build(root, argparse.Namespace(**vars(args), model=None, like=None))  # a random-weight model, as train_bench's default
    seconds: dict[int, list[float]] = {1: [], 2: []}
    for round_ in range(args.rounds):
        for processes in seconds:
            seconds[processes].append(train(root, processes, f"p{processes}-r{round_}", args))
    one, two = min(seconds[1]), min(seconds[2])
    print(f"global batch {args.batch}, hidden {args.hidden}, {args.layers} layers, threads {args.threads or 'policy'}, "
          f"{os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"1 process : {one:.3f} s/step ({1 / one:.2f} steps/s)  rounds {[round(s, 3) for s in seconds[1]]}")
    print(f"2 processes: {two:.3f} s/step ({1 / two:.2f} steps/s)  rounds {[round(s, 3) for s in seconds[2]]}")
    print(f"2 / 1 processes steps/s: {one / two:.2f}")


if __name__ == "__main__":
    main()
