"""`spolake demo --chain`: does a lake that grows with every run beat runs that only see the initial lake?

Per seed S, from the lake the demo builds (DIR/seed-S/lake, built here with the same recipe when absent), copied at
its snapshot `demo-S` into two lakes of their own, so neither arm sees the other's rows or those of the demo's runs:
- arm A ("independent"): K SPO half-online runs, each from π0 reading only the initial snapshot;
- arm B ("chain"): `spolake chain` with K SPO half-online runs, run k reading a snapshot with everything runs
  1..k−1 wrote back (evaluated, deduped, with cached π0 log-probs), each from π0 (the lake carries the knowledge).
Both arms spend the same online budget: K runs of train_steps/K steps, and run k of both arms uses seed S + k − 1.
After every run: held-out pass@1/pass@10 of that run's final policy, and the training prompts with ≥1 known correct
solution from a model (the solver's `human` solutions, known for every prompt, do not count), against cumulative
online samples. Over seeds: B − A after K runs as paired differences with 95 % bootstrap intervals
(spo_lake.demo.stats), which prompts each source/run solved first, and distinct correct programs per prompt per
source. Output: chain_report.md, chain_metrics.json, chain.png in DIR; per seed DIR/seed-S/chain/.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from spo_lake.chain import ChainSpec, run_chain
from spo_lake.demo.run import (
    FULL,
    FULL_SEEDS,
    QUICK,
    RECIPE,
    DemoScale,
    methods,
    recipe_vars,
    run_config,
    train_method,
    train_where,
)
from spo_lake.demo.stats import mean_std, paired_prompt_difference, paired_seed_difference, per_prompt_pass
from spo_lake.lake import Lake
from spo_lake.pipelines.dedup import dedup
from spo_lake.pipelines.judge import judge
from spo_lake.pipelines.recipe import load_recipe, run_recipe
from spo_lake.pipelines.views import first_solved, prompt_solves
from spo_lake.rl.config import config_from_dict
from spo_lake.rl.run import checkpoint_dirs

RUNS = 3
METHOD = "SPO half-online"
ARMS = ("independent", "chain")
BASE = "base"


def clone_at(lake: Lake, snapshot: str, dest: Path) -> Lake:
    """A new lake holding `lake` as of `snapshot` (every table's rows at its pinned version), every trajectory
    judged and deduplicated, pinned as `base`.

    The demo's recipe dedups before Q0 and PTS sample, so its lake holds thousands of undeduplicated correct Q0
    samples; the chain's first between-steps would dedup them, and the arms would differ in that, not in what
    earlier runs found (measured: 1,484 → 162 distinct correct reference rows). Both arms start from here.
    """
    if (dest / "_spolake_done").exists():
        return Lake.open(str(dest))
    clone = Lake.init(dest) if not dest.exists() else Lake.open(str(dest))
    for table, version in lake.resolve(snapshot).items():
        rows = lake.arrow_dataset(table, version).to_table()
        if rows.num_rows:
            clone.added(table, rows)  # insert-if-absent: a clone interrupted half-way completes on re-run
    judge(clone, show_progress=False)
    dedup(clone, show_progress=False)
    if BASE not in {s.name for s in clone.snapshots()}:
        clone.snapshot(BASE, note=f"copy of {lake.root} at snapshot {snapshot}")
    (dest / "_spolake_done").write_text(snapshot)
    return clone


def seed_lake(seed_dir: Path, scale: DemoScale, seed: int, log: Callable[[str], None]) -> Lake:
    """The demo's lake of this seed: reused when `spolake demo` built it, else built with the same recipe."""
    lake = Lake.open(str(seed_dir / "lake"), create=True)
    if f"demo-{seed}" not in {s.name for s in lake.snapshots()}:
        log(f"[bold]seed {seed}: building the lake[/bold] in {seed_dir / 'lake'}")
        run_recipe(load_recipe(RECIPE, recipe_vars(seed_dir, scale, seed)), lake, log=log)
    return lake


def arm_config(seed_dir: Path, scale: DemoScale, seed: int, steps: int) -> dict[str, Any]:
    """The demo's SPO half-online config, with K runs' share of its steps, evaluated at the end of each run."""
    config = run_config(METHOD, methods(scale)[METHOD], seed_dir, scale, seed)
    return {**config, "steps": steps, "eval_every": steps, "snapshot": BASE}


def run_arms(seed_dir: Path, scale: DemoScale, seed: int, runs: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Both arms for one seed; returns their runs (in order) and lakes."""
    base_lake = seed_lake(seed_dir, scale, seed, log)
    out = seed_dir / "chain"
    steps = max(1, scale.train_steps // runs)
    config = arm_config(seed_dir, scale, seed, steps)
    lakes = {arm: clone_at(base_lake, f"demo-{seed}", out / arm / "lake") for arm in ARMS}
    budget = steps * scale.online_per_step

    log(f"[bold]seed {seed} · arm A[/bold]: {runs} independent runs of {steps} steps from snapshot {BASE}")
    independent = []
    for k in range(1, runs + 1):
        run = {**config, "run_dir": str(out / "independent" / "runs"), "run_name": f"independent-run-{k}",
               "seed": seed + k - 1}
        run_dir = out / "independent" / "runs" / run["run_name"]
        finished = [p.name for p in checkpoint_dirs(run_dir)][-1:] == [f"step-{steps:07d}"]
        if not finished:
            train_method(lakes["independent"].root, f"independent run {k}", run, budget, out / "independent", log)
        independent.append(run_dir)

    log(f"[bold]seed {seed} · arm B[/bold]: a chain of {runs} runs of {steps} steps")
    pi0 = config["reference"]
    spec = ChainSpec("chain", out, config_from_dict(config).to_dict(), between=[
        {"run": "judge"}, {"run": "dedup"},
        {"run": "refprobs", "model": pi0, "where": "t.source = 'spo'"}])
    manifest = run_chain(spec, lakes["chain"], runs, log=log)
    chain = [Path(r["run_dir"]) for r in manifest["runs"][:runs]]
    for lake in lakes.values():  # both lakes measured alike: every trajectory judged and hashed
        judge(lake, show_progress=False)
        dedup(lake, show_progress=False)
    return {"steps": steps, "budget": budget, "lakes": lakes, "runs": {"independent": independent, "chain": chain}}


def _evals(run_dir: Path, step: int) -> dict[str, list]:
    return json.loads((run_dir / "evals" / f"step-{step}.json").read_text())


def _known(lake: Lake, seed: int, runs: list[Path], group_by: str = "all") -> list[dict[str, Any]]:
    """Per training prompt: samples, correct and distinct correct programs from the initial lake's model sources
    and the given runs' rollouts (the solver's solutions excluded)."""
    where = (f"{train_where(seed).replace('p.', 't.')} AND t.source <> 'human' "
             "AND (t.source <> 'spo' OR t.run_id IN (SELECT unnest($runs::VARCHAR[])))")
    return prompt_solves(lake, None, where, group_by, params={"runs": [r.name for r in runs]}).to_pylist()


def measure_seed(seed: int, arms: dict[str, Any]) -> dict[str, Any]:
    """Curves against cumulative online samples, final per-prompt counts, first solvers and program diversity."""
    steps, budget = arms["steps"], arms["budget"]
    result: dict[str, Any] = {"seed": seed, "steps_per_run": steps, "online_per_run": budget, "arms": {}}
    for arm in ARMS:
        lake, runs = arms["lakes"][arm], arms["runs"][arm]
        pi0 = _evals(runs[0], 0)["held_out"]
        curve = [{"online_samples": 0, **_pass(pi0), "known_prompts": _solved(_known(lake, seed, []))}]
        diversity = []
        for k, run_dir in enumerate(runs, 1):
            final = _evals(run_dir, steps)["held_out"]
            curve.append({"online_samples": k * budget, **_pass(final),
                          "known_prompts": _solved(_known(lake, seed, runs[:k]))})
            by_source: dict[str, list[int]] = {}
            for r in _known(lake, seed, runs[:k], "source"):
                by_source.setdefault(r["grp"], []).append(r["distinct_correct"])
            diversity.append({"after_run": k, **{s: round(sum(v) / len(v), 4) for s, v in sorted(by_source.items())}})
        where = f"{train_where(seed).replace('p.', 't.')} AND t.source <> 'human'"
        firsts: dict[str, int] = {}
        for r in first_solved(lake, None, where).to_pylist():
            key = r["run_id"] if r["source"] == "spo" else r["source"]
            firsts[key] = firsts.get(key, 0) + 1
        result["arms"][arm] = {"curve": curve, "final_held_out": final, "first_solved_by": firsts,
                               "distinct_correct_per_prompt": diversity, "runs": [str(r) for r in runs]}
    return result


def _pass(per_problem: list) -> dict[str, float]:
    return {f"pass@{k}": round(sum(per_prompt_pass(per_problem, k).values()) / len(per_problem), 4) for k in (1, 10)}


def _solved(rows: list[dict[str, Any]]) -> int:
    return sum(r["correct"] > 0 for r in rows)


def summarise(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Chain − independent after K runs, over seeds: pass@k paired over held-out prompts, known prompts over seeds."""
    out: dict[str, Any] = {}
    for k in (1, 10):
        a = [per_prompt_pass(s["arms"]["chain"]["final_held_out"], k) for s in per_seed]
        b = [per_prompt_pass(s["arms"]["independent"]["final_held_out"], k) for s in per_seed]
        difference = paired_prompt_difference(a, b)
        out[f"pass@{k}"] = asdict(difference) | {"verdict": difference.verdict}
    known = paired_seed_difference([s["arms"]["chain"]["curve"][-1]["known_prompts"] for s in per_seed],
                                   [s["arms"]["independent"]["curve"][-1]["known_prompts"] for s in per_seed])
    out["known_prompts"] = asdict(known) | {"verdict": known.verdict}
    return out


def plot(per_seed: list[dict[str, Any]], path: Path) -> None:
    """Held-out pass@1, pass@10 and known training prompts against cumulative online samples; thin lines are
    seeds, thick ones their mean with ± std bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key in zip(axes, ("pass@1", "pass@10", "known_prompts")):
        for arm, colour in zip(ARMS, ("tab:blue", "tab:orange")):
            curves = [s["arms"][arm]["curve"] for s in per_seed]
            x = [p["online_samples"] for p in curves[0]]
            for c in curves:
                ax.plot(x, [p[key] for p in c], color=colour, alpha=0.3, linewidth=0.8)
            stats = [mean_std([c[i][key] for c in curves]) for i in range(len(x))]
            ax.errorbar(x, [m for m, _ in stats], yerr=[sd for _, sd in stats], color=colour, marker="o", capsize=3,
                        label=f"{arm} (mean ± std over {len(curves)} seeds)")
        ax.set_xlabel("cumulative online samples (0 = π0)")
        ax.set_ylabel({"known_prompts": "prompts"}.get(key, key))
        ax.set_title({"known_prompts": "training prompts with ≥1 known correct solution"}.get(key, f"held-out {key}"))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(out: Path, per_seed: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    summary = summarise(per_seed)
    metrics = {"settings": settings, "seeds": per_seed, "chain_minus_independent": summary}
    (out / "chain_metrics.json").write_text(json.dumps(metrics, indent=2))
    plot(per_seed, out / "chain.png")
    lines = ["# Chain vs independent runs (same online budget)", "",
             f"{settings['runs']} SPO half-online runs of {per_seed[0]['steps_per_run']} steps per arm, "
             f"{per_seed[0]['online_per_run']} online samples per run; seeds {[s['seed'] for s in per_seed]}.", "",
             "| seed | arm | " + " | ".join(f"after {i} runs" for i in range(settings["runs"] + 1)) + " |",
             "|---|---|" + "---|" * (settings["runs"] + 1)]
    for s in per_seed:
        for arm in ARMS:
            cells = [f"{p['pass@1']:.3f} / {p['pass@10']:.3f} / {p['known_prompts']}" for p in s["arms"][arm]["curve"]]
            lines.append(f"| {s['seed']} | {arm} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: held-out pass@1 / pass@10 / training prompts with ≥1 known correct solution (not the "
              "solver's).", "", "## Chain − independent after the last run (95 % bootstrap)", ""]
    for key, d in summary.items():
        lines.append(f"- {key}: {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}], per seed "
                     f"{', '.join(f'{x:+.4f}' for x in d['per_seed'])}: **{d['verdict']}**")
    wins = [k for k, d in summary.items() if d["verdict"] == "holds"]
    losses = [k for k, d in summary.items() if d["verdict"] == "reversed"]
    answer = ("yes" if len(wins) == len(summary) else f"on {', '.join(wins)} only" if wins
              else f"no: independent runs do better on {', '.join(losses)}" if losses else "not shown")
    lines += ["", f"Does the chain win? **{answer}** (" + ", ".join(f"{k}: {d['verdict']}" for k, d in
                                                                   summary.items()) + ")",
              "", "## First solved by (training prompts, the solver's solutions excluded)", ""]
    for s in per_seed:
        for arm in ARMS:
            lines.append(f"- seed {s['seed']}, {arm}: {s['arms'][arm]['first_solved_by']}")
    lines += ["", "## Distinct correct programs per prompt (dedup-normalised), per source, after each run", ""]
    for s in per_seed:
        for arm in ARMS:
            lines.append(f"- seed {s['seed']}, {arm}: {s['arms'][arm]['distinct_correct_per_prompt']}")
    (out / "chain_report.md").write_text("\n".join(lines) + "\n")
    return metrics


def run_chain_demo(out: Path, *, quick: bool = False, seeds: tuple[int, ...] | None = None, runs: int = RUNS,
                   scale: DemoScale | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Both arms for every seed, then chain_report.md / chain_metrics.json / chain.png in `out` (`scale` defaults
    to the demo's QUICK or FULL)."""
    import os

    import torch

    torch.set_num_threads(1)  # as in `spolake demo`: one thread here and in every training child
    os.environ["OMP_NUM_THREADS"] = "1"
    scale = scale or (QUICK if quick else FULL)
    seeds = seeds or ((0,) if quick else FULL_SEEDS)
    out = out.resolve()
    per_seed, timings = [], {}
    for seed in seeds:
        started = time.perf_counter()
        per_seed.append(measure_seed(seed, run_arms(out / f"seed-{seed}", scale, seed, runs, log)))
        timings[seed] = round(time.perf_counter() - started, 1)
    return write_report(out, per_seed, {"quick": quick, "runs": runs, "scale": asdict(scale), "seconds": timings})
