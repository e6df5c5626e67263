"""A run directory to resume, and the checkpoints in it, cannot run code or reach outside: trainer state is JSON
plus safetensors, a pickled `.pt` loads only with --trust-pickles, and symlinks where the run writes are refused."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from spo_lake.errors import InputError
from spo_lake.lake import Lake
from spo_lake.rl import run as rundir
from spo_lake.rl.trainer import Trainer
from tests.security.conftest import one_line, one_line_error


class Payload:
    """What a hostile pickle does when loaded: create the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def pickled_checkpoint(directory: Path, marker: Path, name: str = "trainer_state") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    torch.save({"step": Payload(marker)}, directory / f"{name}.pt")
    return directory / f"{name}.pt"


def test_a_pickled_state_file_is_refused_unless_pickles_are_trusted(world):
    checkpoint = world.tmp / "run" / "checkpoints" / "step-0000001"
    pickled_checkpoint(checkpoint, world.marker)
    with pytest.raises(InputError) as refused:
        rundir.load_state(checkpoint, "trainer_state")
    assert "--trust-pickles" in one_line(str(refused.value))
    assert not world.marker.exists()
    rundir.load_state(checkpoint, "trainer_state", trust_pickles=True)  # the flag is what opens it
    assert world.marker.exists()


def test_trainer_state_round_trips_through_json_and_safetensors_only(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    random.seed(7)
    state = {"step": 3, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": rundir.rng_state(), "data": {"0": {"epoch": 1, "after": ["a", 2], "skipped": 0}}}
    rundir.save_state(tmp_path, "trainer_state", state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trainer_state.json", "trainer_state.safetensors"]
    back = rundir.load_state(tmp_path, "trainer_state")
    again = torch.optim.AdamW(model.parameters())
    again.load_state_dict(back["optimizer"])
    for key in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(again.state_dict()["state"][0][key], optimizer.state_dict()["state"][0][key])
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert back["scheduler"] == scheduler.state_dict() and back["data"] == state["data"]
    expected = random.random()
    rundir.set_rng_state(back["rng"])
    assert random.random() == expected
    behaviour = {3: model.state_dict()}
    rundir.save_state(tmp_path, "behaviour", behaviour)
    assert torch.equal(rundir.load_state(tmp_path, "behaviour")[3]["weight"], model.weight)


@pytest.mark.parametrize("damage", ['{"step": {"$tensor": "t9"}}', '{"$items": [[[1], 2]]}', "[" * 100000, "{"])
def test_a_damaged_state_file_is_one_line(tmp_path, damage):
    rundir.save_state(tmp_path, "trainer_state", {"step": 1})
    (tmp_path / "trainer_state.json").write_text(damage)
    with pytest.raises(InputError) as refused:
        rundir.load_state(tmp_path, "trainer_state")
    assert "trainer_state.json" in one_line(str(refused.value))


def run_dir(world) -> Path:
    directory = world.tmp / "runs" / "r1"
    (directory / "checkpoints").mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps({"config": {}}))
    (directory / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    return directory


@pytest.mark.parametrize("entry", ["metrics.jsonl", "checkpoints", "evals", "checkpoints/step-0000002"])
def test_a_run_directory_with_a_symlink_where_the_run_writes_is_not_resumed(filled, world, entry):
    directory = run_dir(world)
    target = world.outside / "victim" / "keep.txt"
    if (directory / entry).exists():
        (directory / entry).rename(world.outside / "moved")
        target = world.outside / "moved"
    os.symlink(target, directory / entry)
    before = world.snapshot()
    one_line_error(filled("train", "--resume", directory), "is a symlink")
    with pytest.raises(InputError):
        Trainer.resume(directory, Lake.open(world.lake))
    world.contained(before)


def test_a_fifo_metrics_file_is_refused_without_opening_it(filled, world):
    directory = run_dir(world)
    (directory / "metrics.jsonl").unlink()
    os.mkfifo(directory / "metrics.jsonl")
    one_line_error(filled("train", "--resume", directory), "not a regular file")


@pytest.mark.parametrize("line", ["{", '{"no_step": 1}', "[1]", "[" * 100000])
def test_a_garbled_metrics_line_is_one_line_naming_file_and_line(tmp_path, line):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n" + line + "\n")
    with pytest.raises(InputError) as refused:
        rundir.read_metrics(tmp_path)
    assert "metrics.jsonl:2" in one_line(str(refused.value))


def test_checkpoint_pruning_never_follows_a_symlinked_checkpoint(world):
    directory = world.tmp / "run"
    (directory / "checkpoints" / "step-0000001").mkdir(parents=True)
    os.symlink(world.outside / "victim", directory / "checkpoints" / "step-0000000")
    before = world.snapshot()
    assert [p.name for p in rundir.checkpoint_dirs(directory)] == ["step-0000001"]
    rundir._remove_dir(directory / "checkpoints" / "step-0000000")  # what pruning does with such an entry
    world.contained(before)
    assert not (directory / "checkpoints" / "step-0000000").is_symlink()


def test_an_old_pickled_run_resumes_only_with_trust_pickles_and_then_checkpoints_safely(world, fast_model_dir):
    """A real run directory as written before 2026-11-29 (pickled trainer_state.pt), carrying a payload."""
    from spo_lake.models.backend import TransformersPolicy
    from spo_lake.rl.config import load_config
    from tests.rl.test_trainer import base_lake, config_lines

    lake = base_lake(world.tmp / "trainer-lake", TransformersPolicy.from_pretrained(str(fast_model_dir)))
    lines = config_lines(str(fast_model_dir), world.tmp / "runs", steps=1, checkpoint_every=1) + ['run_name="old"']
    Trainer(load_config(None, lines), lake, show_progress=False).train()
    run = world.tmp / "runs" / "old"
    (checkpoint,) = rundir.checkpoint_dirs(run)
    state = rundir.load_state(checkpoint, "trainer_state")
    for f in checkpoint.glob("trainer_state.*"):
        f.unlink()
    torch.save({**state, "payload": Payload(world.marker)}, checkpoint / "trainer_state.pt")
    with pytest.raises(InputError, match="--trust-pickles"):
        Trainer.resume(run, lake, ["steps=2"], show_progress=False)
    assert not world.marker.exists()
    resumed = Trainer.resume(run, lake, ["steps=2"], show_progress=False, trust_pickles=True)
    assert world.marker.exists() and resumed.step == 1  # the flag is what opened it
    resumed.train()
    newest = rundir.checkpoint_dirs(run)[-1]
    assert newest.name == "step-0000002" and (newest / "trainer_state.json").exists()
    assert not list(newest.glob("*.pt"))
