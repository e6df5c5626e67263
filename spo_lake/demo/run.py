"""`spolake demo`: the paper's experiment end to end on CPU, at toy scale, over several seeds.

For each seed S, in DIR/seed-S (re-running continues where it stopped):
1. the quickstart recipe builds the lake: a tiny π0 with a *skill gap* (problems that need * or / were rare in its
   training, and its answers to the others use only + and -) and a "CoT-like" tiny model trained with the skill,
   countdown problems with solver solutions, reference and CoT samples, judge, dedup, Q0, PTS, cached reference
   log-probs, a snapshot. The knowledge of products is in the lake (solver, CoT model), rarely in π0;
2. seven training runs from that snapshot with the same online sample budget: the online-only arms (PPO, GRPO,
   SPO online), the lake arms (SPO half-online, 50 % lake; SPO + Monte-Carlo targets, 50/25/25) and the peers' ways
   of using the same lake rows (SFT on them then GRPO; GRPO with lake solutions injected into its groups), each a
   `spolake train` child process so its wall time and peak memory are its own;
3. every run evaluates π0 at step 0 and itself every `eval_every` steps: pass@1 / pass@10 on held-out prompts and
   on training prompts (20 samples, temperature 0.4, top-p 0.95), with per-prompt counts kept for paired tests.
Then over the seeds, separately on held-out problems that need the skill and on the others: mean ± std per method
with π0 as its own row, and every claim as a paired difference with a 95 % bootstrap interval (spo_lake.demo.stats),
in report.md, demo_metrics.json and the plots.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from spo_lake.console import console, progress_bar
from spo_lake.demo.experiment import COUNTDOWN, EXPERIMENTS, DemoScale, Experiment, prepare_models, second_source
from spo_lake.demo.experiment import problem_groups as experiment_groups
from spo_lake.errors import InputError
from spo_lake.lake import Lake
from spo_lake.pipelines.recipe import Recipe, load_recipe, run_recipe
from spo_lake.rl.run import read_metrics

RECIPE = COUNTDOWN.recipe


QUICK, FULL, FULL_SEEDS = COUNTDOWN.quick, COUNTDOWN.full, COUNTDOWN.full_seeds

# Lake streams select from the snapshot: correct, one row per distinct program (dedup), any source but the runs'.
OFFLINE_WHERE = "passed AND NOT duplicate"


def offline_where(exp: Experiment, seed: int) -> str:
    """The lake rows every lake arm reads: OFFLINE_WHERE on the training problems only. The lake also holds the
    held-out problems' reference solutions (the report scores them): SFT and injected groups must never read them."""
    return f"{OFFLINE_WHERE} AND prompt_id LIKE '{exp.train_prefix(seed)}%'"


def methods(scale: DemoScale, where: str = OFFLINE_WHERE,
            arms: tuple[str, ...] | None = None) -> dict[str, dict[str, Any]]:
    """Run configs per method (`arms`, default all). Mixed runs add lake rows on top of the same online rollouts per
    step; SFT→GRPO's SFT steps come before its online steps (as many lake rows as SPO half-online reads), so every
    arm samples train_steps × online_per_step rollouts."""
    b, s = scale.online_per_step, scale.train_steps
    online = {"name": "online", "kind": "online", "fraction": 1.0}
    lake = {"name": "lake", "kind": "lake", "fraction": 0.5, "where": where}
    half = [{**online, "fraction": 0.5}, lake]
    mc = [{**online, "fraction": 0.5}, {**lake, "fraction": 0.25},
          {"name": "mc", "kind": "lake", "fraction": 0.25, "mc": True, "where": "passed"}]
    grpo = {"algorithm": "grpo", "rollout_lag": 1}
    every = {
        "PPO": {"algorithm": "ppo", "batch_size": b, "streams": [online]},
        "GRPO": {**grpo, "batch_size": b, "streams": [online]},
        "SPO online": {"algorithm": "spo", "batch_size": b, "streams": [online]},
        "SPO half-online": {"algorithm": "spo", "batch_size": 2 * b, "streams": half},
        "SPO + MC (50/25/25)": {"algorithm": "spo", "batch_size": 2 * b, "streams": mc},
        "SFT→GRPO": {**grpo, "batch_size": b, "steps": 2 * s, "sft_steps": s, "sft_where": where,
                     "streams": [online]},
        "GRPO + lake solutions": {**grpo, "batch_size": 2 * b, "streams": [{**online, "fraction": 0.5},
                                                                        {**lake, "name": "expert", "inject": True}]},
    }
    return {name: every[name] for name in (arms or every)}


