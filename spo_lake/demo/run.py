"""`spolake demo`: the paper's experiment end to end on CPU, at toy scale.

1. the quickstart recipe builds the lake: tiny π0 and a "CoT-like" tiny model, countdown problems with solver
   solutions, reference and CoT samples, evaluate, dedup, Q0, PTS, cached reference log-probs, a snapshot;
2. four training runs from that snapshot with the same online sample budget (PPO; SPO online; SPO half-online,
   50 % lake; SPO with Monte-Carlo targets, 50/25/25), each a `spolake train` child process so its wall time and peak
   memory are its own;
3. pass@1 / pass@10 on held-out prompts (20 samples, temperature 0.4, top-p 0.95) during and after training;
4. a paper-style table, a markdown report, metrics and plots in --out.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spo_lake.lake import Lake
from spo_lake.pipelines.recipe import load_recipe, run_recipe

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.toml"


@dataclass(frozen=True)
class DemoScale:
    """Sizes of one demo mode; every number here is a knob of the recipe or the run configs."""

    train_prompts: int
    eval_prompts: int
    tiny_steps: int
    reference_samples: int
    cot_samples: int
    q0_samples: int
    pts_rollouts: int
    pts_trajectories: int  # PTS is the costliest step: search this many successful trajectories
    train_steps: int
    online_per_step: int  # online rollouts per step: the same budget for every method
    eval_every: int
    eval_max_prompts: int


QUICK = DemoScale(train_prompts=48, eval_prompts=24, tiny_steps=300, reference_samples=2, cot_samples=1,
                  q0_samples=16, pts_rollouts=4, pts_trajectories=6, train_steps=12, online_per_step=8,
                  eval_every=6, eval_max_prompts=24)
FULL = DemoScale(train_prompts=200, eval_prompts=60, tiny_steps=500, reference_samples=4, cot_samples=2,
                 q0_samples=64, pts_rollouts=8, pts_trajectories=40, train_steps=60, online_per_step=16,
                 eval_every=10, eval_max_prompts=60)

# Lake streams select from the snapshot: correct, one row per distinct program (dedup), any source but the runs'.
OFFLINE_WHERE = "passed AND NOT duplicate"


def methods(scale: DemoScale) -> dict[str, dict[str, Any]]:
    """Run configs per method. Mixed runs add lake rows on top of the same online rollouts per step."""
    b = scale.online_per_step
    online = {"name": "online", "kind": "online", "fraction": 1.0}
    half = [{**online, "fraction": 0.5}, {"name": "lake", "kind": "lake", "fraction": 0.5, "where": OFFLINE_WHERE}]
    mc = [{**online, "fraction": 0.5}, {"name": "lake", "kind": "lake", "fraction": 0.25, "where": OFFLINE_WHERE},
          {"name": "mc", "kind": "lake", "fraction": 0.25, "mc": True, "where": "passed"}]
    return {
        "PPO": {"algorithm": "ppo", "batch_size": b, "streams": [online]},
        "SPO online": {"algorithm": "spo", "batch_size": b, "streams": [online]},
        "SPO half-online": {"algorithm": "spo", "batch_size": 2 * b, "streams": half},
        "SPO + MC (50/25/25)": {"algorithm": "spo", "batch_size": 2 * b, "streams": mc},
    }


def recipe_vars(out: Path, scale: DemoScale, seed: int) -> dict[str, str]:
    every = max(1, scale.reference_samples * scale.train_prompts // max(scale.pts_trajectories, 1))
    return {
        "out": str(out), "seed": str(seed), "train_prompts": str(scale.train_prompts),
        "eval_prompts": str(scale.eval_prompts), "eval_seed": str(1000 + seed), "tiny_steps": str(scale.tiny_steps),
        "reference_samples": str(scale.reference_samples), "cot_samples": str(scale.cot_samples),
        "q0_samples": str(scale.q0_samples), "pts_rollouts": str(scale.pts_rollouts), "snapshot": f"demo-{seed}",
        # a deterministic subset of successful trajectories, so PTS cost is bounded
        "pts_where": f"t.source IN ('reference', 'human') AND hash(t.trajectory_id) % {every} = 0",
    }


def run_config(name: str, method: dict[str, Any], out: Path, scale: DemoScale, seed: int) -> dict[str, Any]:
    pi0 = str(out / "models" / "pi0")
    return {
        "model": pi0, "reference": pi0, "snapshot": f"demo-{seed}", "steps": scale.train_steps,
        "lr": 1e-4, "warmup_steps": 2, "model_update_interval": 2, "max_new_tokens": 48,
        "prompts_where": f"p.prompt_id LIKE 'countdown/{seed}/%'",
        "eval_every": scale.eval_every, "eval_where": f"p.prompt_id LIKE 'countdown/{1000 + seed}/%'",
        "eval_max_prompts": scale.eval_max_prompts, "eval_n": 20, "eval_k": [1, 10],
        "run_dir": str(out / "runs"), "run_name": f"{_slug(name)}-s{seed}", "seed": seed, "device": "cpu",
        "checkpoint_every": 0, **method,
    }


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


def _toml(config: dict[str, Any]) -> str:
    lines, tables = [], []
    for key, value in config.items():
        if key == "streams":
            for s in value:
                tables.append("[[streams]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in s.items()))
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n\n" + "\n".join(tables)


@dataclass
class MethodResult:
    method: str
    run_id: str
    pass1: float | None
    pass10: float | None
    wall_s: float
    peak_rss_mb: float
    online_samples: int
    curve: list[dict[str, float]]

    @property
    def gap(self) -> float | None:
        return None if self.pass1 is None or self.pass10 is None else self.pass10 - self.pass1


def train_method(lake_path: str, name: str, config: dict[str, Any], online_samples: int, out: Path, log) -> MethodResult:
    """One `spolake train` child; wall time and peak RSS from os.wait4 are that run's alone."""
    config_path = out / "configs" / f"{config['run_name']}.toml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(_toml(config))
    run_dir = Path(config["run_dir"]) / config["run_name"]
    cmd = [sys.executable, "-m", "spo_lake.cli.app", "--lake", lake_path, "train", "--config", str(config_path)]
    if run_dir.exists():  # a re-run continues (or just reloads) the finished/killed run
        cmd = cmd[:-2] + ["--resume", str(run_dir)]
    log(f"[bold]{name}[/bold]: {' '.join(cmd[2:])}")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: training exited with {proc.returncode}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [{"step": r["step"], "pass@1": r["pass@1"], "pass@10": r["pass@10"]} for r in records if "pass@10" in r]
    last = curve[-1] if curve else {}
    return MethodResult(name, config["run_name"], last.get("pass@1"), last.get("pass@10"),
                        time.perf_counter() - started, usage.ru_maxrss / 1024, online_samples, curve)


