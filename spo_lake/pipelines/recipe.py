"""Declarative recipes: a TOML file of `[[steps]]`, each naming a pipeline verb and its keyword arguments.

Keys map 1:1 to the pipeline functions' keyword arguments (torchtune-style: the config *is* the call). Strings may
reference `[vars]` as `{name}`; `--set name=value` overrides a var. Relative paths (models, inputs, templates, `out`)
resolve against the working directory, as every other path given to spolake does, not against the recipe's folder.
Every step is incremental, so re-running a recipe after a crash continues where it stopped; the run records, per
step, its summary and the table versions it produced.

    [vars]
    lake = "demo/lake"
    [[steps]]
    run = "prompts_add"
    dataset = "countdown"
    n = 200
"""
from __future__ import annotations

import re
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spo_lake.errors import InputError
from spo_lake.lake import Lake
from spo_lake.tasks import SandboxOptions

SANDBOX_KEYS = ("timeout_s", "memory_mb", "sandbox")


@dataclass
class Context:
    """What steps share: the lake and the models loaded so far (one per model, however its path is spelt)."""

    lake: Lake
    models: dict[str, Any] = field(default_factory=dict)
    show_progress: bool = True

    def model(self, name: str):
        """A local model directory or a hub name (see spo_lake.models.identity)."""
        from spo_lake.models.backend import TransformersPolicy
        from spo_lake.models.identity import resolve_model

        target = resolve_model(name)
        if target not in self.models:
            self.models[target] = TransformersPolicy.from_pretrained(target)
        return self.models[target]


def _sandbox(params: dict[str, Any]) -> SandboxOptions:
    taken = {k: params.pop(k) for k in SANDBOX_KEYS if k in params}
    default = SandboxOptions()
    return SandboxOptions(timeout_s=taken.get("timeout_s", default.timeout_s),
                          memory_mb=taken.get("memory_mb", default.memory_mb), mode=taken.get("sandbox", default.mode))


def step_model_tiny(ctx: Context, p: dict[str, Any]) -> str:
    from spo_lake.models.tiny import build_tiny_model, is_built

    out = Path(p.pop("out"))
    if is_built(out):  # a build cut short is built again
        return f"{out} exists, kept"
    build_tiny_model(out, **p)
    return f"built {out}"


def step_prompts_add(ctx: Context, p: dict[str, Any]) -> str:
    from spo_lake.ingest import PROMPT_FIELDS, add_prompts, load_batch
    from spo_lake.ingest.datasets import ingest_dataset

    if "dataset" in p:
        path = p.pop("path", None)
        prompts, solutions = ingest_dataset(ctx.lake, p.pop("dataset"), path, **p)
        return f"prompts {prompts.summary()}; human solutions {solutions.summary()}"
    return add_prompts(ctx.lake, load_batch(p.pop("path"), PROMPT_FIELDS, "prompts", p.pop("map", None))).summary()


def step_ingest(ctx: Context, p: dict[str, Any]) -> str:
    from spo_lake.ingest import TRAJECTORY_FIELDS, ingest_trajectories, load_batch

    batch = load_batch(p.pop("path"), TRAJECTORY_FIELDS, "trajectories", p.pop("map", None))
    return ingest_trajectories(ctx.lake, batch, source=p.pop("source", "import"), task=p.pop("task", None),
                               defaults=p).summary()


def step_judge(ctx: Context, p: dict[str, Any]) -> str:
    from spo_lake.pipelines.judge import judge

    return judge(ctx.lake, options=_sandbox(p), show_progress=ctx.show_progress, **p).summary()


def step_dedup(ctx: Context, p: dict[str, Any]) -> str:
    from spo_lake.pipelines.dedup import dedup

    return dedup(ctx.lake, show_progress=ctx.show_progress, **p).summary()


