"""How much of the lake's knowledge a run absorbed, without sampling noise: the log-likelihood (summed over the
response tokens) of the held-out problems' solver solutions under the run's last checkpoint, against π0's.

pass@1 at temperature 0.4 moves only when a correct answer becomes the policy's mode; this moves with every nat a run
gains on the lake's kind of answer, so it separates "learned nothing from the lake" from "learned, not yet enough to
change the mode" (docs/results-skill-gap.md, second round). The held-out solutions are never trained on: a gain there
is generalisation from the training prompts' lake rows.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from spo_lake.lake import Lake
from spo_lake.models import load_policy
from spo_lake.models.tokens import render_prompt
from spo_lake.rl.run import checkpoint_dirs
from spo_lake.tasks import Problem

PI0 = "π0"  # the starting model's name in the fit cache and in the demo's report


def solver_solutions(lake: Lake, prompt_ids: Sequence[str], snapshot: str | None) -> list[tuple[str, str, str]]:
    """(prompt_id, rendered prompt, solution text) of every solver (`human`) solution to the given prompts."""
    rows = lake.sql("SELECT p.*, t.response_text FROM prompts p JOIN trajectories t USING (prompt_id) "
                    "WHERE list_contains($ids, p.prompt_id) AND t.source = 'human' "
                    "ORDER BY p.prompt_id, t.trajectory_id", snapshot, {"ids": list(prompt_ids)}).to_pylist()
    out = []
    for r in rows:
        text = r.pop("response_text")
        out.append((r["prompt_id"], render_prompt(Problem.from_row(r)), text))
    return out


def log_likelihoods(model: str, solutions: Sequence[tuple[str, str, str]]) -> dict[str, float]:
    """{prompt_id: mean over its solutions of log p(solution | prompt)} under `model` (summed over tokens, EOS in)."""
    policy = load_policy(model, backend="transformers", device="cpu")  # exact float32 scores, as the runs train
    pairs = [policy.tokenize_response(prompt, text) for _, prompt, text in solutions]
    scores = policy.score([p for p, _ in pairs], [r for _, r in pairs], batch_size=64)
    per_prompt: dict[str, list[float]] = defaultdict(list)
    for (prompt_id, _, _), token_lps in zip(solutions, scores, strict=True):
        per_prompt[prompt_id].append(sum(token_lps))
    return {pid: sum(v) / len(v) for pid, v in per_prompt.items()}


def seed_fit(seed_dir: Path, prompt_ids: Sequence[str], snapshot: str,
             run_ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """{π0 or run_id: {prompt_id: log-likelihood}} of the solver solutions to `prompt_ids` under a demo seed's π0 and
    each run's last checkpoint, cached in seed_dir/lake_fit.json (a run missing from the cache is scored and added)."""
    cache = seed_dir / "lake_fit.json"
    fit: dict[str, dict[str, float]] = json.loads(cache.read_text()) if cache.exists() else {}
    todo = [name for name in (PI0, *run_ids) if name not in fit]
    if not todo:
        return fit
    solutions = solver_solutions(Lake.open(str(seed_dir / "lake")), prompt_ids, snapshot)
    for name in todo:
        if name == PI0:
            model = seed_dir / "models" / "pi0"
        else:
            checkpoints = checkpoint_dirs(seed_dir / "runs" / name)
            if not checkpoints:
                raise FileNotFoundError(f"{seed_dir / 'runs' / name}: no checkpoint to score")
            model = checkpoints[-1]
        fit[name] = log_likelihoods(str(model), solutions)
    cache.write_text(json.dumps(fit, indent=1, sort_keys=True))
    return fit
