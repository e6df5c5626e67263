"""Ablation of SPO's mechanisms (issue 40 §2) on the tiny demo: the SPO half-online arm with each option of
TrainConfig.mechanisms against the same arm without, on one demo lake per seed (built once, by the demo's recipe).

Prints, per arm, held-out pass@1 on the skill problems (need * or /) and on the others, each arm minus the
baseline arm with paired bootstrap intervals over seeds × problems (spo_lake.demo.stats), and the divergence
signature per seed (the largest sample log-ratio `kl` and gradient norm); writes OUT/ablation.json.

    .venv/bin/python bench/spo_mechanisms.py --out /tmp/mech [--seeds 0 1] [--full] [--arms baseline negative]
    .venv/bin/python bench/spo_mechanisms.py --out /tmp/mech --from /tmp/demo-out   # reuse demo-built seed-N lakes
    .venv/bin/python bench/spo_mechanisms.py --out /tmp/mech --dry-run   # validate every arm's config, train nothing
    # the divergence regression check: full mode, seed 1, lr 3e-4 diverged (docs/results-skill-gap.md)
    .venv/bin/python bench/spo_mechanisms.py --out /tmp/div --full --seeds 1 --lr 3e-4 --arms baseline "no cap"

Runs skip the training-prompt evaluation and write no rollouts back, so every arm of a seed reads the same lake.
A run directory that exists is reused (its evaluation is read), so an interrupted ablation continues.
"""
from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from spo_lake.demo.report import problem_groups
from spo_lake.demo.run import FULL, QUICK, RECIPE, DemoScale, methods, recipe_vars, run_config, train_method
from spo_lake.demo.stats import mean_std, paired_prompt_difference, per_prompt_pass
from spo_lake.lake import Lake
from spo_lake.models.identity import model_identity
from spo_lake.pipelines.recipe import load_recipe, run_recipe
from spo_lake.rl.config import config_from_dict
from spo_lake.rl.run import read_metrics

ARM = "SPO half-online"
# arm name → mechanism keys (TrainConfig.mechanisms) on top of the demo's SPO half-online config
ARMS: dict[str, dict[str, Any]] = {
    "baseline": {},  # the defaults (log_ratio_cap 2.0, the others off)
    "q0_lake_bound": {"q0_lake_bound": True},
    "negative 1": {"negative_weight": 1.0},
    "negative 0.1": {"negative_weight": 0.1},
    "luffy": {"luffy_lake_tokens": True},
    "no cap": {"log_ratio_cap": 0.0},
}


def seed_lake(out: Path, scale: DemoScale, seed: int, source: Path | None) -> tuple[str, str]:
    """(lake path, π0's model_id in it): copied from a demo's seed-N directory, else built by the demo's recipe."""
    root = out / f"seed-{seed}"
    if not (root / "lake").exists():
        if source is not None:  # a demo's lake keeps its π0's model_id, which names the demo's path
            for part in ("lake", "models"):
                shutil.copytree(source / f"seed-{seed}" / part, root / part)
        else:
            run_recipe(load_recipe(RECIPE, recipe_vars(root, scale, seed)), Lake.open(str(root / "lake"), create=True))
    ids = Lake.open(str(root / "lake")).sql('SELECT DISTINCT model_id FROM "values"').column("model_id").to_pylist()
    own = model_identity(str(root / "models" / "pi0"))  # a copied π0: the same fingerprint under another path
    return str(root / "lake"), own if own in ids else next(i for i in ids if i.endswith(own.rsplit("@", 1)[1]))


def arm_config(name: str, keys: dict[str, Any], out: Path, scale: DemoScale, seed: int, pi0_id: str,
               lr: float | None) -> dict[str, Any]:
    config = run_config(ARM, methods(scale)[ARM], out / f"seed-{seed}", scale, seed)
    slug = "".join(c if c.isalnum() else "-" for c in name)
    return {**config, "run_name": f"{slug}-s{seed}", "reference_id": pi0_id, "eval_train_where": "",
            "write_back": False, **({"lr": lr} if lr else {}), **keys}


