"""Training verbs: `train` (SPO or the PPO baseline) and `eval` (pass@k of a model)."""
from __future__ import annotations

import json
from contextlib import nullcontext

import typer

from spo_lake.cli.common import (
    SANDBOX_DEFAULTS,
    MemoryMb,
    Sandbox,
    Threads,
    TimeoutS,
    Workers,
    check_device,
    console,
    open_lake,
    parse_ks,
    sandbox_options,
    user_errors,
)
from spo_lake.cli.output import DOCUMENT_FORMAT, DocumentFormat, emit_json
from spo_lake.errors import InputError
from spo_lake.scores import EVAL_KS, EVAL_N, EVAL_TEMPERATURE, EVAL_TOP_P, RESPONSE_TOKENS


def quiet_transformers() -> None:
    """Our own console shows progress; transformers' weight-loading bars would interleave with it."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def flag_overrides(**flags) -> list[str]:
    """Explicit options as `key=value` overrides (strings JSON-quoted, which is valid TOML)."""
    return [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]


def show_config_help(wanted: bool) -> None:
    """`--help-config`: the config's keys, defaults and meanings, read from the code (docs/config.md has the same)."""
    if not wanted:
        return
    from spo_lake.cli.config_help import config_tables
    from spo_lake.console import print_table

    for table in config_tables():
        print_table(table)
    raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    @app.command()
    @user_errors
    def train(config: str | None = typer.Option(None, "--config", "-c", help="run config (TOML)"),
              set_: list[str] = typer.Option(None, "--set", help="override a key: key=value or "
                                             "streams.<name>.<key>=value (TOML values; repeatable)"),
              model: str | None = typer.Option(None, help="policy to train (key `model`)"),
              algorithm: str | None = typer.Option(None, help="spo or ppo"),
              steps: int | None = typer.Option(None, help="optimizer steps"),
              seed: int | None = typer.Option(None, help="seed of data order, rollouts and initialisation"),
              snapshot: str | None = typer.Option(None, help="lake snapshot to read (default: pin a new one)"),
              run_dir: str | None = typer.Option(None, help="parent directory of run directories"),
              run_name: str | None = typer.Option(None, help="run id (default: a fresh one)"),
              device: str | None = typer.Option(None, help="auto, cpu, cuda, cuda:1, ..."),
              threads: int | None = typer.Option(None, "--threads", min=1, help="torch threads (key `threads`; "
                                                    "default: the cores this process may use, halved when online "
                                                    "rollouts share them)"),
              resume: str | None = typer.Option(None, help="continue the run in this directory exactly"),
              trust_pickles: bool = typer.Option(False, help="let --resume load the pickled .pt state files of run "
                                                 "directories written before 2026-11-29 (unpickling can run code: "
                                                 "only for directories you trust; docs/security.md)"),
              quiet: bool = typer.Option(False, help="no live progress display"),
              help_config: bool = typer.Option(False, "--help-config", is_eager=True, callback=show_config_help,
                                               help="list every config key with its default and meaning, and exit")
              ) -> None:
        """Train with SPO (or PPO) from a pinned lake snapshot mixed with online rollouts, writing them back.
        Under `torchrun --nproc_per_node N` each of the N processes trains on its share of every batch."""
        from spo_lake.rl.config import load_config
        from spo_lake.rl.distributed import process_group
        from spo_lake.rl.trainer import Trainer

        quiet_transformers()
        overrides = flag_overrides(model=model, algorithm=algorithm, steps=steps, seed=seed, snapshot=snapshot,
                                   run_dir=run_dir, run_name=run_name, device=device,
                                   threads=threads) + list(set_ or [])
        if resume and config:  # before the lake opens: a usage error costs nothing
            raise InputError("--resume continues the run's recorded config; drop --config (use --set to change keys)")
        check_device(device)
        lake = open_lake()
        with process_group() as world:
            with console.status("setting up the run") if world.main else nullcontext():
                if resume:
                    trainer = Trainer.resume(resume, lake, overrides, show_progress=not quiet,
                                             trust_pickles=trust_pickles)
                else:
                    run_config = load_config(config, overrides)
                    check_device(run_config.run.device, f"{config or 'config'}: device")
                    trainer = Trainer(run_config, lake, show_progress=not quiet)
            say = console.print if world.main else (lambda *_: None)  # one process speaks for the run
            say(f"run {trainer.run_id}: snapshot {trainer.snapshot}, from step {trainer.step}, "
                f"directory {trainer.run_dir}")
            last = trainer.train()
        shown = ", ".join(f"{k}={v:.4g}" for k, v in last.items()
                          if isinstance(v, float) and not k.startswith(("seconds", "wait", "lr")))
        say(f"run {trainer.run_id} finished at step {trainer.step}: {shown}")

    @app.command("eval")
    @user_errors
    def eval_(model: str = typer.Option(..., help="model directory or hub name (a checkpoint works)"),
              where: str | None = typer.Option(None, help="SQL filter over prompts p"),
              snapshot: str | None = typer.Option(None, help="read prompts at this snapshot"),
              n: int = typer.Option(EVAL_N, "--n", help="samples per prompt"),
              temperature: float = typer.Option(EVAL_TEMPERATURE, help="sampling temperature"),
              top_p: float = typer.Option(EVAL_TOP_P, help="nucleus sampling p"),
              k: str | None = typer.Option(None, "--k", help="comma-separated k values [default: "
                                           f"{','.join(map(str, EVAL_KS))}, each at most n]"),
              max_new_tokens: int = typer.Option(RESPONSE_TOKENS, help="response length limit"),
              max_prompts: int | None = typer.Option(None, min=1, help="evaluate at most this many prompts"),
              seed: int = typer.Option(0, help="sampling seed"),
              device: str = typer.Option("auto", help="auto, cpu, cuda, ..."),
              save: bool = typer.Option(True, help="write the samples and verdicts back (source policy)"),
              workers: Workers = None,
              timeout_s: TimeoutS = SANDBOX_DEFAULTS.timeout_s,
              memory_mb: MemoryMb = SANDBOX_DEFAULTS.memory_mb,
              sandbox: Sandbox = SANDBOX_DEFAULTS.mode,
              threads: Threads = None,
              format: DocumentFormat = DOCUMENT_FORMAT) -> None:
        """pass@k of a model with the unbiased estimator (the paper's protocol by default)."""
        from spo_lake.models.backend import TransformersPolicy
        from spo_lake.models.threads import use_threads
        from spo_lake.rl.evaluation import EvalSettings, evaluate_in_lake
        from spo_lake.rl.trainer import resolve_device

        quiet_transformers()
        check_device(device)
        # the default keeps to the samples there are: `--n 4` reports pass@1 and pass@4, not an error
        ks = parse_ks(k) if k is not None else tuple(sorted({min(k, n) for k in EVAL_KS}))
        settings = EvalSettings(n, temperature, top_p, ks, max_new_tokens, seed)
        options = sandbox_options(timeout_s, memory_mb, sandbox)
        lake = open_lake()
        use_threads(threads)
        with console.status(f"loading {model}"):
            policy = TransformersPolicy.from_pretrained(model, str(resolve_device(device)))
        result, run_id = evaluate_in_lake(lake, policy, settings, where=where, snapshot=snapshot,
                                          max_prompts=max_prompts, options=options, workers=workers, save=save)
        if format == "json":
            emit_json({"model": model, "prompts": len(result.per_problem), "n": n, "run_id": run_id,
                       "pass_at_k": {str(k): v for k, v in result.pass_at_k.items()}})
        scores = ", ".join(f"pass@{k}={v:.4f}" for k, v in result.pass_at_k.items())
        console.print(f"{model}: {len(result.per_problem)} prompts × {n} samples: {scores} (run {run_id})")
