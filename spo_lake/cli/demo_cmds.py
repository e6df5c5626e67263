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
             jobs: int = typer.Option(None, "--jobs", min=1, help="training runs side by side, each on one thread "
                                      "(default: one per core); results do not depend on it")) -> None:
        """Per seed: build a lake with the quickstart recipe (π0 rarely multiplies; the lake holds solutions that do),
        train seven arms from its snapshot (PPO, GRPO, SPO online, SPO half-online, SPO + MC, SFT→GRPO, GRPO + lake
        solutions), evaluate π0 and every arm on held-out and training prompts. Then a report over the seeds:
        mean ± std, the paper's claims as paired differences with bootstrap intervals, plots. Re-running continues."""
        from spo_lake.cli.train_cmds import quiet_transformers
        from spo_lake.demo.run import run_demo

        quiet_transformers()
        chosen = _seeds(seeds) or ((seed,) if seed is not None else None)
        if chain:
            from spo_lake.demo.chain import run_chain_demo

            run_chain_demo(out, quick=quick, seeds=chosen, runs=runs, log=console.print)
            console.print(f"report: {out / 'chain_report.md'}; plot: {out / 'chain.png'}")
            return
        run_demo(out, quick=quick, seeds=chosen, jobs=jobs, log=console.print)
        console.print(f"report: {out / 'report.md'}; plots: {out / 'pass_at_k.png'}, {out / 'pts_curve.png'}")