def run_demo(out: Path, *, quick: bool = False, seed: int = 0, log=print) -> dict[str, Any]:
    from spo_lake.demo.report import write_report

    import torch

    # The tiny model's matrices are too small for intra-op threads to pay off, and spinning threads stall badly
    # on a busy machine: one thread here and in every training child.
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    scale = QUICK if quick else FULL
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    lake_path = str(out / "lake")
    lake = Lake.open(lake_path, create=True)
    started = time.perf_counter()
    log(f"[bold]1/3 building the lake[/bold] ({'quick' if quick else 'full'} mode, seed {seed}) in {lake_path}")
    steps = run_recipe(load_recipe(RECIPE, recipe_vars(out, scale, seed)), lake, log=log)
    recipe_s = time.perf_counter() - started
    log("[bold]2/3 training[/bold]: " + ", ".join(methods(scale)))
    budget = scale.train_steps * scale.online_per_step
    results = [train_method(lake_path, name, run_config(name, m, out, scale, seed), budget, out, log)
               for name, m in methods(scale).items()]
    log("[bold]3/3 report[/bold]")
    summary = {"seed": seed, "quick": quick, "scale": asdict(scale), "recipe_steps": steps,
               "recipe_seconds": round(recipe_s, 1), "total_seconds": round(time.perf_counter() - started, 1),
               "methods": [{**asdict(r), "gap": r.gap} for r in results]}
    (out / "demo_metrics.json").write_text(json.dumps(summary, indent=2, default=str))
    write_report(out, lake, summary, f"demo-{seed}")
    return summary
