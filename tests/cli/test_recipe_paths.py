"""`pipeline run FILE --set out=DIR`: relative paths in a recipe resolve against the working directory."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import spo_lake
from spo_lake.cli.app import app
from spo_lake.pipelines.recipe import load_recipe

PACKAGE = Path(spo_lake.__file__).parent

RECIPE = """
[vars]
out = "recipe-out"

[[steps]]
run = "prompts_add"
path = "data/prompts.jsonl"

[[steps]]
run = "model_tiny"
out = "{out}/models/pi0"
steps = 2

[[steps]]
run = "sample"
model = "{out}/models/pi0"
n = 1
max_new_tokens = 4
"""


@pytest.mark.integration  # the recipe trains a (2-step) model
def test_recipe_paths_resolve_against_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.toml").write_text(RECIPE)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "prompts.jsonl").write_text(json.dumps(
        {"prompt_id": "p1", "task": "countdown", "prompt": "reach 3 with [1, 2]",
         "tests": {"target": 3, "numbers": [1, 2]}}) + "\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["--lake", "lake", "pipeline", "run", "recipes/r.toml", "--set", "out=mine"])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "mine" / "models" / "pi0" / "config.json").is_file()
    assert not (tmp_path / "recipes" / "mine").exists() and not (tmp_path / "recipes" / "lake").exists()


@pytest.mark.parametrize("name", ["quickstart", "paper_offline_mix"])
def test_the_shipped_recipes_live_in_the_package_and_name_files_that_exist(name):
    """One folder holds the shipped recipes, inside the package (so a wheel has them, no symlink); the files they name
    exist from the repository root, where the docs run them (`spolake pipeline run spo_lake/recipes/NAME.toml`)."""
    path = PACKAGE / "recipes" / f"{name}.toml"
    assert not path.parent.is_symlink()
    templates = [s["template"] for s in load_recipe(path).steps if "template" in s]
    assert all((PACKAGE.parent / t).is_file() for t in templates)
    assert f"pipeline run spo_lake/recipes/{name}.toml" in path.read_text()

