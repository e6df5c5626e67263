"""The demo's training runs side by side (`spolake demo --jobs N`): the same results as one after another, each
run's output in its own log, a failing run named with its log."""
import pytest

from spo_lake.demo.run import train_methods
from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.pipelines.q0 import q0
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


def test_a_failing_run_side_by_side_is_named_with_its_log(lake, fast_model_dir, tmp_path):
    config = runs(fast_model_dir, tmp_path)
    config["GRPO"]["snapshot"] = "no-such-snapshot"
    with pytest.raises(RuntimeError, match=r"GRPO: training exited with 1; its output: .*grpo\.log"):
        train_methods(lake.root, config, 8, tmp_path, print, jobs=2)
    assert "no snapshot named 'no-such-snapshot'" in (tmp_path / "logs" / "grpo.log").read_text()
