"""A TRL GRPO run recorded into a lake, as its own process (for the kill, SIGTERM and concurrency tests).

usage: run_grpo.py LAKE MODEL_DIR OUT_DIR RUN_ID MAX_STEPS FLUSH_ROWS
Trains on the lake's countdown prompts; touches OUT_DIR/stepped after each step; at exit (also by SIGTERM) writes
OUT_DIR/recorded.json: the rows the recorder was given and those it committed.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from spo_lake import Lake, export, verifier_reward
from spo_lake.tasks import SandboxOptions
from spo_lake.trl_lake import record_rollouts


def grpo_trainer(lake: Lake, model_dir: str, out: str, run_id: str, max_steps: int, **config) -> trl.GRPOTrainer:
    """Tiny and fast: one prompt a step, two completions of at most 4 tokens, no saving or reporting."""
    lake.snapshot(f"prompts-{run_id}")
    data = export(lake, f"prompts-{run_id}", "prompt").to_dataset()
    args = trl.GRPOConfig(output_dir=out, run_name=run_id, max_steps=max_steps, per_device_train_batch_size=2,
                          num_generations=2, max_completion_length=4, temperature=1.0, learning_rate=1e-3,
                          use_cpu=True, report_to=[], save_strategy="no", logging_steps=1, seed=0,
                          dataloader_num_workers=0, disable_tqdm=True, **config)
    return trl.GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                           reward_funcs=verifier_reward(SandboxOptions(timeout_s=5.0)), args=args,
                           train_dataset=data, processing_class=AutoTokenizer.from_pretrained(model_dir))


class MarkSteps(TrainerCallback):
    """Touches OUT_DIR/stepped after each step, so a test knows the recorder has rows before it signals the run."""

    def __init__(self, out: str):
        self.mark = Path(out, "stepped")

    def on_step_end(self, args, state, control, **kwargs):
        self.mark.touch()


def main(lake_dir: str, model_dir: str, out: str, run_id: str, max_steps: str, flush_rows: str) -> None:
    torch.set_num_threads(1)
    lake = Lake.open(lake_dir)
    trainer = grpo_trainer(lake, model_dir, out, run_id, int(max_steps))
    recorder = record_rollouts(trainer, lake, flush_rows=int(flush_rows))
    trainer.add_callback(MarkSteps(out))
    try:
        trainer.train()
    finally:
        Path(out, "recorded.json").write_text(json.dumps({"rows": recorder.rows, "committed": recorder.committed}))


if __name__ == "__main__":
    main(*sys.argv[1:])
