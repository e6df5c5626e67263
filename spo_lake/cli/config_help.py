"""Every training config key with its default and meaning, read from the code: `spolake train --help-config` prints
it, and docs/config.md holds the same tables (`python -m spo_lake.cli.config_help docs/config.md` rewrites them;
tests/cli/test_config_help.py fails when they differ). A key's meaning is its field's comment in spo_lake/rl/config.py
(on the field's line, or the comment lines just above it), so the help lives beside the field it explains."""
from __future__ import annotations

import ast
import inspect
import io
import json
import sys
import tokenize
from dataclasses import MISSING, Field, fields
from pathlib import Path

from rich.table import Table

# Meanings of the fields spo_lake/rl/config.py has no comment for (written here once; a comment on the field there
# takes precedence, and is where each of these belongs once the config file is free to change: docs/config.md).
MEANINGS = {
    "model.path": "the policy to train: a model directory or hub name (required)",
    "algorithm.name": "spo | ppo | grpo (docs/algorithms.md)",
    "algorithm.objective": "SPO's objective: terminal | reverse_q | advantage (spo_lake.rl.losses)",
    "algorithm.loss": "SPO's loss: ce | squared (spo_lake.rl.losses)",
    "algorithm.beta": "β of the soft value (paper §5: 1/ln 100000) and PPO's KL weight",
    "data.streams": "the [[streams]] tables below: each batch's sources and their shares",
    "optim.steps": "optimizer steps of the run",
    "optim.batch_size": "sequences per optimizer step",
    "optim.grad_accum": "micro-batches per step (batch_size is split into this many)",
    "optim.lr": "AdamW learning rate of the policy",
    "optim.warmup_steps": "steps of linear learning-rate warm-up",
    "optim.weight_decay": "AdamW weight decay",
    "optim.max_grad_norm": "gradients clipped to this global norm",
    "rollout.samples_per_prompt": "rollouts per prompt (GRPO: the group size)",
    "rollout.temperature_max": "upper end of the rollout temperature range (see temperature_min)",
    "rollout.top_p": "nucleus sampling p of rollouts",
    "rollout.stop": "strings that end a rollout's response",
    "rollout.flush_rows": "written-back rollouts buffered before one lake commit",
    "rollout.sandbox_timeout_s": "wall-clock limit per sandboxed test of a rollout or evaluation sample",
    "rollout.sandbox_memory_mb": "address-space limit of the sandbox",
    "rollout.judge_workers": "parallel sandboxes judging rollouts",
    "ppo.value_lr": "learning rate of PPO's value model",
    "ppo.gamma": "PPO's discount γ",
    "ppo.lam": "λ of PPO's generalised advantage estimate",
    "ppo.clip_eps": "ε of the clipped surrogate (PPO and GRPO)",
    "ppo.value_coef": "weight of PPO's value loss",
    "eval.max_prompts": "held-out prompts evaluated at most",
    "eval.n": "samples per prompt",
    "eval.k": "the k of pass@k (each at most eval_n)",
    "eval.temperature": "evaluation sampling temperature",
    "eval.top_p": "evaluation nucleus sampling p",
    "run.dir": "parent directory of run directories",
    "run.keep_checkpoints": "newest checkpoints kept",
    "run.seed": "seed of data order, rollouts and initialisation",
    "run.gradient_checkpointing": "recompute activations in the backward pass (less memory, more time)",
    "streams.name": "the stream's name (`--set streams.<name>.<key>=value`)",
    "streams.fraction": "the stream's share of every batch (the fractions sum to 1)",
}

BEGIN = "<!-- the key tables below are generated: python -m spo_lake.cli.config_help docs/config.md -->"
END = "<!-- end of the generated key tables -->"


def field_comments(cls: type) -> dict[str, str]:
    """{field name: its comment} of a dataclass, from its source: the comment on the field's line, else the block
    of comment lines right above it."""
    source = inspect.getsource(cls)
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if node.end_lineno in comments:
            out[node.target.id] = comments[node.end_lineno]
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line in comments and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        out[node.target.id] = " ".join(above)
    return out


def _default(f: Field) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if value and isinstance(value, list) and not isinstance(value[0], (int, float, str)):
        return "one online stream (fraction 1.0)"  # data.streams: [[streams]] tables, shown on their own
    return json.dumps(value) if isinstance(value, (str, list, bool)) else f"{value:g}" if isinstance(value, float) \
        else str(value)


def config_tables() -> list[Table]:
    """One table per config section (TOML key, default, meaning), then the keys of a [[streams]] table."""
    from spo_lake.rl.config import SECTIONS, StreamConfig

    tables = []
    for section, cls in [*SECTIONS.items(), ("streams", StreamConfig)]:
        doc = " ".join((cls.__doc__ or "").split())
        title = f"[[streams]] tables: {doc}" if section == "streams" else f"{section}: {doc}"
        table = Table(title=title, title_justify="left")
        for column in ("key", "default", "meaning"):
            table.add_column(column, overflow="fold")
        comments = field_comments(cls)
        for f in fields(cls):
            key = f.metadata.get("key", f.name)
            meaning = comments.get(f.name) or MEANINGS.get(f"{section}.{f.name}", "")
            if key != f.name:
                meaning = f"(config.{section}.{f.name}) {meaning}".strip()
            table.add_row(key, _default(f), meaning)
        tables.append(table)
    return tables


def markdown() -> str:
    from spo_lake.console import markdown_table

    return "\n".join(markdown_table(t) for t in config_tables())


def rewrite(doc: Path) -> bool:
    """Put the generated tables between BEGIN and END in `doc`; whether it changed."""
    text = doc.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n\n{markdown()}\n{END}{tail}"
    doc.write_text(new)
    return new != text


if __name__ == "__main__":
    print("rewrote" if rewrite(Path(sys.argv[1])) else "up to date", sys.argv[1])
