from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from spo_lake.cli.app import app


@pytest.fixture
def lake_dir(tmp_path) -> Path:
    return tmp_path / "lake"


@pytest.fixture
def spolake(lake_dir) -> Callable[..., Result]:
    """Run `spolake --lake <tmp lake> ARGS...` in-process; stdout and stderr are kept apart."""
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(app, ["--lake", str(lake_dir), *map(str, args)])

    return run


@pytest.fixture
def filled(spolake, tmp_path):
    """A lake with one prompt and three trajectories (two with imported verdicts), snapshot 'v1' before a fourth."""
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt_id": "p1", "task": "countdown", "prompt": "reach 10"}) + "\n")
    rows = [{"prompt_id": "p1", "response": f"x = {i}", "token_ids": [i, 7], "reward": float(-(i % 2))}
            for i in range(2)] + [{"prompt_id": "p1", "response": "x = 2"}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "more.jsonl").write_text(json.dumps({"prompt_id": "p1", "response": "x = 3"}) + "\n")
    for args in [("prompts", "add", tmp_path / "p.jsonl"), ("ingest", tmp_path / "t.jsonl", "--source", "policy"),
                 ("snapshot", "create", "v1", "--note", "three rows"),
                 ("ingest", tmp_path / "more.jsonl", "--source", "human")]:
        result = spolake(*args)
        assert result.exit_code == 0, result.stderr
    return spolake
