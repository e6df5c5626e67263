"""The demo's training runs and model builds side by side (`spolake demo --jobs N`): the same results as one after
another, each one's output in its own log, a failing run named with its log."""
import threading

import pytest

from spo_lake.demo.run import build_models, train_method, train_methods
from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.pipelines.q0 import q0
from spo_lake.pipelines.recipe import load_recipe, run_recipe
from spo_lake.rl.run import read_metrics
from spo_lake.rl.trainer import TIMING_KEYS


@pytest.fixture(scope="module")
def lake(tmp_path_factory, fast_model_dir) -> Lake:
    lake = Lake.init(tmp_path_factory.mktemp("side") / "lake")
    ingest_dataset(lake, "countdown", None, n=3, seed=0)
    q0(lake, TransformersPolicy.from_pretrained(str(fast_model_dir)), k=2, max_new_tokens=8, show_progress=False)
    lake.snapshot("base")
    return lake


def runs(model, run_dir) -> dict[str, dict]:
    base = {"model": str(model), "snapshot": "base", "steps": 2, "batch_size": 4, "max_new_tokens": 8,
            "judge_workers": 1, "run_dir": str(run_dir), "checkpoint_every": 0, "device": "cpu",
            "streams": [{"name": "online", "kind": "online", "fraction": 1.0}]}
    return {"SPO": {**base, "algorithm": "spo", "run_name": "spo", "seed": 1},
            "GRPO": {**base, "algorithm": "grpo", "run_name": "grpo", "samples_per_prompt": 2, "seed": 2}}


def test_runs_side_by_side_give_the_results_of_runs_one_after_another(lake, fast_model_dir, tmp_path):
    side = train_methods(lake.root, runs(fast_model_dir, tmp_path / "side"), 8, tmp_path / "side", print, jobs=2)
    alone = train_methods(lake.root, runs(fast_model_dir, tmp_path / "alone"), 8, tmp_path / "alone", print, jobs=1)
    assert [r.method for r in side] == [r.method for r in alone] == ["SPO", "GRPO"]
    for a, b in zip(side, alone):
        assert a.curve == b.curve and a.final == b.final and a.online_samples == b.online_samples == 8
    for name in ("spo", "grpo"):  # every step's metrics, not only the evaluations
        assert without_timings(tmp_path / "side" / name) == without_timings(tmp_path / "alone" / name)
        assert "finished at step 2" in (tmp_path / "side" / "logs" / f"{name}.log").read_text()


def without_timings(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in read_metrics(run_dir)]


def test_a_failing_run_side_by_side_is_named_with_its_log_and_stops_the_others(lake, fast_model_dir, tmp_path):
    config = runs(fast_model_dir, tmp_path)
    config["GRPO"]["snapshot"] = "no-such-snapshot"
    config["SPO"]["steps"] = 500  # minutes of training: not waited for once GRPO has failed
    with pytest.raises(RuntimeError, match=r"GRPO: training exited with 1; its output: .*grpo\.log"):
        train_methods(lake.root, config, 8, tmp_path, print, jobs=2)
    assert "no snapshot named 'no-such-snapshot'" in (tmp_path / "logs" / "grpo.log").read_text()
    assert "finished at step" not in (tmp_path / "logs" / "spo.log").read_text()  # stopped, not waited for


def test_a_run_started_as_the_others_are_stopped_stops_at_once(lake, fast_model_dir, tmp_path):
    """The side-by-side runs' stop lists the children running; one started in that instant is told by the event."""
    config = runs(fast_model_dir, tmp_path)["SPO"] | {"steps": 500}  # minutes of training: never waited for
    stop = threading.Event()
    stop.set()
    with pytest.raises(RuntimeError, match="SPO: training exited with"):
        train_method(lake.root, "SPO", config, 8, tmp_path, print, quiet=True, stop=stop)
    assert "finished at step" not in (tmp_path / "logs" / "spo.log").read_text()


RECIPE = """
[vars]
out = "{out}"
[[steps]]
run = "model_tiny"
out = "{out}/models/a"
seed = 1
steps = 3
n_problems = 40
[[steps]]
run = "model_tiny"
out = "{out}/models/b"
seed = 2
steps = 3
n_problems = 40
style = "cot"
"""


# builds and trains four transformers
@pytest.mark.integration
def test_the_recipes_models_built_side_by_side_are_the_models_it_builds_in_turn(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(RECIPE.replace("{out}", str(tmp_path / "side")))
    build_models(load_recipe(path), tmp_path / "side", 2, print)
    path.write_text(RECIPE.replace("{out}", str(tmp_path / "turn")))
    done = run_recipe(load_recipe(path), Lake.init(tmp_path / "lake"), show_progress=False)
    assert [d["summary"] for d in done] == [f"built {tmp_path}/turn/models/a", f"built {tmp_path}/turn/models/b"]
    for name in ("a", "b"):
        side, turn = tmp_path / "side" / "models" / name, tmp_path / "turn" / "models" / name
        assert (side / "model.safetensors").read_bytes() == (turn / "model.safetensors").read_bytes()
        assert (tmp_path / "side" / "logs" / f"model-{name}.log").exists()  # its output, not the terminal
    # the recipe keeps a finished build; a build cut short (no tiny_config.json, written last) is built again
    (tmp_path / "turn" / "models" / "b" / "tiny_config.json").unlink()
    again = run_recipe(load_recipe(path), Lake.open(tmp_path / "lake"), show_progress=False)
    assert [d["summary"] for d in again] == [f"{tmp_path}/turn/models/a exists, kept", f"built {tmp_path}/turn/models/b"]
