"""A training run's directory: manifest, metrics (JSONL, TensorBoard when installed) and checkpoints.

runs/<run_id>/
  manifest.json         resolved config, snapshot pin, seed, package versions, git revision
  metrics.jsonl         one JSON object per step (and per evaluation)
  tensorboard/          the same scalars, when the tensorboard package is installed
  checkpoints/step-0000100/
      config.json, model.safetensors, tokenizer files   loadable with from_pretrained
      trainer_state.json + .safetensors  optimizer, scheduler, RNG states, data cursors, step
      value_model.json + .safetensors    PPO only
      behaviour.json + .safetensors      policy versions that upcoming rollouts still need

Nothing in a run directory can run code when it is read: state is JSON plus safetensors (docs/security.md). Run
directories written before that hold pickled `.pt` files; they load only with `--trust-pickles`.
"""
from __future__ import annotations

import json
import os
import platform
import random
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from spo_lake.errors import InputError
from spo_lake.lake.rows import package_versions

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CHECKPOINT_PREFIX = "step-"


def git_revision() -> dict[str, Any] | None:
    """Commit and dirty flag of the checkout this package runs from (None outside a git checkout)."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if commit.returncode != 0:
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def manifest(config: dict[str, Any], run_id: str, snapshot: str, snapshot_versions: dict[str, int]) -> dict[str, Any]:
    return {
        "run_id": run_id, "config": config, "snapshot": snapshot, "snapshot_versions": snapshot_versions,
        "seed": config["seed"], "packages": package_versions(), "git": git_revision(),
        "python": platform.python_version(), "host": platform.node(),
    }


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- metrics


class MetricsLog:
    """Appends one JSON line per record; mirrors scalars to TensorBoard when it is installed."""

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            # A killed run may have logged steps after its last checkpoint; the resumed run logs them again.
            kept = [line for line, record in _metric_lines(self.path) if record["step"] <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self.file = self.path.open("a")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard: SummaryWriter | None = SummaryWriter(str(run_dir / "tensorboard"))
        except ImportError:
            self.tensorboard = None

    def log(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record, default=float) + "\n")
        self.file.flush()
        if self.tensorboard is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self.tensorboard.add_scalar(key, value, record["step"])

    def close(self) -> None:
        self.file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    return [record for _, record in _metric_lines(Path(run_dir) / "metrics.jsonl")]


def _metric_lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) of each non-empty line; a line that is not a JSON object with an integer `step` is an error
    naming the file and line."""
    out = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{path}:{number}: not JSON ({str(exc).splitlines()[0][:200]})") from None
        if not isinstance(record, dict) or type(record.get("step")) is not int:
            raise InputError(f"{path}:{number}: field `step`: expected a JSON object with an integer step")
        out.append((line, record))
    return out


# Files and folders a run writes into its directory: on resume none may be a symlink (writing or pruning through one
# would change files outside the run directory).
RUN_ENTRIES = ("manifest.json", "metrics.jsonl", "checkpoints", "evals", "tensorboard")


def check_run_dir(run_dir: Path) -> None:
    """Refuse a run directory (to resume) that is, or holds, a symlink or special file where the run writes."""
    if run_dir.is_symlink():
        raise InputError(f"--resume {run_dir}: is a symlink; name the run directory itself")
    entries = [run_dir / name for name in RUN_ENTRIES]
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir() and not checkpoints.is_symlink():
        entries += sorted(checkpoints.iterdir())
    for path in entries:
        if path.is_symlink():
            raise InputError(f"--resume {run_dir}: {path.relative_to(run_dir)} is a symlink; a run directory holds "
                             "only its own files")
        if path.exists() and not (path.is_file() or path.is_dir()):
            raise InputError(f"--resume {run_dir}: {path.relative_to(run_dir)} is not a regular file or directory")