def lake_share(method: dict[str, Any]) -> str:
    """What share of a method's training rows come from the lake, read from its config: the report's answer to "how
    do the lake rows' shares compare across arms"."""
    lake = sum(s["fraction"] for s in method["streams"] if s["kind"] == "lake")
    if method.get("sft_steps"):
        return f"100 % in its {method['sft_steps']} SFT steps, then 0 % (half of all rows)"
    return f"{lake:.0%} of each batch" + (" (lake solutions injected into the groups)" if
                                          any(s.get("inject") for s in method["streams"]) else "")


def train_where(seed: int, exp: Experiment = COUNTDOWN) -> str:
    return f"p.prompt_id LIKE '{exp.train_prefix(seed)}%'"


def held_out_where(seed: int, exp: Experiment = COUNTDOWN) -> str:
    return f"p.prompt_id LIKE '{exp.held_out_prefix(seed)}%'"


def recipe_vars(out: Path, scale: DemoScale, seed: int, exp: Experiment = COUNTDOWN) -> dict[str, str]:
    if exp.name == "smollm2":
        return {"out": str(out), "seed": str(seed), "train_seed": str(seed + exp.train_offset),
                "eval_seed": str(seed + exp.held_out_offset), "train_prompts": str(scale.train_prompts),
                "eval_prompts": str(scale.eval_prompts), "q0_samples": str(scale.q0_samples),
                "max_new_tokens": str(scale.max_new_tokens), "snapshot": f"demo-{seed}"}
    every = max(1, scale.reference_samples * scale.train_prompts // max(scale.pts_trajectories, 1))
    return {
        "out": str(out), "seed": str(seed), "train_prompts": str(scale.train_prompts),
        "eval_prompts": str(scale.eval_prompts), "eval_seed": str(1000 + seed), "tiny_steps": str(scale.tiny_steps),
        "cot_steps": str(scale.cot_steps), "product_fraction": str(scale.product_fraction),
        "sign_off_fraction": str(scale.sign_off_fraction),
        "reference_samples": str(scale.reference_samples), "cot_samples": str(scale.cot_samples),
        "q0_samples": str(scale.q0_samples), "pts_rollouts": str(scale.pts_rollouts), "snapshot": f"demo-{seed}",
        # a deterministic subset of successful trajectories, so PTS cost is bounded
        "pts_where": f"t.source IN ('reference', 'human') AND hash(t.trajectory_id) % {every} = 0",
    }


def run_config(name: str, method: dict[str, Any], out: Path, scale: DemoScale, seed: int,
               exp: Experiment = COUNTDOWN, lr: float | None = None) -> dict[str, Any]:
    """One arm's run config; with `lr` (a sweep's value other than the scale's own) the run's name carries it."""
    pi0 = str(out / "models" / "pi0")
    suffix = f"-lr{lr:g}" if lr is not None and len(scale.sweep) > 1 else ""
    train = {"eval_train_where": train_where(seed, exp)} if exp.name == "countdown" else {}
    return {
        "model": pi0, "reference": pi0, "snapshot": f"demo-{seed}", "steps": scale.train_steps,
        "lr": scale.lr if lr is None else lr, "max_new_tokens": scale.max_new_tokens,
        "prompts_where": train_where(seed, exp), "eval_every": scale.eval_every,
        "eval_where": held_out_where(seed, exp), **train, "eval_max_prompts": scale.eval_max_prompts,
        "eval_n": scale.eval_n,
        "eval_k": list(scale.eval_k), "run_dir": str(out / "runs"), "run_name": f"{_slug(name)}{suffix}-s{seed}",
        "seed": seed, "checkpoint_every": 0, "samples_per_prompt": scale.samples_per_prompt, **exp.run_settings,
        **method,
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
    """One training run's outcome: the last evaluation, its curve, and its cost."""

    method: str
    run_id: str
    final: dict[str, float]  # pass@1, pass@10 on held-out prompts at the last step; train/pass@k on training prompts
    curve: list[dict[str, float]]  # every evaluation, step 0 (π0) included
    wall_s: float
    step_s: float  # mean seconds per training step (evaluations excluded)
    peak_rss_mb: float | None  # None: not measured (a run read back from its directory, `--partial`)
    state_mb: float | None  # the training state by tensor at the first step (spo_lake.rl.memory); None: not counted
    online_samples: int
    resumed: bool  # the run continued an earlier, interrupted one: its wall time covers only the continuation

    @property
    def gap(self) -> float | None:
        """pass@k − pass@1 at the last evaluation, k the larger one evaluated (10 for the tiny demo)."""
        if not self.final:
            return None
        k = max(int(key.split("@")[1]) for key in self.final if key.startswith("pass@"))
        return self.final[f"pass@{k}"] - self.final["pass@1"]


# The `spolake train` children running now. An interrupted demo (Ctrl-C, or SIGTERM, which `spolake demo` turns
# into SystemExit) stops them: a `kill` reaches only this process, and the threads waiting on them would keep it
# alive while they trained on.
_children: set[subprocess.Popen] = set()


def train_method(lake_path: str, name: str, config: dict[str, Any], online_samples: int, out: Path,
                 log: Callable[[str], None], *, quiet: bool = False,
                 stop: threading.Event | None = None) -> MethodResult:
    """One `spolake train` child; wall time and peak RSS from os.wait4 are that run's alone. `quiet` sends the
    child's output to out/logs/RUN.log (for runs side by side, whose progress bars would interleave). A child
    started once `stop` is set (the runs side by side are being stopped) is terminated at once."""
    config_path = out / "configs" / f"{config['run_name']}.toml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(_toml(config))
    run_dir = Path(config["run_dir"]) / config["run_name"]
    cmd = [sys.executable, "-m", "spo_lake.cli.app", "--lake", lake_path, "train", "--config", str(config_path)]
    resumed = run_dir.exists()
    if resumed:  # a re-run continues the killed run
        cmd = cmd[:-2] + ["--resume", str(run_dir)]
    log_path = out / "logs" / f"{config['run_name']}.log"
    log(f"[bold]{name}[/bold]: {' '.join(cmd[2:])}" + (f" (output: {log_path})" if quiet else ""))
    started = time.perf_counter()
    if quiet:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("w") as sink:
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    else:
        proc = subprocess.Popen(cmd)
    _children.add(proc)
    if stop is not None and stop.is_set():  # started as the running ones were terminated: it would be missed
        proc.terminate()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:  # interrupted while this thread waits (runs one at a time)
        proc.terminate()
        proc.wait()
        raise
    finally:
        _children.discard(proc)
    if os.waitstatus_to_exitcode(status) != 0:
        where = f"; its output: {log_path}" if quiet else ""
        raise RuntimeError(f"{name}: training exited with {os.waitstatus_to_exitcode(status)}{where}")
    return run_result(name, config, online_samples, time.perf_counter() - started, usage.ru_maxrss / 1024, resumed)


def run_result(name: str, config: dict[str, Any], online_samples: int, wall_s: float, peak_rss_mb: float | None,
               resumed: bool) -> MethodResult:
    """A run's outcome from its directory: evaluations (step 0 included), seconds per step, training state."""
    records = read_metrics(Path(config["run_dir"]) / config["run_name"])
    curve = [{k: v for k, v in r.items() if k == "step" or "pass@" in k} for r in records if "pass@1" in r]
    steps = [r["seconds"] for r in records if "seconds" in r]
    state = next((r["state/total_mb"] for r in records if "state/total_mb" in r), None)
    return MethodResult(name, config["run_name"], curve[-1] if curve else {}, curve, wall_s,
                        sum(steps) / max(len(steps), 1), peak_rss_mb, state, online_samples, resumed)


def train_methods(lake_path: str, runs: dict[str, dict[str, Any]], online_samples: int, out: Path,
                  log: Callable[[str], None], jobs: int) -> list[MethodResult]:
    """Every run as a `spolake train` child, `jobs` at a time (each child runs one torch thread, so one per core),
    with a progress bar per run read from its metrics.jsonl; results in the order of `runs`. Runs are seeded and
    single-threaded, so running them side by side changes their wall times, not their results. A run that fails
    stops the others at once, as one after another it would stop those after it (a rerun resumes them)."""
    if jobs <= 1:
        return [train_method(lake_path, name, config, online_samples, out, log) for name, config in runs.items()]
    stop = threading.Event()
    with progress_bar() as bar, ThreadPoolExecutor(jobs) as pool:
        tasks = {name: bar.add_task(name, total=config["steps"]) for name, config in runs.items()}
        futures = {name: pool.submit(train_method, lake_path, name, config, online_samples, out, log, quiet=True,
                                     stop=stop)
                   for name, config in runs.items()}
        try:
            while True:
                for future in futures.values():
                    if future.done():
                        future.result()  # a failed run's error: the others are stopped below
                finished = all(f.done() for f in futures.values())  # read before the bars: their last update is final
                for name, config in runs.items():
                    bar.update(tasks[name], completed=_steps_done(Path(config["run_dir"]) / config["run_name"]))
                if finished:
                    return [futures[name].result() for name in runs]
                time.sleep(1.0)
        except BaseException:  # a run failed, or interrupted: stop the running children (the pool's exit then
            # collects their threads)
            stop.set()  # before the running children are listed: one started after that stops itself
            for future in futures.values():
                future.cancel()
            for proc in list(_children):
                proc.terminate()
            raise


def _steps_done(run_dir: Path) -> int:
    try:
        return sum(1 for r in read_metrics(run_dir) if "seconds" in r)
    except (FileNotFoundError, ValueError):  # not started, or a line half-written at this instant
        return 0


def build_models(recipe: Recipe, out: Path, jobs: int, log: Callable[[str], None]) -> None:
    """The recipe's model builds side by side, `jobs` at a time, before it runs (its model_tiny steps then keep
    them): each build is seeded and runs one torch thread in its own process, so the models are those the recipe
    would build in turn. Each build's output goes to out/logs/model-NAME.log."""
    from spo_lake.models.tiny import is_built

    todo = [{k: v for k, v in s.items() if k != "run"} for s in recipe.steps
            if s["run"] == "model_tiny" and not is_built(s["out"])]
    if jobs <= 1 or len(todo) <= 1:
        return
    names = [Path(params["out"]).name for params in todo]
    (out / "logs").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # a multiprocessing Pool, not a ProcessPoolExecutor, because it can terminate its workers: an interrupted demo
    # (Ctrl-C, SIGTERM) does not leave builds running on
    with console.status(f"building models {', '.join(names)} side by side (output: {out / 'logs'}/model-*.log)"):
        pool = multiprocessing.get_context("spawn").Pool(min(jobs, len(todo)))
        try:
            pool.starmap(_build_model, zip(todo, [out / "logs" / f"model-{name}.log" for name in names], strict=True))
            pool.close()
        except BaseException:
            pool.terminate()
            raise
        finally:
            pool.join()
    log(f"    built {', '.join(names)} side by side in {time.perf_counter() - started:.0f} s")


def _build_model(params: dict[str, Any], log_path: Path) -> None:
    from spo_lake.models.tiny import build_tiny_model

    settings = dict(params)
    out_dir = settings.pop("out")
    with log_path.open("w") as sink, contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        build_tiny_model(out_dir, **settings)


def sweep_runs(exp: Experiment, scale: DemoScale, out: Path, seed: int,
               arms: tuple[str, ...] | None = None) -> dict[str, tuple[str, float, dict[str, Any]]]:
    """{run label: (method, lr, run config)} of a seed: every arm at every lr of the sweep."""
    chosen = methods(scale, offline_where(exp, seed), arms or exp.arms)
    runs = {}
    for name, method in chosen.items():
        for lr in scale.sweep:
            label = name if len(scale.sweep) == 1 else f"{name} @ lr {lr:g}"
            runs[label] = (name, lr, run_config(name, method, out, scale, seed, exp, lr))
    return runs


def run_seed(out: Path, scale: DemoScale, seed: int, log: Callable[[str], None], jobs: int = 1,
             exp: Experiment = COUNTDOWN, arms: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Lake + every method's run (at each lr of the sweep) for one seed in `out`; the summary of a finished seed is
    kept (first timings win). The problem groups the report splits by are fixed here, before any training."""
    summary_path = out / "summary.json"
    if summary_path.exists():
        log(f"seed {seed}: finished earlier, reusing {summary_path}")
        return json.loads(summary_path.read_text())
    out.mkdir(parents=True, exist_ok=True)
    lake_path = str(out / "lake")
    lake = Lake.open(lake_path, create=True)
    started = time.perf_counter()
    log(f"[bold]seed {seed} · 1/2 building the lake[/bold] in {lake_path}")
    prepare_models(exp, out.parent, out)
    second_source(exp, scale, seed, out / "second_source.jsonl")
    recipe = load_recipe(exp.recipe, recipe_vars(out, scale, seed, exp))
    build_models(recipe, out, jobs, log)
    steps = run_recipe(recipe, lake, log=log)
    (out / "recipe_steps.json").write_text(json.dumps(steps, indent=1, default=str))
    groups, strata = experiment_groups(exp, out, seed)
    (out / "groups.json").write_text(json.dumps({"groups": groups, "strata": strata}, indent=1))
    recipe_s = time.perf_counter() - started
    runs = sweep_runs(exp, scale, out, seed, arms)
    log(f"[bold]seed {seed} · 2/2 training[/bold]: " + ", ".join(runs))
    budget = scale.train_steps * scale.online_per_step
    results = train_methods(lake_path, {label: config for label, (_, _, config) in runs.items()}, budget, out, log,
                            jobs)
    methods_out = []
    for r, (name, lr, config) in zip(results, runs.values(), strict=True):
        methods_out.append({**asdict(r), "method": name, "lr": lr, "gap": r.gap,
                            "lake_share": lake_share(config), "online_reward": online_reward(Path(config["run_dir"])
                                                                                            / config["run_name"])})
    summary = {"seed": seed, "recipe_steps": steps, "recipe_seconds": round(recipe_s, 1),
               "total_seconds": round(time.perf_counter() - started, 1), "methods": methods_out}
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    return summary


def partial_seed(out: Path, scale: DemoScale, seed: int, exp: Experiment,
                 arms: tuple[str, ...] | None = None) -> dict[str, Any] | None:
    """A seed's summary over the runs that finished, for a demo stopped before its end (`--partial`): each run read
    back from its directory (wall time: its steps' seconds, evaluations excluded; peak RSS not measured). None when
    no run finished. `unfinished` names the others: the report says which claims they leave out."""
    from spo_lake.rl.run import checkpoint_dirs

    if (out / "summary.json").exists():
        return cast(dict[str, Any], json.loads((out / "summary.json").read_text()))
    done, missing = [], []
    for label, (name, lr, config) in sweep_runs(exp, scale, out, seed, arms).items():
        run_dir = Path(config["run_dir"]) / config["run_name"]
        if not run_dir.exists() or _steps_done(run_dir) < config["steps"] or not checkpoint_dirs(run_dir):
            missing.append(label)
            continue
        result = run_result(name, config, scale.train_steps * scale.online_per_step, 0.0, None, False)
        result.wall_s = sum(r["seconds"] for r in read_metrics(run_dir) if "seconds" in r)
        done.append({**asdict(result), "method": name, "lr": lr, "gap": result.gap, "lake_share": lake_share(config),
                     "online_reward": online_reward(run_dir)})
    if not done:
        return None
    steps = json.loads((out / "recipe_steps.json").read_text()) if (out / "recipe_steps.json").exists() else []
    return {"seed": seed, "recipe_steps": steps, "recipe_seconds": None, "total_seconds": None, "methods": done,
            "unfinished": missing}


def online_reward(run_dir: Path) -> float | None:
    """The mean reward of a run's online rollouts over its last half of online steps: the lr sweep's criterion. It
    is measured on the training problems by every arm alike, so choosing on it never looks at held-out problems."""
    values = [r["reward/online"] for r in read_metrics(run_dir) if r.get("reward/online") is not None]
    tail = values[len(values) // 2:]
    return sum(tail) / len(tail) if tail else None


def run_demo(out: Path, *, quick: bool = False, seeds: tuple[int, ...] | None = None, jobs: int | None = None,
             log: Callable[[str], None] = print, model: str = "tiny", arms: tuple[str, ...] | None = None,
             partial: bool = False) -> dict[str, Any]:
    """All seeds, then the report over them; returns the aggregated summary (also in demo_metrics.json). `jobs`
    training runs go side by side (default: one per core for the tiny model, one at a time for a real one).
    `partial`: train nothing; report over the runs that finished (partial_seed)."""
    import torch

    from spo_lake.demo.report import write_report

    exp = EXPERIMENTS[model]
    if exp.one_thread:
        # The tiny model's matrices are too small for intra-op threads to pay off, and spinning threads stall badly
        # on a busy machine: one thread here and in every training child.
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
    scale = exp.quick if quick else exp.full
    seeds = seeds or ((0,) if quick else exp.full_seeds)
    jobs = jobs or ((os.cpu_count() or 1) if exp.one_thread else 1)
    out = out.resolve()
    per_seed = []
    if partial:
        found = [partial_seed(out / f"seed-{seed}", scale, seed, exp, arms) for seed in seeds]
        per_seed = [s for s in found if s is not None]
        if not per_seed:
            raise InputError(f"--partial: no finished run under {out} for seeds {', '.join(map(str, seeds))}")
        return write_report(out, per_seed, {"quick": quick, "experiment": exp.name, "scale": asdict(scale),
                                            "partial": True})
    for i, seed in enumerate(seeds):
        log(f"[bold]seed {seed}[/bold] ({i + 1}/{len(seeds)}, {'quick' if quick else 'full'} mode, {exp.name})")
        per_seed.append(run_seed(out / f"seed-{seed}", scale, seed, log, jobs, exp, arms))
    return write_report(out, per_seed, {"quick": quick, "experiment": exp.name, "scale": asdict(scale)})
