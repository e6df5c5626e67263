from __future__ import annotations

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