# ---------------------------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]  # random.setstate wants the tuples that JSON stored as lists
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------- checkpoints


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a checkpoint becomes visible by an atomic rename when complete). Only real
    directories count: a symlink named like a checkpoint is neither loaded nor pruned."""
    root = run_dir / "checkpoints"
    if not root.is_dir() or root.is_symlink():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()
                  and p.name.startswith(CHECKPOINT_PREFIX) and p.name[len(CHECKPOINT_PREFIX):].isdigit())


def save_checkpoint(run_dir: Path, step: int, policy: PreTrainedModel, tokenizer, trainer_state: dict[str, Any],
                    tensors: dict[str, Any], keep: int) -> Path:
    """Write checkpoint `step` (model loadable by from_pretrained plus the trainer's state) and keep the newest
    `keep` checkpoints."""
    final = run_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{step:07d}"
    tmp = final.with_name(final.name + ".tmp")
    _remove_dir(tmp)
    tmp.mkdir(parents=True)
    policy.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    save_state(tmp, "trainer_state", trainer_state)
    for name, value in tensors.items():
        save_state(tmp, name, value)
    _remove_dir(final)
    os.replace(tmp, final)
    for old in checkpoint_dirs(run_dir)[:-keep]:
        _remove_dir(old)
    return final


def _remove_dir(path: Path) -> None:
    """Delete a checkpoint directory the run wrote; a symlink in its place is only unlinked, never followed."""
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def load_state(checkpoint: Path, name: str, trust_pickles: bool = False) -> Any:
    """The object `save_state` wrote as `name` (None when absent). A pickled `name.pt` of an older run directory is
    loaded only when `trust_pickles`: unpickling runs whatever code the file names."""
    if (checkpoint / f"{name}.json").is_file():
        return _read_state(checkpoint, name)
    pickled = checkpoint / f"{name}.pt"
    if not pickled.exists() and not pickled.is_symlink():
        return None
    if not trust_pickles:
        raise InputError(f"{pickled}: a pickled checkpoint file (could run code when loaded); resume it with "
                         "--trust-pickles only if you trust whoever wrote it (docs/security.md)")
    return torch.load(pickled, weights_only=False, map_location="cpu")


# ---------------------------------------------------------------------------------------------- state files
# A nested state (dicts, lists, tuples, numbers, strings, tensors) as `name.json` (structure and scalars, tensors
# replaced by {"$tensor": key}) plus `name.safetensors` (the tensors): neither format can run code when read.


def save_state(directory: Path, name: str, state: Any) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}

    def encode(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            key = f"t{len(tensors)}"
            # a copy: safetensors refuses tensors sharing storage (tied embeddings)
            tensors[key] = value.detach().to("cpu", copy=True).contiguous()
            return {"$tensor": key}
        if isinstance(value, tuple):
            return {"$tuple": [encode(v) for v in value]}
        if isinstance(value, list):
            return [encode(v) for v in value]
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in value):
                return {k: encode(v) for k, v in value.items()}
            return {"$items": [[encode(k), encode(v)] for k, v in value.items()]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"{name}: cannot store a {type(value).__name__} in a state file")

    structure = encode(state)
    save_file(tensors, str(directory / f"{name}.safetensors"))
    (directory / f"{name}.json").write_text(json.dumps(structure))


def _read_state(directory: Path, name: str) -> Any:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = directory / f"{name}.json"
    try:
        structure = json.loads(path.read_text())
        tensors = load_file(str(directory / f"{name}.safetensors")) if (directory / f"{name}.safetensors").exists() \
            else {}
    except (ValueError, RecursionError, SafetensorError) as exc:
        raise InputError(f"{path}: damaged state file ({str(exc).splitlines()[0][:200]})") from None

    def decode(value: Any) -> Any:
        if isinstance(value, list):
            return [decode(v) for v in value]
        if not isinstance(value, dict):
            return value
        if set(value) == {"$tensor"}:
            if value["$tensor"] not in tensors:
                raise InputError(f"{path}: names tensor {value['$tensor']!r}, missing from {name}.safetensors")
            return tensors[value["$tensor"]]
        if set(value) == {"$tuple"} and isinstance(value["$tuple"], list):
            return tuple(decode(v) for v in value["$tuple"])
        if set(value) == {"$items"} and isinstance(value["$items"], list):
            if not all(isinstance(kv, list) and len(kv) == 2 for kv in value["$items"]):
                raise InputError(f"{path}: field `$items`: expected [key, value] pairs")
            return {_hashable(decode(k), path): decode(v) for k, v in value["$items"]}
        return {k: decode(v) for k, v in value.items()}

    try:
        return decode(structure)
    except RecursionError:
        raise InputError(f"{path}: nested too deeply") from None
    except TypeError:  # a tuple key holding a list
        raise InputError(f"{path}: field `$items`: a key must be a number, string or tuple") from None


def _hashable(key: Any, path: Path) -> Any:
    if isinstance(key, (list, dict, torch.Tensor)):
        raise InputError(f"{path}: field `$items`: a key must be a number, string or tuple")
    return key
