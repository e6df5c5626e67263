"""`spolake chain`: K training runs where run k trains from a snapshot holding everything runs 1..k−1 wrote back.

The config is a run config (spo_lake.rl.config) plus an optional `[chain]` table:

    [chain]
    name = "chain"              # runs and snapshots are named <name>-run-<k>
    dir = "chains"              # <dir>/<name>/: manifest.json, configs/run-<k>.toml, runs/<name>-run-<k>/
    [[chain.between]]           # recipe steps (spo_lake.pipelines.recipe) run before run k ≥ 2 pins its snapshot
    run = "judge"               # judge anything unjudged
    [[chain.between]]
    run = "dedup"
    [[chain.between]]
    run = "refprobs"            # cached π0 log-probs for the new trajectories
    model = "models/pi0"

The chain sets four keys of every run: `snapshot` (<name>-run-<k>, pinned just before the run), `run_dir`,
`run_name` and `seed` (the config's seed + k − 1); with `from_previous_checkpoint` also `model` (run k−1's final
checkpoint; π0 stays the reference).
Q0 counts are the lake's (the `values` table), so every run reuses them; a `q0` between step tops them up.
Each run is a `spolake train` child process. manifest.json lists every run with its snapshot, its table versions
and its resolved config file, which `spolake train --config` re-trains exactly. Re-running the same command after
a crash skips finished runs, continues a started one with `--resume`, and re-runs between steps only while the
run's snapshot is not pinned yet (they are incremental, so a repeat adds only what is missing).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spo_lake.errors import InputError, UserError
from spo_lake.lake import Lake
from spo_lake.pipelines.recipe import STEPS, Recipe, run_recipe, step_keys
from spo_lake.rl.config import apply_overrides, config_from_dict, located_error
from spo_lake.rl.run import checkpoint_dirs, write_json_atomic

CHAIN_KEYS = ("name", "dir", "between")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # a chain name is one path part (and a snapshot name's start)
STATUSES = ("pending", "pinned", "finished")


class RunFailed(UserError):
    """A run's `spolake train` child failed (it said why on stderr); the chain stops there."""


@dataclass(frozen=True)
class ChainSpec:
    """A chain's settings: the base run config and what happens between runs."""

    name: str
    dir: Path
    base: dict[str, Any]  # the run config every run starts from (TrainConfig.to_dict, before the chain's keys)
    between: list[dict[str, Any]] = field(default_factory=list)
    from_previous_checkpoint: bool = False

    @property
    def root(self) -> Path:
        return self.dir / self.name

    def run_name(self, k: int) -> str:
        return f"{self.name}-run-{k}"


