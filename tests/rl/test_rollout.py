"""Online rollouts: the step-keyed schedule, the worker thread, and write-back to the lake."""
import time

import pytest
import torch

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.lake.appender import BufferedAppender
from spo_lake.models.backend import TransformersPolicy
from spo_lake.rl.data import online_prompts
from spo_lake.rl.rollout import (
    OnlineSource,
    PolicyVersions,
    RolloutSchedule,
    RolloutSettings,
    behaviour_version,
    written_trajectory_ids,
)
from spo_lake.tasks import SandboxOptions


@pytest.mark.parametrize("interval, lag, expected", [
    (1, 0, [0, 1, 2, 3, 4, 5]),  # synchronous on-policy
    (1, 1, [0, 0, 1, 2, 3, 4]),  # PPO, overlapped: one step stale
    (3, 0, [0, 0, 0, 3, 3, 3]),
    (3, 1, [0, 0, 0, 0, 3, 3]),
    (2, 2, [0, 0, 0, 0, 2, 2]),
])
def test_behaviour_version_is_the_latest_refresh_point_at_least_lag_steps_back(interval, lag, expected):
    assert [behaviour_version(s, interval, lag) for s in range(6)] == expected


def schedule(**kw) -> RolloutSchedule:
    base = dict(seed=7, prompts_per_step=2, samples_per_prompt=2, temperature_min=0.1, temperature_max=0.8,
                top_p=0.95, max_new_tokens=12, interval=1, lag=0)
    return RolloutSchedule(**{**base, **kw})


def test_the_plan_of_a_step_depends_only_on_seed_and_step():
    plans = [schedule().plan(step, 5) for step in range(20)]
    assert plans == [schedule().plan(step, 5) for step in range(20)]
    assert len({p[2] for p in plans}) == 20 and len({p[1] for p in plans}) == 20  # fresh seeds, temperatures
    assert all(0.1 <= t <= 0.8 and len(set(idx)) == 2 for idx, t, _ in plans)
    assert schedule(seed=8).plan(0, 5) != plans[0]


@pytest.fixture(scope="module")
def policy(fast_model_dir) -> TransformersPolicy:
    return TransformersPolicy.from_pretrained(str(fast_model_dir))


@pytest.fixture(scope="module")
def lake(tmp_path_factory, policy) -> Lake:
    lake = Lake.init(tmp_path_factory.mktemp("rollout") / "lake")
    ingest_dataset(lake, "countdown", None, n=3, seed=1)
    lake.append("values", [{"prompt_id": f"countdown/1/{i}", "trajectory_id": None, "position": None,
                            "model_id": policy.model_id, "temperature": 1.0, "top_p": 1.0, "n": 8, "n_success": i}
                           for i in range(3)])
    lake.snapshot("s")
    return lake


def make_source(lake, policy, versions, end, appender=None, already_written=None, **kw) -> OnlineSource:
    prompts = online_prompts(lake, "s", "", policy.model_id, require_q0=True)
    settings = RolloutSettings(lake=lake, snapshot="s", prompts=prompts, schedule=schedule(**kw), stream_index=0,
                               beta=0.25, algorithm="spo", run_id="run-x", model_id=policy.model_id,
                               options=SandboxOptions(), judge_workers=1)
    return OnlineSource(policy, versions, settings, end, appender=appender, already_written=already_written)


def perturbed(policy, scale: float) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {k: v + scale * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
            for k, v in policy.model.state_dict().items()}


def test_the_worker_samples_each_step_with_its_scheduled_policy_version_and_writes_back(lake, policy):
    versions = PolicyVersions()
    versions.publish(0, policy.model.state_dict())
    appender = BufferedAppender(lake, flush_rows=10_000)
    source = make_source(lake, policy, versions, end=3, appender=appender, interval=1, lag=0)
    source.start(0)
    steps = []
    for step in range(3):
        steps.append(source.take(step, 4))
        versions.publish(step + 1, perturbed(policy, 0.05 * (step + 1)))  # what the trainer does after a step
    source.stop()
    appender.flush()

    for step, examples in enumerate(steps):
        assert [e.policy_version for e in examples] == [step] * 4
        for e in examples:
            assert len(e.behavior_logprobs) == len(e.response_ids) > 0 and all(lp <= 0 for lp in e.behavior_logprobs)
            assert e.reward in (0.0, -1.0) and e.q0 < 0
    rows = lake.sql("SELECT t.*, e.reward FROM trajectories t JOIN evaluations e USING (trajectory_id) "
                    "WHERE run_id = 'run-x' ORDER BY policy_version").to_pylist()
    assert len(rows) == 12 and {r["source"] for r in rows} == {"spo"}
    assert [r["policy_version"] for r in rows] == [0] * 4 + [1] * 4 + [2] * 4
    by_id = {e.trajectory_id: e for examples in steps for e in examples}
    for r in rows:
        example = by_id[r["trajectory_id"]]
        assert r["token_ids"] == example.response_ids and r["reward"] == example.reward
    assert written_trajectory_ids(lake, "run-x") == set(by_id)

    # Same schedule and versions in a fresh thread: identical rollouts; ids already written are not added again.
    again_versions = PolicyVersions()
    for v in range(3):
        again_versions.publish(v, policy.model.state_dict() if v == 0 else perturbed(policy, 0.05 * v))
    again_appender = BufferedAppender(lake)
    again_source = make_source(lake, policy, again_versions, end=3, appender=again_appender,
                               already_written=written_trajectory_ids(lake, "run-x"), interval=1, lag=0)
    again_source.start(0)
    repeated = [again_source.take(step, 4) for step in range(3)]
    again_source.stop()
    again_appender.flush()
    assert [[(e.trajectory_id, e.response_ids) for e in s] for s in repeated] == \
        [[(e.trajectory_id, e.response_ids) for e in s] for s in steps]
    assert lake.sql("SELECT count(*) AS n FROM trajectories WHERE run_id = 'run-x'").column("n")[0].as_py() == 12

    # The published weights are what samples: unperturbed versions 1 and 2 change steps 1 and 2 only.
    plain = PolicyVersions()
    for v in range(3):
        plain.publish(v, policy.model.state_dict())
    unperturbed_source = make_source(lake, policy, plain, end=3, interval=1, lag=0)
    unperturbed_source.start(0)
    other = [unperturbed_source.take(step, 4) for step in range(3)]
    unperturbed_source.stop()
    logprobs = lambda examples: [e.behavior_logprobs for e in examples]  # noqa: E731
    assert logprobs(other[0]) == logprobs(steps[0])
    assert logprobs(other[1]) != logprobs(steps[1]) and logprobs(other[2]) != logprobs(steps[2])


def test_the_worker_waits_for_an_unpublished_version_and_stops_on_request(lake, policy):
    versions = PolicyVersions()
    versions.publish(0, policy.model.state_dict())
    source = make_source(lake, policy, versions, end=5, interval=2, lag=0)
    worker = source.start(0)
    assert [e.policy_version for e in source.take(0, 4) + source.take(1, 4)] == [0] * 8
    time.sleep(1.0)
    assert worker.out.empty()  # step 2 needs version 2, not published yet
    source.stop()
    assert not worker.is_alive()
