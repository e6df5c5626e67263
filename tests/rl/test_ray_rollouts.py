"""executor = "ray": the behaviour policy samples in a Ray actor that is sent each new policy version, on a local 2-CPU
Ray instance started here (and shut down after), against the local rollout thread of the same run."""
import json
import re
import time

import pytest

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.pipelines.q0 import q0
from spo_lake.rl.config import load_config
from spo_lake.rl.rollout import behaviour_version
from spo_lake.rl.run import read_metrics
from spo_lake.rl.trainer import TIMING_KEYS, Trainer

BETA = 0.1
STEPS, INTERVAL, LAG = 5, 2, 1


@pytest.fixture(scope="module")
def lake(tmp_path_factory, fast_model_dir) -> Lake:
    lake = Lake.init(tmp_path_factory.mktemp("ray-rollouts") / "lake")
    ingest_dataset(lake, "countdown", None, n=4, seed=0)
    q0(lake, TransformersPolicy.from_pretrained(str(fast_model_dir)), k=4, max_new_tokens=16, beta=BETA,
       show_progress=False)
    lake.snapshot("base")
    return lake


def train(lake, model, run_dir, name: str, executor: str) -> Trainer:
    keys = dict(model=str(model), run_dir=str(run_dir), run_name=name, snapshot="base", executor=executor,
                steps=STEPS, batch_size=4, lr=1e-3, warmup_steps=0, beta=BETA, max_new_tokens=16, loss="squared",
                model_update_interval=INTERVAL, rollout_lag=LAG, judge_workers=1, threads=1)
    trainer = Trainer(load_config(None, [f"{k}={json.dumps(v)}" for k, v in keys.items()]), lake, show_progress=False)
    trainer.train()
    return trainer


def rollouts(lake: Lake, run_id: str) -> dict[tuple[int, int], dict]:
    rows = lake.sql(f"SELECT prompt_id, policy_version, token_ids, behavior_logprobs, metadata FROM trajectories "
                    f"WHERE run_id = '{run_id}'").to_pylist()
    return {(json.loads(r["metadata"])["step"], json.loads(r["metadata"])["sample_index"]): r for r in rows}


def without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def test_ray_rollout_actor_follows_the_policy_versions_and_reproduces_the_local_run(ray_instance, lake,
                                                                                   fast_model_dir, tmp_path):
    runs = {name: train(lake, fast_model_dir, tmp_path, name, executor)
            for name, executor in [("ray-a", "ray"), ("ray-b", "ray"), ("local", "local")]}
    # each run's actor is gone (its CPU free again); the test's Ray instance is left running
    deadline = time.monotonic() + 120  # an event (the CPUs back), bounded generously
    while ray_instance.available_resources().get("CPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray_instance.available_resources().get("CPU") == 2 and ray_instance.is_initialized()

    ray_a, ray_b, local = (rollouts(lake, name) for name in runs)
    assert sorted(ray_a) == [(step, i) for step in range(STEPS) for i in range(4)]
    # versions 0, 0, 0, 2, 2: the actor was sent version 2 after step 2 while the trainer went on to step 3
    assert [ray_a[(step, 0)]["policy_version"] for step in range(STEPS)] == \
        [behaviour_version(step, INTERVAL, LAG) for step in range(STEPS)] == [0, 0, 0, 2, 2]

    # the same seed gives the same rollouts, hence the same batches and losses
    assert ray_a == ray_b
    assert without_timings(read_metrics(runs["ray-a"].run_dir)) == without_timings(read_metrics(runs["ray-b"].run_dir))

    # and the same as the local thread sampling the same published versions (1 torch thread each)
    assert ray_a.keys() == local.keys()
    for key, row in local.items():
        assert ray_a[key]["token_ids"] == row["token_ids"], key
        assert ray_a[key]["behavior_logprobs"] == pytest.approx(row["behavior_logprobs"], abs=1e-5), key


@pytest.mark.parametrize("overrides, message", [
    (['executor="spark"'], "config: executor 'spark' not in ('local', 'ray')"),
    (['ray_address="auto"'], 'config: ray_address needs executor = "ray"'),
])
def test_executor_keys_are_checked(fast_model_dir, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(None, [f'model="{fast_model_dir}"', *overrides])