def load_chain(path: str | Path, overrides: list[str] | None = None, *, name: str | None = None,
               from_previous_checkpoint: bool = False) -> ChainSpec:
    """Read a run config with its `[chain]` table; errors name the file and line."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise InputError(f"config file {path}: not a regular file")
    try:
        text = path.read_text()
        raw = tomllib.loads(text)
    except FileNotFoundError:
        raise InputError(f"config file {path} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: invalid TOML: {exc}") from None
    chain = raw.pop("chain", {})
    chain_name = name or (chain.get("name", "chain") if isinstance(chain, dict) else "chain")
    if not isinstance(chain_name, str) or not NAME.fullmatch(chain_name):
        raise InputError(f"{path}: field chain.name: {str(chain_name)[:100]!r} is not a name (letters, digits, '.', "
                         "'_', '-': it becomes a directory and a snapshot name)")
    if isinstance(chain, dict) and not isinstance(chain.get("dir", "chains"), str):
        raise InputError(f"{path}: field chain.dir: expected a string")
    try:
        if not isinstance(chain, dict):
            raise InputError("config: `chain` must be a table ([chain])")
        unknown = sorted(set(chain) - set(CHAIN_KEYS))
        if unknown:
            raise InputError(f"config: unknown key(s) {unknown} in [chain]; known: {', '.join(CHAIN_KEYS)}")
        between = chain.get("between", [])
        for i, step in enumerate(between):
            _check_step(step, i)
        config = config_from_dict(apply_overrides(raw, overrides or []))
    except ValueError as exc:
        raise InputError(located_error(path, text, str(exc))) from None
    return ChainSpec(chain_name, Path(chain.get("dir", "chains")).resolve(), config.to_dict(), between,
                     from_previous_checkpoint)


def _check_step(step: Any, i: int) -> None:
    where = f"config: chain.between[{i}]"
    if not isinstance(step, dict) or step.get("run") not in STEPS:
        raise InputError(f"{where}: `run` must be one of {', '.join(STEPS)}")
    accepted, required = step_keys(step["run"])
    unknown = sorted(set(step) - accepted - {"run"})
    if unknown:
        raise InputError(f"{where} ({step['run']}): unknown key(s) {unknown}; known: {', '.join(sorted(accepted))}")
    missing = sorted(required - set(step))
    if missing:
        raise InputError(f"{where} ({step['run']}): missing key(s) {missing}")


def config_toml(config: dict[str, Any]) -> str:
    """A TrainConfig dict as TOML (every value is a string, number, bool or list of them: JSON spells those as TOML
    does); streams as [[streams]] tables."""
    lines = [f"{k} = {json.dumps(v)}" for k, v in config.items() if k != "streams"]
    for stream in config["streams"]:
        lines += ["", "[[streams]]"] + [f"{k} = {json.dumps(v)}" for k, v in stream.items()]
    return "\n".join(lines) + "\n"


def _manifest(spec: ChainSpec, lake: Lake) -> dict[str, Any]:
    """The chain's manifest, new or as an earlier invocation left it (which must describe the same chain)."""
    path = spec.root / "manifest.json"
    settings = {"chain": spec.name, "lake": lake.root, "base_config": spec.base, "between": spec.between,
                "from_previous_checkpoint": spec.from_previous_checkpoint}
    if not path.exists() and not path.is_symlink():
        return {**settings, "runs": []}
    for part in (spec.root, path, spec.root / "runs", spec.root / "configs"):
        if part.is_symlink():
            raise InputError(f"{part}: is a symlink; a chain directory holds only its own files (refused)")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not a chain manifest ({str(exc).splitlines()[0][:200]})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("runs"), list):
        raise InputError(f"{path}: field `runs`: expected a JSON object with a list of runs")
    for i, entry in enumerate(manifest["runs"]):
        _check_entry(spec, path, i, entry)
    changed = [key for key, value in settings.items() if json.loads(json.dumps(value)) != manifest.get(key)]
    if changed:
        raise InputError(f"{path}: chain {spec.name!r} was started with different {', '.join(changed)}; "
                         f"give the chain another name (--name) to start a new one")
    return manifest


def _check_entry(spec: ChainSpec, path: Path, i: int, entry: Any) -> None:
    """A manifest's run entry must be the one this chain writes: its run id and directory are the chain's own
    (`run_id = "../../x"` would make `--resume` and the clean-up of a killed run reach outside the chain)."""
    where = f"{path}: runs[{i}]"
    if not isinstance(entry, dict) or entry.get("run") != i + 1:
        raise InputError(f"{where}: field `run`: expected {i + 1}")
    if entry.get("run_id") != spec.run_name(i + 1):
        raise InputError(f"{where}: field `run_id`: expected {spec.run_name(i + 1)!r}, got {entry.get('run_id')!r}")
    if entry.get("status") not in STATUSES:
        raise InputError(f"{where}: field `status`: expected one of {', '.join(STATUSES)}")
    runs = (spec.root / "runs" / spec.run_name(i + 1)).resolve()
    for key in ("run_dir", "checkpoint", "config"):
        value = entry.get(key)
        inside = spec.root.resolve() / "configs" if key == "config" else runs
        if value is not None and (not isinstance(value, str) or not Path(value).resolve().is_relative_to(inside)):
            raise InputError(f"{where}: field `{key}`: {value!r} is not inside {inside}")


