"""A small real lake for the viewer's tests, made with the CLI (prompts add, ingest, judge in the sandbox, snapshot)
and the lake's row builders (Q0 counts, a run's rows), plus pivotal tokens placed with a real tokenizer, a run
directory with the metrics.jsonl a trainer writes, and the site `spolake view` writes of it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spo_lake.cli.app import app
from spo_lake.lake import Lake
from spo_lake.lake.rows import runs_row, values_row

# A response an attacker wrote: if any of it ran, the page's title would change or window.pwned would be set.
ATTACK = ('</pre></div><script>document.title="PWNED"; window.pwned = 1;</script>'
          '<img src="x" onerror="window.pwned = 2; document.title=\'PWNED\'">'
          "<svg onload=\"window.pwned = 3\"></svg>\u2028 & ' \" <!--")
PROMPTS = [
    {"prompt_id": "cd/mul", "task": "countdown", "prompt": "Reach 56 with [7, 8] <b>bold?</b>",
     "tests": {"target": 56, "numbers": [7, 8]}},
    {"prompt_id": "cd/add", "task": "countdown", "prompt": "Reach 15 with [7, 8]",
     "tests": {"target": 15, "numbers": [7, 8]}},
    {"prompt_id": "cd/unanswered", "task": "countdown", "prompt": "Reach 1 with [7, 8]",
     "tests": {"target": 1, "numbers": [7, 8]}},
]
# (prompt, response, source, run, policy version)
ROLLOUTS = [
    ("cd/mul", "7 * 8", "policy", "run-a", 0), ("cd/mul", "7 + 8", "policy", "run-a", 1),
    ("cd/mul", "8 * 7", "grpo", "run-b", 0), ("cd/mul", "(8 - 7)", "grpo", "run-b", 1),
    ("cd/mul", ATTACK, "human", None, None), ("cd/add", "7 + 8", "policy", "run-a", 0),
]
LATER = [("cd/add", "8 + 7", "policy", "run-a", 2)]  # ingested after snapshot v1
PIVOTAL = ("cd/mul", "7 * 8")  # the response whose tokens get pivots
METRICS = ([{"step": 0, "pass@1": 0.1, "pass@10": 0.3, "eval_reward": -0.9}]
           + [{"step": s, "loss": 1.0 / s, "kl": 0.01 * s, "grad_norm": 2.0 - 0.1 * s, "reward": -0.5} for s in
              range(1, 9)] + [{"step": 8, "pass@1": 0.4, "pass@10": 0.7, "eval_reward": -0.6}])


@dataclass
class ViewLake:
    root: Path
    lake: Path
    runs: Path
    tokenizer: Path
    pivots: list[dict]  # the pivot rows written, each with `text`: the characters its token spells


def cli(lake: Path, *args: object) -> str:
    result = CliRunner().invoke(app, ["--lake", str(lake), *map(str, args)])
    assert result.exit_code == 0, result.stderr + result.stdout
    return result.stdout


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ingest(root: Path, lake: Path, name: str, rollouts: list[tuple]) -> None:
    for source in dict.fromkeys(r[2] for r in rollouts):
        rows = [{"prompt_id": p, "response": text, "run_id": run, "policy_version": version}
                for p, text, s, run, version in rollouts if s == source]
        cli(lake, "ingest", _jsonl(root / f"{name}-{source}.jsonl", rows), "--source", source)


def _pivots(lake: Lake, tokenizer_dir: Path) -> list[dict]:
    """Three pivots on PIVOTAL's tokens, at the positions PTS would count them (the response tokenised after its
    prompt, then EOS), with the characters each token spells (none for EOS)."""
    from transformers import AutoTokenizer

    from spo_lake.models.backend import tokenize_response
    from spo_lake.models.tokens import render_prompt
    from spo_lake.tasks import Problem

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    row = lake.sql("SELECT t.*, p.task, p.prompt, p.tests FROM trajectories t JOIN prompts p USING (prompt_id) "
                   "WHERE t.prompt_id = $p AND t.response_text = $r", params=dict(zip("pr", PIVOTAL))).to_pylist()[0]
    _, ids = tokenize_response(tokenizer, render_prompt(Problem.from_row(row)), row["response_text"])
    spelled = [tokenizer.decode([i], skip_special_tokens=True) for i in ids]
    star = next(i for i, s in enumerate(spelled) if "*" in s)
    last = next(i for i in range(len(ids) - 1, -1, -1) if "8" in spelled[i])
    rows = [{"trajectory_id": row["trajectory_id"], "model_id": "pi0", "position": i, "token_id": ids[i],
             "s_before": before, "s_after": after, "threshold": 0.2, "run_id": "pts-test"}
            for i, before, after in ((star, 0.2, 0.9), (last, 0.9, 0.6), (len(ids) - 1, 0.6, 1.0))]  # and EOS
    lake.append("pivots", rows)
    return [{**r, "text": spelled[r["position"]]} for r in rows]


@pytest.fixture(scope="module")
def view_lake(tmp_path_factory, scripted_model_dir) -> ViewLake:
    root = tmp_path_factory.mktemp("view")
    lake_dir = root / "lake"
    cli(lake_dir, "prompts", "add", _jsonl(root / "prompts.jsonl", PROMPTS))
    _ingest(root, lake_dir, "first", ROLLOUTS)
    cli(lake_dir, "judge")
    lake = Lake.open(lake_dir)
    lake.append("values", [values_row(prompt_id="cd/mul", trajectory_id=None, position=None, model_id="pi0", n=20,
                                      n_success=5, run_id="q0-test")])
    pivots = _pivots(lake, scripted_model_dir)
    config = {"algorithm": {"name": "spo"}, "run": {"seed": 0}, "note": "</script><script>window.pwned=4</script>"}
    lake.append("runs", [runs_row(run_id="run-a", kind="train", status=s, config=config, metrics={"steps": 8},
                                  manifest={}, snapshot="v1") for s in ("running", "finished")])
    cli(lake_dir, "snapshot", "create", "v1", "--note", "before <the> later rollout")
    _ingest(root, lake_dir, "later", LATER)
    runs = root / "runs"
    (runs / "run-a").mkdir(parents=True)
    _jsonl(runs / "run-a" / "metrics.jsonl", METRICS)
    return ViewLake(root, lake_dir, runs, scripted_model_dir, pivots)
