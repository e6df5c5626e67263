"""The attack suite's common checks. Every case checks four things (issue 43): the lake is unchanged on refusal,
nothing outside the roots changed, no payload marker file was created, and the message is one line."""
from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from spo_lake.cli.app import app


def tree(root: Path) -> dict[str, str]:
    """Every entry under `root` (not following symlinks) with its kind and content hash: equal trees, equal files."""
    out = {}
    if not root.exists() and not root.is_symlink():
        return out
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                out[str(path.relative_to(root))] = "link:" + os.readlink(path)
            elif stat.S_ISREG(mode):
                out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif not stat.S_ISDIR(mode):
                out[str(path.relative_to(root))] = "special"
    return out


@dataclass
class World:
    """A lake, a place outside every root the product may touch (with files worth keeping), and a marker path a
    payload would create."""

    tmp: Path
    lake: Path
    outside: Path
    marker: Path

    def snapshot(self) -> tuple[dict[str, str], dict[str, str]]:
        return tree(self.lake), tree(self.outside)

    def contained(self, before: tuple[dict[str, str], dict[str, str]], lake_changed: bool = False) -> None:
        lake, outside = self.snapshot()
        assert outside == before[1], "something outside the roots changed"
        if not lake_changed:
            assert {k: v for k, v in lake.items() if not k.endswith(".lock")} == \
                {k: v for k, v in before[0].items() if not k.endswith(".lock")}, "the lake changed on a refusal"
        assert not self.marker.exists(), "a payload ran"


@pytest.fixture
def world(tmp_path) -> World:
    outside = tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / "keep.txt").write_text("precious\n")
    (outside / "keep.parquet").write_bytes(b"not yours")
    return World(tmp_path, tmp_path / "lake", outside, tmp_path / "PWNED")


@pytest.fixture
def spolake(world) -> Callable[..., Result]:
    """`spolake --lake <world's lake> ARGS...` in-process; stdout and stderr apart."""
    runner = CliRunner()

    def run(*args: object) -> Result:
        return runner.invoke(app, ["--lake", str(world.lake), *map(str, args)])

    return run


def one_line_error(result: Result, *fragments: str) -> str:
    """The CLI refused with exit 1 and exactly one line on stderr (no traceback) holding every fragment."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def one_line(message: str) -> str:
    assert message and "\n" not in message, message
    return message


@pytest.fixture
def filled(spolake, world) -> Callable[..., Result]:
    """A lake with one prompt, three trajectories and snapshot 's1'."""
    (world.tmp / "p.jsonl").write_text(json.dumps({"prompt_id": "p1", "task": "countdown", "prompt": "reach 10"})
                                       + "\n")
    (world.tmp / "t.jsonl").write_text("".join(json.dumps({"prompt_id": "p1", "response": f"x = {i}"}) + "\n"
                                               for i in range(3)))
    for args in [("prompts", "add", world.tmp / "p.jsonl"), ("ingest", world.tmp / "t.jsonl"),
                 ("snapshot", "create", "s1")]:
        result = spolake(*args)
        assert result.exit_code == 0, result.stderr
    return spolake
