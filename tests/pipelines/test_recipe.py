import json

import pytest

from spo_lake.lake import Lake
from spo_lake.pipelines.recipe import load_recipe, run_recipe

RECIPE = """
[vars]
n = 3
snap = "s1"

[[steps]]
run = "prompts_add"
dataset = "countdown"
n = "{n}"
seed = 7

[[steps]]
run = "evaluate"
workers = 2

[[steps]]
run = "dedup"

[[steps]]
run = "snapshot"
name = "{snap}"
note = "after {n} problems"
"""


def test_recipe_runs_steps_and_is_incremental(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(RECIPE)
    lake = Lake.init(tmp_path / "lake")
    done = run_recipe(load_recipe(path), lake, show_progress=False, log=lambda s: None)
    assert [d["step"] for d in done] == ["prompts_add", "evaluate", "dedup", "snapshot"]
    assert lake.count("prompts") == 3
    humans = lake.count("trajectories")
    assert lake.sql("SELECT count(*) AS n FROM evaluations WHERE verifier = 'countdown'").to_pylist()[0]["n"] == humans
    snap = lake.get_snapshot("s1")
    assert snap.note == "after 3 problems" and snap.versions["prompts"] == lake.version("prompts")

    again = run_recipe(load_recipe(path), lake, show_progress=False, log=lambda s: None)
    assert "0 new" in again[0]["summary"] and again[1]["summary"].startswith("evaluated 0")
    assert lake.count("trajectories") == humans
    runs = lake.sql("SELECT status, metrics FROM runs WHERE kind = 'pipeline' ORDER BY created_at").to_pylist()
    assert [r["status"] for r in runs] == ["running", "finished", "running", "finished"]
    assert [s["step"] for s in json.loads(runs[1]["metrics"])["steps"]] == [d["step"] for d in done]


def test_set_overrides_vars_with_their_type(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(RECIPE)
    recipe = load_recipe(path, {"n": "5"})
    assert recipe.steps[0]["n"] == 5 and recipe.steps[3]["note"] == "after 5 problems"
    with pytest.raises(ValueError, match="no such var"):
        load_recipe(path, {"nope": "1"})


def test_unknown_step_is_a_one_line_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[steps]]\nrun = "train_everything"\n')
    with pytest.raises(ValueError, match=r"steps\[0\]: field 'run'"):
        load_recipe(path)
