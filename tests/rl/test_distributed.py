"""`spolake train` under `torchrun --nproc_per_node 2` on CPU (gloo), against one process with the doubled batch.

Every rank but 0 runs inside bubblewrap with the lake and the run directories mounted read-only (readonly_rank.py), so
a run that finishes proves rank 1 wrote nothing there: not a lake row, checkpoint or metric.

Tolerance: 2 ranks sum their halves of the batch and average gradients over the ranks; one process sums the whole
batch at once. That reorders float32 additions only: losses and gradient norms agree to 1e-5 relative (measured
~1e-6). After 4 AdamW steps at lr 5e-4, which move weights by up to 2e-3, Adam's normalisation turns the rounding
difference of a near-zero gradient into a visible one in a handful of weights (measured: 4 of 1M weights differ by
more than 1e-6, at most by 1.7e-5): so at most lr/10 for any weight, and more than 1e-6 for under 1 in 10,000. Ranks
that did not average their gradients would differ by ~lr in most weights.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.pipelines.q0 import q0
from spo_lake.pipelines.refprobs import refprobs
from spo_lake.rl.config import load_config
from spo_lake.rl.rollout import RolloutSchedule, behaviour_version
from spo_lake.rl.run import checkpoint_dirs, read_metrics
from spo_lake.rl.trainer import Trainer

BETA = 0.1
MAX_NEW_TOKENS = 16
RANK_LAUNCHER = str(Path(__file__).with_name("readonly_rank.py"))
LR = 5e-4
RTOL, WEIGHT_ATOL = 1e-5, LR / 10


@pytest.fixture(scope="module")
def lake(tmp_path_factory, fast_model_dir) -> Lake:
    """6 countdown problems, their solutions, Q0 counts and cached π0 log-probs, pinned as snapshot `base`."""
    policy = TransformersPolicy.from_pretrained(str(fast_model_dir))
    lake = Lake.init(tmp_path_factory.mktemp("ddp") / "lake")
    ingest_dataset(lake, "countdown", None, n=6, seed=0)
    q0(lake, policy, k=4, max_new_tokens=MAX_NEW_TOKENS, beta=BETA, show_progress=False)
    refprobs(lake, policy, where="t.source = 'human'", show_progress=False)
    lake.snapshot("base")
    return lake


def settings(model, run_dir, online: bool, **extra) -> list[str]:
    keys = dict(model=str(model), run_dir=str(run_dir), snapshot="base", steps=4, batch_size=4, lr=LR,
                warmup_steps=0, beta=BETA, max_new_tokens=MAX_NEW_TOKENS, model_update_interval=1, judge_workers=1,
                loss="squared", threads=1, max_grad_norm=1e9)
    keys.update(extra)
    lake_fraction = 0.5 if online else 1.0
    streams = ['streams.human.kind="lake"', f"streams.human.fraction={lake_fraction}",
               'streams.human.where="passed AND source = \'human\'"']
    if online:
        streams += ['streams.online.kind="online"', "streams.online.fraction=0.5"]
    return [f"{k}={json.dumps(v)}" for k, v in keys.items()] + streams


def torchrun(lake: Lake, run_dir: Path, args: list[str]) -> None:
    """`spolake train <args>` in 2 gloo processes on this machine; rank 1 sees the lake and run_dir read-only."""
    run_dir.mkdir(exist_ok=True)
    env = {**os.environ, "SPOLAKE_LAKE": lake.root, "SPOLAKE_TEST_READONLY": f"{lake.root}{os.pathsep}{run_dir}",
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    # `timeout` ends torchrun and its ranks on a hang (a rank stuck in a collective); a bound, not a speed limit:
    # two ranks that each import torch and train share the loaded cores
    command = ["timeout", "1200", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               "2", RANK_LAUNCHER, "train", "--quiet", *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


def set_args(lines: list[str]) -> list[str]:
    return [a for line in lines for a in ("--set", line)]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(checkpoint_dirs(run_dir)[-1] / "model.safetensors")


def test_two_ranks_match_one_process_with_the_doubled_batch_and_resume(lake, fast_model_dir, tmp_path):
    single = Trainer(load_config(None, settings(fast_model_dir, tmp_path / "one", False, batch_size=8,
                                                 run_name="single")), lake, show_progress=False)
    single.train()

    # 2 ranks × 4 sequences: the first 2 steps, then --resume from their checkpoint to step 4
    runs = tmp_path / "two"
    torchrun(lake, runs, set_args(settings(fast_model_dir, runs, False, steps=2, run_name="ddp")))
    assert [int(c.name.split("-")[1]) for c in checkpoint_dirs(runs / "ddp")] == [2]
    torchrun(lake, runs, ["--resume", str(runs / "ddp"), "--set", "steps=4"])

    one, two = read_metrics(single.run_dir), read_metrics(runs / "ddp")
    assert [m["step"] for m in two] == [1, 2, 3, 4]
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=RTOL), (a["step"], a["loss"], b["loss"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=RTOL), (a["step"], a["grad_norm"], b["grad_norm"])
        assert b["reward/human"] == a["reward/human"] and b["response_tokens"] == a["response_tokens"]
        assert b["tokens"] == a["tokens"]
    start, reference, ddp = (load_file(Path(fast_model_dir) / "model.safetensors"), weights(single.run_dir),
                             weights(runs / "ddp"))
    moved = torch.cat([(reference[k] - start[k]).abs().flatten() for k in reference])
    differ = torch.cat([(reference[k] - ddp[k]).abs().flatten() for k in reference])
    assert moved.max() > 3 * LR and differ.max() < WEIGHT_ATOL, (moved.max(), differ.max())
    assert (differ > 1e-6).float().mean() < 1e-4
    rows = lake.sql("SELECT status FROM runs WHERE run_id = 'ddp' ORDER BY created_at").column("status").to_pylist()
    assert rows == ["running", "finished", "running", "finished"]  # one writer: a row per status, per launch


def test_each_rank_rolls_out_its_own_share_of_the_step_prompts_and_rank_0_writes_them(lake, fast_model_dir,
                                                                                       tmp_path):
    runs = tmp_path / "online"
    lines = settings(fast_model_dir, runs, True, steps=2, run_name="ddp-online")
    torchrun(lake, runs, set_args(lines))
    # resumed at step 2, every rank samples step 2 with version 1: weights rank 0 checkpointed
    torchrun(lake, runs, ["--resume", str(runs / "ddp-online"), "--set", "steps=3"])

    rows = lake.sql("SELECT prompt_id, policy_version, metadata FROM trajectories WHERE run_id = 'ddp-online'"
                    ).to_pylist()
    config = load_config(None, lines)
    prompts = lake.sql("SELECT prompt_id FROM prompts ORDER BY prompt_id").column("prompt_id").to_pylist()
    # 2 online sequences per rank and step, one sample per prompt: the whole step's plan is 4 prompts
    r = config.rollout
    plan = RolloutSchedule(seed=config.run.seed, prompts_per_step=4, samples_per_prompt=1,
                           temperature_min=r.temperature_min, temperature_max=r.temperature_max, top_p=r.top_p,
                           max_new_tokens=MAX_NEW_TOKENS, interval=1, lag=r.lag)
    assert len(rows) == 3 * 4
    for step in range(3):
        at_step = sorted((json.loads(r["metadata"])["sample_index"], r["prompt_id"], r["policy_version"])
                         for r in rows if json.loads(r["metadata"])["step"] == step)
        chosen, _, _ = plan.plan(step, len(prompts))
        assert at_step == [(i, prompts[c], behaviour_version(step, 1, 1)) for i, c in enumerate(chosen)]
    metrics = read_metrics(runs / "ddp-online")
    assert [(m["step"], m["policy_version"]) for m in metrics] == [(1, 0), (2, 0), (3, 1)]