def _model_step(fn_path: str, sandboxed: bool) -> Callable[[Context, dict[str, Any]], str]:
    def step(ctx: Context, p: dict[str, Any]) -> str:
        import importlib

        module, name = fn_path.split(":")
        fn = getattr(importlib.import_module(module), name)
        model = ctx.model(p.pop("model"))
        extra = {"options": _sandbox(p)} if sandboxed else {}
        if "template" in p:  # a file
            p["template"] = Path(p["template"]).read_text()
        for key in ("temperature_range", "s0_range"):
            if key in p:
                p[key] = tuple(p[key])
        return fn(ctx.lake, model, show_progress=ctx.show_progress, **extra, **p).summary()

    return step


def step_snapshot(ctx: Context, p: dict[str, Any]) -> str:
    name = p["name"]
    if any(s.name == name for s in ctx.lake.snapshots()):
        return f"snapshot {name} exists, kept"
    snap = ctx.lake.snapshot(name, note=p.get("note"))
    return f"snapshot {name}: " + ", ".join(f"{t}@{v}" for t, v in snap.versions.items())


MODEL_STEPS = {  # step -> (pipeline function, sandboxed)
    "sample": ("spo_lake.pipelines.sample:sample", True),
    "q0": ("spo_lake.pipelines.q0:q0", True),
    "pts": ("spo_lake.pipelines.pts:pts", True),
    "refprobs": ("spo_lake.pipelines.refprobs:refprobs", False),
}
STEPS: dict[str, Callable[[Context, dict[str, Any]], str]] = {
    "model_tiny": step_model_tiny,
    "prompts_add": step_prompts_add,
    "ingest": step_ingest,
    "judge": step_judge,
    "evaluate": step_judge,  # the old name of `judge`
    "dedup": step_dedup,
    **{name: _model_step(fn, sandboxed) for name, (fn, sandboxed) in MODEL_STEPS.items()},
    "snapshot": step_snapshot,
}
# Keys a step reads itself (beyond its function's keyword arguments), and the keys it cannot run without.
_OWN_KEYS = {
    "model_tiny": ({"out"}, {"out"}),
    "prompts_add": ({"path", "dataset", "map", "n", "seed", "limit"}, set()),
    "ingest": ({"path", "map", "source", "task", "model", "run_id", "tokenizer"}, {"path"}),
    "judge": (set(SANDBOX_KEYS), set()),
    "evaluate": (set(SANDBOX_KEYS), set()),
    "snapshot": ({"name", "note"}, {"name"}),
    **{name: ({"model", *(SANDBOX_KEYS if sandboxed else ())}, {"model"})
       for name, (_, sandboxed) in MODEL_STEPS.items()},
}
_FUNCTIONS = {"model_tiny": "spo_lake.models.tiny:build_tiny_model", "judge": "spo_lake.pipelines.judge:judge",
              "evaluate": "spo_lake.pipelines.judge:judge", "dedup": "spo_lake.pipelines.dedup:dedup",
              **{n: fn for n, (fn, _) in MODEL_STEPS.items()}}
_NOT_KEYS = {"lake", "model", "options", "show_progress", "out_dir", "overrides"}  # what the step itself passes


def step_keys(run: str) -> tuple[set[str], set[str]]:
    """(every key a `run` step accepts, the keys it requires)."""
    import importlib
    import inspect

    own, required = _OWN_KEYS.get(run, (set(), set()))
    accepted = set(own)
    if run in _FUNCTIONS:
        module, name = _FUNCTIONS[run].split(":")
        accepted |= set(inspect.signature(getattr(importlib.import_module(module), name)).parameters) - _NOT_KEYS
    if run == "model_tiny":  # build_tiny_model takes any TinyConfig field
        from dataclasses import fields

        from spo_lake.models.tiny import TinyConfig

        accepted |= {f.name for f in fields(TinyConfig)}
    return accepted, required


@dataclass(frozen=True)
class Recipe:
    vars: dict[str, Any]
    steps: list[dict[str, Any]]
    path: Path


