"""How much of the lake's knowledge a run absorbed, without sampling noise: the mean log-likelihood (summed over the
response tokens) of held-out solver solutions under each checkpoint, minus π0's, for the countdown problems that
need * or / (skill) and the others. The demo's report has these figures as its "Δ nats" columns
(spo_lake.demo.lake_fit); this scores any runs of a demo seed's directory, a finished demo's or not.

    .venv/bin/python bench/lake_fit.py DEMO_SEED_DIR RUN [RUN ...] [--where "p.prompt_id LIKE 'countdown/1000/%'"]

DEMO_SEED_DIR is a demo seed's directory (its lake/, models/pi0 and runs/RUN/checkpoints); each RUN's last
checkpoint is scored.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from dry_run import parse_args, random_model, scratch

from spo_lake.demo.lake_fit import log_likelihoods, solver_solutions
from spo_lake.demo.report import problem_groups
from spo_lake.lake import Lake
from spo_lake.rl.run import checkpoint_dirs


def made_up_seed_dir(root: Path, run: str) -> Path:
    """A demo seed's directory in miniature: a countdown lake with solver solutions, a random π0 and one run whose
    checkpoint is another random model."""
    from spo_lake.ingest.datasets import ingest_dataset
    from spo_lake.rl.run import CHECKPOINT_PREFIX

    lake = Lake.init(root / "lake")
    ingest_dataset(lake, "countdown", None, n=4, seed=0)
    corpus = lake.sql("SELECT prompt AS text FROM prompts UNION ALL SELECT response_text FROM trajectories")
    texts = corpus.column("text").to_pylist()
    random_model(root / "models" / "pi0", texts)
    random_model(root / "runs" / run / "checkpoints" / f"{CHECKPOINT_PREFIX}1", texts, seed=1)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seed_dir", type=Path, nargs="?", help="(--dry-run: a made-up one)")
    parser.add_argument("runs", nargs="*")
    parser.add_argument("--where", default="p.prompt_id LIKE 'countdown/1000/%'", help="held-out prompts (SQL over p)")
    parser.add_argument("--snapshot", default=None, help="default: the lake's latest version")
    args = parse_args(parser, where="true", runs=["dry"])
    if args.dry_run:
        args.seed_dir = made_up_seed_dir(scratch("lake-fit-"), args.runs[0])
    elif args.seed_dir is None or not args.runs:
        parser.error("give a demo seed's directory and at least one run")
    torch.set_num_threads(1)
    lake = Lake.open(str(args.seed_dir / "lake"))
    chosen = set(lake.sql(f"SELECT prompt_id FROM prompts p WHERE {args.where}", args.snapshot).column("prompt_id")
                 .to_pylist())
    group = {pid: g for pid, g in problem_groups(lake, args.snapshot).items() if pid in chosen}
    solutions = solver_solutions(lake, list(group), args.snapshot)

    def by_group(fit: dict[str, float]) -> dict[str, float]:
        values: dict[str, list[float]] = {}
        for pid, v in fit.items():
            values.setdefault(group[pid], []).append(v)
        return {g: sum(v) / len(v) for g, v in sorted(values.items())}

    base = by_group(log_likelihoods(str(args.seed_dir / "models" / "pi0"), solutions))
    print(f"{len(solutions)} solutions to {len(group)} prompts; π0: "
          + ", ".join(f"{g} {v:.2f} nats" for g, v in base.items()))
    for run in args.runs:
        fit = by_group(log_likelihoods(str(checkpoint_dirs(args.seed_dir / "runs" / run)[-1]), solutions))
        print(f"{run:<32}" + "  ".join(f"Δ {g} {fit[g] - base[g]:+7.2f}" for g in base), flush=True)


if __name__ == "__main__":
    main()
