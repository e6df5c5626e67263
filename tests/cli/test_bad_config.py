"""Bad `train` configs and `pipeline` recipes: one line naming the file, the line and the key; exit 1; the lake
unchanged."""
from __future__ import annotations

import pytest

from spo_lake.lake import Lake
from tests.cli.test_damage_cli import one_line_error


@pytest.fixture
def lake(spolake, lake_dir) -> Lake:
    assert spolake("init").exit_code == 0
    return Lake.open(lake_dir)


@pytest.mark.parametrize("text, fragments", [
    ('model = "m"\n[spo\n', ["invalid TOML", "line 2"]),
    ('model = "m"\nbogus_key = 1\n', ["line 2", "unknown key(s) ['bogus_key']"]),
    ('model = "m"\n\n[spo]\nbeta = 1\n', ["line 3", "unknown key(s) ['spo']"]),
    ('model = "m"\nsteps = "ten"\n', ["line 2", "steps must be int, got 'ten'"]),
    ('model = "m"\nsandbox_timeout_s = 0\n', ["line 2", "sandbox_timeout_s must be > 0, got 0"]),
    ('model = "m"\nsandbox_memory_mb = -1\n', ["line 2", "sandbox_memory_mb must be >= 1, got -1"]),
])
def test_bad_train_configs(spolake, lake, tmp_path, text, fragments):
    config = tmp_path / "train.toml"
    config.write_text(text)
    one_line_error(spolake("train", "--config", config), str(config), *fragments)
    assert lake.versions() == Lake.open(lake.root).versions()


def test_a_train_config_naming_a_missing_snapshot(spolake, lake, tmp_path):
    config = tmp_path / "train.toml"
    config.write_text(f'model = "m"\nsnapshot = "nope"\nrun_dir = "{tmp_path / "runs"}"\n')
    one_line_error(spolake("train", "--config", config), "no snapshot named 'nope'")
    assert Lake.open(lake.root).snapshots() == [] and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("text, fragments", [
    ('[[steps]]\nrun = "snapshot"\nname = "a"\n[[steps\n', ["invalid TOML"]),
    ('title = "x"\n[[steps]]\nrun = "dedup"\n', ["line 1", "unknown key 'title'"]),
    ('[[steps]]\nrun = "dedup"\n\n[[steps]]\nrun = "evaluate"\nworkers = 1\nbogus = 3\n',
     ["line 7", "steps[1] (evaluate): unknown key 'bogus'"]),
    ('[[steps]]\nrun = "snapshot"\nnote = "n"\n', ["line 2", "steps[0] (snapshot): missing key 'name'"]),
    ('[[steps]]\nrun = "sample"\nn = 2\n', ["steps[0] (sample): missing key 'model'"]),
    ('[[steps]]\nrun = "grade"\n', ["line 2", "field 'run': 'grade' is not one of"]),
])
def test_bad_pipeline_recipes_fail_before_any_step_runs(spolake, lake, tmp_path, text, fragments):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(text)
    one_line_error(spolake("pipeline", "run", recipe), str(recipe), *fragments)
    assert Lake.open(lake.root).count("runs") == 0  # not even a run record
