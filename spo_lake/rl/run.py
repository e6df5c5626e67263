"""A training run's directory: manifest, metrics (JSONL, TensorBoard when installed) and checkpoints.

runs/<run_id>/
  manifest.json         resolved config, snapshot pin, seed, package versions, git revision
  metrics.jsonl         one JSON object per step (and per evaluation)
  tensorboard/          the same scalars, when the tensorboard package is installed
  checkpoints/step-0000100/
      config.json, model.safetensors, tokenizer files   loadable with from_pretrained
      trainer_state.pt  optimizer, scheduler, RNG states, data cursors, step
      value_model.pt    PPO only
      behaviour.pt      policy versions that upcoming rollouts still need
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
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= resume_step]
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
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------- checkpoints


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a checkpoint becomes visible by an atomic rename when complete)."""
    root = run_dir / "checkpoints"
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)
                  and p.name[len(CHECKPOINT_PREFIX):].isdigit())


def save_checkpoint(run_dir: Path, step: int, policy: PreTrainedModel, tokenizer, trainer_state: dict[str, Any],
                    tensors: dict[str, Any], keep: int) -> Path:
    """Write checkpoint `step` (model loadable by from_pretrained plus the trainer's state) and keep the newest
    `keep` checkpoints."""
    final = run_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{step:07d}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    policy.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save(trainer_state, tmp / "trainer_state.pt")
    for name, value in tensors.items():
        torch.save(value, tmp / f"{name}.pt")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in checkpoint_dirs(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_tensors(checkpoint: Path, name: str) -> Any:
    path = checkpoint / f"{name}.pt"
    return torch.load(path, weights_only=False) if path.exists() else None
