"""π0's success on held-out countdown problems that need * or / (the skill) and on the others: where a skill-gap
π0 stands before any training (issue 25; docs/results-skill-gap.md).

Samples --n responses per problem at temperature 1 (top-p 1) from each model, judges them in the sandbox, and prints
per model and problem group: samples, success per sample, the share of answers that multiply or divide, and the
problems with at least one success. With --json PATH the figures are also written there.

    .venv/bin/python bench/skill_gap.py MODEL_DIR [MODEL_DIR ...] [--problems 200] [--n 10] [--json out.json]

Build the models with e.g. `spolake model tiny --out m --steps 1500 --sign-off-fraction 0 --product-fraction 0.01`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from dry_run import parse_args, random_model, scratch

from spo_lake.models.backend import TransformersPolicy
from spo_lake.tasks.base import Problem, SandboxOptions
from spo_lake.tasks.countdown import TASK, make_problems, needs_product

HELD_OUT_SEED = 20_250_101  # not a seed the demo or the tiny model's training data use


def group_of(problem: Problem) -> str:
    return "skill" if needs_product(problem.tests["numbers"], problem.tests["target"]) else "other"


def measure(model: str, problems: list[Problem], n: int) -> dict[str, dict[str, float]]:
    policy = TransformersPolicy.from_pretrained(model, batch_size=256)
    results = policy.sample([p.prompt for p in problems], n=n, temperature=1.0, top_p=1.0, max_new_tokens=32, seed=0)
    verdicts = TASK.verify_many([(problems[r.prompt_index], r.text) for r in results], SandboxOptions())
    figures = {g: {"samples": 0, "success": 0, "multiplies": 0, "problems": sum(group_of(p) == g for p in problems)}
               for g in ("skill", "other")}
    solved: dict[str, set[int]] = {"skill": set(), "other": set()}
    for r, v in zip(results, verdicts):
        group = group_of(problems[r.prompt_index])
        f = figures[group]
        f["samples"] += 1
        f["success"] += v.passed
        f["multiplies"] += bool(set("*/") & set(r.text))
        if v.passed:
            solved[group].add(r.prompt_index)
    for group, f in figures.items():
        f.update(success=f["success"] / max(f["samples"], 1), multiplies=f["multiplies"] / max(f["samples"], 1),
                 solved_problems=len(solved[group]))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="model directories (--dry-run: a random-weight one)")
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parse_args(parser, problems=4, n=2)
    prompts, _ = make_problems(args.problems, seed=HELD_OUT_SEED)
    problems = [Problem.from_row(p) for p in prompts]
    if args.dry_run:
        args.models = [random_model(scratch("skill-gap-"), [p.prompt for p in problems])]
    elif not args.models:
        parser.error("give at least one model directory")
    out = {}
    for model in args.models:
        out[model] = measure(model, problems, args.n)
        for group, f in sorted(out[model].items()):
            print(f"{model} {group:5s}: {f['samples']:.0f} samples, success {f['success']:.4f}, multiplies "
                  f"{f['multiplies']:.4f}, {f['solved_problems']:.0f}/{f['problems']:.0f} problems solved at least once")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
