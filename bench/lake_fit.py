"""How much of the lake's knowledge a run absorbed, without sampling noise: the mean log-likelihood (summed over the
response tokens) of held-out solver solutions under each checkpoint, minus π0's, for the countdown problems that
need * or / (skill) and the others.

pass@1 at temperature 0.4 moves only when a correct answer becomes the policy's mode; this moves with every nat a
run gains on the lake's answers (docs/results-skill-gap.md, second round).

    .venv/bin/python bench/lake_fit.py DEMO_SEED_DIR RUN [RUN ...] [--where "p.prompt_id LIKE 'countdown/1000/%'"]

DEMO_SEED_DIR is a demo seed's directory (its lake/, models/pi0 and runs/RUN/checkpoints); each RUN's last
checkpoint is scored.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.models.tokens import render_prompt
from spo_lake.tasks import Problem
from spo_lake.tasks.countdown import needs_product


def solutions(lake: Lake, where: str, snapshot: str | None) -> list[tuple[str, str, str]]:
    """(group, rendered prompt, solution text) of every held-out human (solver) solution."""
    rows = lake.sql(f"SELECT p.*, t.response_text FROM prompts p JOIN trajectories t USING (prompt_id) "
                    f"WHERE ({where}) AND t.source = 'human' ORDER BY p.prompt_id, t.trajectory_id", snapshot).to_pylist()
    out = []
    for r in rows:
        text = r.pop("response_text")
        problem = Problem.from_row(r)
        group = "skill" if needs_product(problem.tests["numbers"], problem.tests["target"]) else "other"
        out.append((group, render_prompt(problem), text))
    return out


def mean_log_likelihood(model: str, items: list[tuple[str, str, str]]) -> dict[str, float]:
    policy = TransformersPolicy.from_pretrained(model)
    pairs = [policy.tokenize_response(prompt, text) for _, prompt, text in items]
    scores = policy.score([p for p, _ in pairs], [r for _, r in pairs], batch_size=64)
    groups: dict[str, list[float]] = {}
    for (group, _, _), token_lps in zip(items, scores):
        groups.setdefault(group, []).append(sum(token_lps))
    return {g: sum(v) / len(v) for g, v in groups.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seed_dir", type=Path)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--where", default="p.prompt_id LIKE 'countdown/1000/%'", help="held-out prompts (SQL over p)")
    parser.add_argument("--snapshot", default=None, help="default: the lake's latest version")
    args = parser.parse_args()
    torch.set_num_threads(1)
    items = solutions(Lake.open(str(args.seed_dir / "lake")), args.where, args.snapshot)
    base = mean_log_likelihood(str(args.seed_dir / "models" / "pi0"), items)
    counts = {g: sum(i[0] == g for i in items) for g in base}
    print(f"{counts} solutions; π0: " + ", ".join(f"{g} {v:.2f} nats" for g, v in sorted(base.items())))
    for run in args.runs:
        checkpoint = sorted((args.seed_dir / "runs" / run / "checkpoints").iterdir())[-1]
        fit = mean_log_likelihood(str(checkpoint), items)
        print(f"{run:<32}" + "  ".join(f"Δ {g} {fit[g] - base[g]:+7.2f}" for g in sorted(base)), flush=True)


if __name__ == "__main__":
    main()
