"""Each default is declared once: evaluation's (spo_lake.scores: the paper's n, temperature, top-p, k and the response
length) and the sandbox's (SandboxOptions); `spolake eval`, EvalSettings and the training config read them there."""
from __future__ import annotations

import typer

from spo_lake import scores
from spo_lake.cli.train_cmds import register
from spo_lake.rl.config import TrainConfig
from spo_lake.rl.evaluation import EvalSettings
from spo_lake.tasks import SandboxOptions


def eval_option_defaults() -> dict[str, object]:
    app = typer.Typer()
    register(app)
    command = typer.main.get_command(app).commands["eval"]  # type: ignore[attr-defined]
    return {p.name: p.default for p in command.params}


def test_eval_defaults_are_the_declared_ones_everywhere():
    declared = (scores.EVAL_N, scores.EVAL_TEMPERATURE, scores.EVAL_TOP_P, scores.EVAL_KS, scores.RESPONSE_TOKENS)
    assert declared == (20, 0.4, 0.95, (1, 10), 512)  # the paper's protocol (§5)
    settings = EvalSettings()
    assert (settings.n, settings.temperature, settings.top_p, settings.ks, settings.max_new_tokens) == declared
    config = TrainConfig()
    assert (config.eval.n, config.eval.temperature, config.eval.top_p, tuple(config.eval.k),
            config.rollout.max_new_tokens) == declared
    cli = eval_option_defaults()
    assert (cli["n"], cli["temperature"], cli["top_p"], cli["max_new_tokens"]) == declared[:3] + declared[4:]


def test_sandbox_defaults_are_sandbox_options_everywhere():
    sandbox = SandboxOptions()
    rollout = TrainConfig().rollout
    assert (rollout.sandbox_timeout_s, rollout.sandbox_memory_mb, rollout.sandbox_mode) == (
        sandbox.timeout_s, sandbox.memory_mb, sandbox.mode)
    cli = eval_option_defaults()
    assert (cli["timeout_s"], cli["memory_mb"], cli["sandbox"]) == (sandbox.timeout_s, sandbox.memory_mb, sandbox.mode)