def run_chain(spec: ChainSpec, lake: Lake, runs: int, *, log: Callable[[str], None] = print,
              quiet: bool = True) -> dict[str, Any]:
    """Runs 1..`runs` of the chain (finished ones are skipped); returns the manifest."""
    if runs < 1:
        raise InputError(f"--runs must be >= 1, got {runs}")
    manifest = _manifest(spec, lake)
    path = spec.root / "manifest.json"
    for k in range(1, runs + 1):
        if k > len(manifest["runs"]):
            manifest["runs"].append({"run": k, "run_id": spec.run_name(k), "status": "pending"})
        entry = manifest["runs"][k - 1]
        if entry["status"] == "finished":
            log(f"run {k}/{runs} ({entry['run_id']}): finished earlier, skipped")
            continue
        pinned = {s.name: s for s in lake.snapshots()}
        if spec.run_name(k) not in pinned:
            if k > 1 and spec.between:
                log(f"run {k}/{runs}: between-run steps")
                entry["between"] = run_recipe(Recipe({}, spec.between, path), lake, show_progress=not quiet, log=log)
            pinned[spec.run_name(k)] = lake.snapshot(spec.run_name(k), note=f"chain {spec.name}: run {k} reads this")
        entry.update(snapshot=spec.run_name(k), snapshot_versions=pinned[spec.run_name(k)].versions,
                     config=str(_write_config(spec, manifest, k)), status="pinned")
        write_json_atomic(path, manifest)
        _train(lake, spec, entry, log, quiet)
        entry.update(status="finished", checkpoint=str(checkpoint_dirs(Path(entry["run_dir"]))[-1]))
        write_json_atomic(path, manifest)
    return manifest


def _write_config(spec: ChainSpec, manifest: dict[str, Any], k: int) -> Path:
    """configs/run-<k>.toml: the run's resolved config, written once (a resumed run reads the same file)."""
    target = spec.root / "configs" / f"run-{k}.toml"
    if target.exists():
        return target
    # seed + k − 1: a run from π0 with the previous run's seed would redraw that run's first rollouts.
    config = {**spec.base, "snapshot": spec.run_name(k), "run_dir": str(spec.root / "runs"),
              "run_name": spec.run_name(k), "seed": spec.base["seed"] + k - 1}
    if spec.from_previous_checkpoint and k > 1:
        # The lake's cached log-probs and Q0 counts are π0's: π0 stays the reference while the policy continues.
        config.update(model=manifest["runs"][k - 2]["checkpoint"],
                      reference=spec.base["reference"] or spec.base["model"])
    config_from_dict(json.loads(json.dumps(config)))  # validates the resolved config before it is written
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(config_toml(config))
    return target


def _train(lake: Lake, spec: ChainSpec, entry: dict[str, Any], log: Callable[[str], None], quiet: bool) -> None:
    """One `spolake train` child: started from the run's config, or resumed when an earlier one got that far."""
    run_dir = spec.root / "runs" / entry["run_id"]
    entry["run_dir"] = str(run_dir)
    cmd = [sys.executable, "-m", "spo_lake.cli.app", "--lake", lake.root, "train"]
    if (run_dir / "manifest.json").exists():
        cmd += ["--resume", str(run_dir)]
    elif run_dir.is_symlink():
        raise InputError(f"{run_dir}: is a symlink; a chain directory holds only its own files (refused)")
    else:  # a child killed before its manifest left nothing to keep (the manifest precedes any lake row)
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd += ["--config", entry["config"]]
    cmd += ["--quiet"] if quiet else []
    log(f"run {entry['run']} ({entry['run_id']}): {' '.join(cmd[3:])}")
    child = subprocess.Popen(cmd)
    try:
        code = child.wait()
    except BaseException:  # Ctrl-C or `kill` on the chain: the child stops as it would itself, recording its run
        child.terminate()  # interrupted (subprocess.run's SIGKILL left it `running`)
        child.wait()
        raise
    if code != 0:
        raise RunFailed(f"chain {spec.name}: run {entry['run']} ({entry['run_id']}) exited with {code}; "
                        f"re-run the same command to continue it")