def held_out(run_dir: Path, step: int) -> list:
    return json.loads((run_dir / "evals" / f"step-{step}.json").read_text())["held_out"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--full", action="store_true", help="the demo's full sizes (default: --quick's)")
    parser.add_argument("--steps", type=int, help="training steps (default: the mode's)")
    parser.add_argument("--lr", type=float, help="learning rate (default: the mode's)")
    parser.add_argument("--from", dest="source", type=Path, help="a demo output directory whose seed-N lakes to copy")
    parser.add_argument("--dry-run", action="store_true", help="validate every arm's config; build and train nothing")
    args = parser.parse_args()
    scale = FULL if args.full else QUICK
    if args.steps:
        scale = replace(scale, train_steps=args.steps, eval_every=args.steps)
    out = args.out.resolve()
    if args.dry_run:
        for seed in args.seeds:
            for name in args.arms:
                config = arm_config(name, ARMS[name], out, scale, seed, "pi0", args.lr)
                config_from_dict(config)
                print(f"dry run: seed {seed} {name}: {json.dumps({k: config[k] for k in ARMS[name]})} valid")
        return
    results: dict[str, list[dict[str, float]]] = {name: [] for name in args.arms}
    stability: dict[str, list[tuple[float, float]]] = {name: [] for name in args.arms}
    groups: list[dict[str, str]] = []
    for seed in args.seeds:
        lake_path, pi0_id = seed_lake(out, scale, seed, args.source)
        groups.append(problem_groups(Lake.open(lake_path)))
        for name in args.arms:
            config = arm_config(name, ARMS[name], out, scale, seed, pi0_id, args.lr)
            run_dir = Path(config["run_dir"]) / config["run_name"]
            if not (run_dir / "evals" / f"step-{scale.train_steps}.json").exists():
                shutil.rmtree(run_dir, ignore_errors=True)  # an unfinished run starts over
                train_method(lake_path, name, config, scale.train_steps * scale.online_per_step, out / f"seed-{seed}",
                             print, quiet=True)
            results[name].append(per_prompt_pass(held_out(run_dir, scale.train_steps), 1))
            records = [r for r in read_metrics(run_dir) if "kl" in r]  # the divergence signature (results-skill-gap)
            stability[name].append((max(r["kl"] for r in records), max(r["grad_norm"] for r in records)))
    report(results, groups, stability, args, out)


def report(results: dict[str, list[dict[str, float]]], groups: list[dict[str, str]],
           stability: dict[str, list[tuple[float, float]]], args: argparse.Namespace, out: Path) -> None:
    def part(per_seed: list[dict[str, float]], group: str) -> list[dict[str, float]]:
        return [{p: v for p, v in seed.items() if g.get(p) == group} for seed, g in zip(per_seed, groups)]

    base = results.get("baseline")
    table: dict[str, dict[str, Any]] = {}
    print(f"seeds {args.seeds}; pass@1 (eval_n 20, temperature 0.4) mean ± std over seeds; Δ vs baseline [95 %]")
    for name, per_seed in results.items():
        row: dict[str, Any] = {}
        for group in ("skill", "other"):
            values = part(per_seed, group)
            row[group] = mean_std([sum(v.values()) / max(len(v), 1) for v in values])
            if base is not None and name != "baseline":
                d = paired_prompt_difference(values, part(base, group))
                row[f"{group} Δ"] = [d.mean, d.low, d.high, list(d.per_seed)]
        row["max sample log-ratio, max grad norm per seed"] = stability[name]
        table[name] = row
        print(f"{name:>15}: " + "  ".join(
            f"{g} {row[g][0]:.3f} ± {row[g][1]:.3f}" + (f" Δ {row[f'{g} Δ'][0]:+.3f} [{row[f'{g} Δ'][1]:+.3f}, "
                                                        f"{row[f'{g} Δ'][2]:+.3f}]" if f"{g} Δ" in row else "")
            for g in ("skill", "other")) + "  max kl / grad norm " + ", ".join(
            f"{kl:.1f} / {norm:.0f}" for kl, norm in stability[name]))
    (out / "ablation.json").write_text(json.dumps({"seeds": args.seeds, "arms": table}, indent=2))


if __name__ == "__main__":
    main()
