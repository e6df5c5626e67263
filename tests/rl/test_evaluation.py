"""pass@k evaluation of a policy: counts from sandbox verdicts, the unbiased estimator, write-back as an eval run."""
import json

import pytest

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.scripted import ScriptedPolicy
from spo_lake.rl.evaluation import EvalSettings, evaluate_in_lake, evaluate_policy, select_problems
from spo_lake.scores import mean_pass_at_k
from spo_lake.tasks import SandboxOptions, get_task


@pytest.fixture(scope="module")
def policy(scripted_model_dir) -> ScriptedPolicy:
    return ScriptedPolicy.from_pretrained(str(scripted_model_dir))


@pytest.fixture
def lake(tmp_path) -> Lake:
    lake = Lake.init(tmp_path / "lake")
    ingest_dataset(lake, "countdown", None, n=5, seed=2)
    return lake


def test_pass_at_k_comes_from_the_sandbox_verdicts_of_n_samples_per_problem(lake, policy):
    problems = select_problems(lake, None)
    settings = EvalSettings(n=6, temperature=1.0, top_p=1.0, ks=(1, 3), max_new_tokens=16, seed=4)
    result = evaluate_policy(policy, problems, settings)
    assert [pid for pid, _, _ in result.per_problem] == [p.prompt_id for p in problems]
    assert len(result.samples) == 30
    for r in result.samples:  # each verdict is the task verifier's on that exact text
        assert get_task("countdown").verify(r.problem, r.text, SandboxOptions()).passed == r.verdict.passed
    correct = {p.prompt_id: sum(r.verdict.passed for r in result.samples if r.problem.prompt_id == p.prompt_id)
               for p in problems}
    assert result.per_problem == [(pid, 6, c) for pid, c in correct.items()]
    for k in (1, 3):
        assert result.pass_at_k[k] == pytest.approx(mean_pass_at_k([6] * 5, list(correct.values()), k))
    assert result.mean_reward == pytest.approx(sum(correct.values()) / 30 - 1)
    again = evaluate_policy(policy, problems, settings)
    assert [r.token_ids for r in again.samples] == [r.token_ids for r in result.samples]


def test_identical_greedy_samples_make_pass_at_k_independent_of_k(lake, policy):
    settings = EvalSettings(n=4, temperature=0.0, top_p=1.0, ks=(1, 4), max_new_tokens=16)
    result = evaluate_policy(policy, select_problems(lake, None), settings)
    assert all(c in (0, 4) for _, _, c in result.per_problem)
    assert result.pass_at_k[1] == result.pass_at_k[4]


def test_evaluate_in_lake_records_an_eval_run_and_writes_the_samples_back(lake, policy):
    settings = EvalSettings(n=3, temperature=0.4, top_p=0.95, ks=(1, 2), max_new_tokens=12)
    result, run_id = evaluate_in_lake(lake, policy, settings, where="p.prompt_id <> 'countdown/2/0'", max_prompts=3)
    assert [pid for pid, _, _ in result.per_problem] == ["countdown/2/1", "countdown/2/2", "countdown/2/3"]
    rows = lake.sql(f"SELECT t.source, t.temperature, e.passed FROM trajectories t JOIN evaluations e "
                    f"USING (trajectory_id) WHERE t.run_id = '{run_id}'").to_pylist()
    assert len(rows) == 9 and {(r["source"], r["temperature"]) for r in rows} == {("policy", 0.4)}
    assert sum(r["passed"] for r in rows) == sum(c for _, _, c in result.per_problem)
    run = lake.sql(f"SELECT * FROM runs WHERE run_id = '{run_id}' AND status = 'finished'").to_pylist()[0]
    assert run["kind"] == "eval" and json.loads(run["metrics"])["pass@2"] == pytest.approx(result.pass_at_k[2])


def test_bad_settings_and_selections_are_one_line_errors(lake):
    with pytest.raises(ValueError, match="every k in 1..n"):
        EvalSettings(n=5, ks=(1, 10))
    with pytest.raises(ValueError, match="bad prompt selection"):
        select_problems(lake, "nope = 1")