def load_recipe(path: str | Path, overrides: dict[str, str] | None = None) -> Recipe:
    path = Path(path)
    text = path.read_text()
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: invalid TOML: {exc}") from None
    for key in sorted(set(raw) - {"vars", "steps"}):
        raise InputError(f"{_at(path, text, key)}: unknown key {key!r} (a recipe has [vars] and [[steps]])")
    if not isinstance(raw.get("vars", {}), dict):
        raise InputError(f"{_at(path, text, 'vars')}: 'vars' must be a table ([vars])")
    if not isinstance(raw.get("steps", []), list) or not all(isinstance(s, dict) for s in raw.get("steps", [])):
        raise InputError(f"{_at(path, text, 'steps')}: 'steps' must be tables ([[steps]])")
    variables = dict(raw.get("vars", {}))
    for key, value in (overrides or {}).items():
        if key not in variables:
            raise InputError(f"--set {key}: no such var in {path} (vars: {', '.join(variables) or 'none'})")
        old = variables[key]
        variables[key] = value.lower() in ("1", "true", "yes") if isinstance(old, bool) else type(old)(value)
    steps = raw.get("steps", [])
    for i, step in enumerate(steps):
        if step.get("run") not in STEPS:
            raise InputError(f"{_at(path, text, 'run', i)}: steps[{i}]: field 'run': {step.get('run')!r} is not one of "
                             f"{', '.join(STEPS)}")
        accepted, required = step_keys(step["run"])
        for key in sorted(set(step) - accepted - {"run"}):
            raise InputError(f"{_at(path, text, key, i)}: steps[{i}] ({step['run']}): unknown key {key!r}; known: "
                             f"{', '.join(sorted(accepted))}")
        for key in sorted(required - set(step)):
            raise InputError(f"{_at(path, text, 'run', i)}: steps[{i}] ({step['run']}): missing key {key!r}")
        if step["run"] == "prompts_add" and not {"path", "dataset"} & set(step):
            raise InputError(f"{_at(path, text, 'run', i)}: steps[{i}] (prompts_add): needs 'path' or 'dataset'")
    return Recipe(variables, [_substitute(s, variables) for s in steps], path)


def _at(path: Path, text: str, key: str, step: int | None = None) -> str:
    """`path:line N` where `key` is set (in the step-th [[steps]] table when given), or just `path`."""
    lines = text.splitlines()
    start = 0
    if step is not None:
        headers = [i for i, line in enumerate(lines) if re.match(r"\s*\[\[\s*steps\s*\]\]", line)]
        start = headers[step] if step < len(headers) else 0
    row = next((i for i in range(start, len(lines)) if re.match(rf"\s*\[*\s*{re.escape(key)}\b", lines[i])), None)
    return f"{path}:line {row + 1}" if row is not None else str(path)


def _substitute(value: Any, variables: dict[str, Any]) -> Any:
    """'{name}' alone keeps the var's type; inside a longer string it is formatted in."""
    if isinstance(value, str):
        if value.startswith("{") and value.endswith("}") and value[1:-1] in variables:
            return variables[value[1:-1]]
        return re.sub(r"\{(\w+)\}", lambda m: str(variables[m[1]]) if m[1] in variables else m[0], value)
    if isinstance(value, dict):
        return {k: _substitute(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, variables) for v in value]
    return value


def run_recipe(recipe: Recipe, lake: Lake, *, show_progress: bool = True,
               log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run every step in order; returns (and records in `runs`) what each produced."""
    from spo_lake.lake.rows import recorded_run

    ctx = Context(lake, show_progress=show_progress)
    done: list[dict[str, Any]] = []
    config = {"recipe": str(recipe.path), "vars": recipe.vars, "steps": recipe.steps}
    with recorded_run(lake, "pipeline", config) as run:
        run.metrics["steps"] = done  # filled as steps finish, so a failed run records how far it got
        for i, step in enumerate(recipe.steps):
            params = {k: v for k, v in step.items() if k != "run"}
            log(f"[{i + 1}/{len(recipe.steps)}] {step['run']}")
            started = time.perf_counter()
            summary = STEPS[step["run"]](ctx, params)
            done.append({"step": step["run"], "summary": summary, "seconds": round(time.perf_counter() - started, 2),
                         "versions": lake.versions()})
            log(f"    {summary}")
    return done
