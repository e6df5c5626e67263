import json

import pytest

from spo_lake import ingest_prompts
from spo_lake.models.scripted import ScriptedPolicy
from spo_lake.pipelines.q0 import latest_prompt_values, q0
from spo_lake.pipelines.sample import sample
from spo_lake.scores import q0_from_counts

SHORT = 12


@pytest.fixture(scope="module")
def policy(scripted_model_dir) -> ScriptedPolicy:
    return ScriptedPolicy.from_pretrained(str(scripted_model_dir))


def judged_counts(lake, model_id: str) -> dict[str, tuple[int, int]]:
    """(n, n_success) per prompt recomputed from the raw rows: evaluated T=1 / top-p 1 samples of the model."""
    rows = lake.sql(f"""SELECT t.prompt_id, count(*) AS n, count(*) FILTER (WHERE e.passed) AS s
                        FROM trajectories t JOIN evaluations e USING (trajectory_id)
                        WHERE t.model_id = '{model_id}' AND t.temperature = 1 AND t.top_p = 1
                        GROUP BY ALL""").to_pylist()
    return {r["prompt_id"]: (r["n"], r["s"]) for r in rows}


def test_q0_reuses_evaluated_samples_and_draws_only_the_difference(countdown_lake, policy):
    lake = countdown_lake
    # Already in the lake: 2 evaluated samples per prompt that count, and some that must not.
    sample(lake, policy, n=2, max_new_tokens=SHORT, source="policy", seed=5, evaluate=True, show_progress=False)
    sample(lake, policy, n=1, max_new_tokens=SHORT, source="policy", seed=5, show_progress=False)  # not evaluated
    sample(lake, policy, n=1, max_new_tokens=SHORT, temperature=0.5, seed=5, evaluate=True, show_progress=False)

    first = q0(lake, policy, k=5, max_new_tokens=SHORT, show_progress=False)
    assert (first.reused, first.sampled, first.values_written) == (8, 4 * 3, 4)
    values = {r["prompt_id"]: (r["n"], r["n_success"]) for r in latest_prompt_values(lake, policy.model_id)}
    assert values == judged_counts(lake, policy.model_id) and all(n == 5 for n, _ in values.values())
    drawn = lake.sql(f"SELECT * FROM trajectories WHERE run_id = '{first.run_id}'").to_pylist()
    assert len(drawn) == 12 and {(r["source"], r["temperature"], r["top_p"]) for r in drawn} == {("reference", 1.0, 1.0)}
    assert first.mean_s0 == pytest.approx(sum(s / n for n, s in values.values()) / 4)
    assert first.mean_q0 == pytest.approx(sum(q0_from_counts(n, s, first.beta) for n, s in values.values()) / 4)

    again = q0(lake, policy, k=5, max_new_tokens=SHORT, show_progress=False)
    assert (again.reused, again.sampled, again.values_written) == (20, 0, 0)

    more = q0(lake, policy, k=7, max_new_tokens=SHORT, where="p.prompt_id <> 'countdown/0/3'", show_progress=False)
    assert (more.prompts, more.sampled, more.values_written) == (3, 3 * 2, 3)
    values = {r["prompt_id"]: r["n"] for r in latest_prompt_values(lake, policy.model_id)}
    assert values == {"countdown/0/0": 7, "countdown/0/1": 7, "countdown/0/2": 7, "countdown/0/3": 5}
    runs = lake.sql(f"SELECT * FROM runs WHERE run_id = '{more.run_id}' AND status = 'finished'").to_pylist()
    assert json.loads(runs[0]["metrics"])["sampled"] == 6 and runs[0]["kind"] == "q0"


def test_q0_refuses_a_bad_beta_before_sampling(countdown_lake, policy):
    with pytest.raises(ValueError, match="beta"):
        q0(countdown_lake, policy, k=2, beta=0.0, show_progress=False)
    assert countdown_lake.sql("SELECT count(*) AS n FROM runs").column("n")[0].as_py() == 0


def test_q0_skips_prompts_whose_samples_cannot_be_judged_and_says_so(countdown_lake, policy, tmp_path):
    """A lake may hold any task's prompts; one without a verifier here failed the whole run ("unknown task")."""
    (tmp_path / "chat.jsonl").write_text(json.dumps({"prompt_id": "chat/1", "task": "chat", "prompt": "hello"}) + "\n")
    ingest_prompts(countdown_lake, str(tmp_path / "chat.jsonl"))
    report = q0(countdown_lake, policy, k=2, max_new_tokens=SHORT, show_progress=False)
    assert report.prompts == 4 and report.skipped == {"unknown task 'chat'": 1}
    assert report.summary().endswith("; skipped 1 prompts (unknown task 'chat')")
    assert {r["prompt_id"] for r in latest_prompt_values(countdown_lake, policy.model_id)} == {
        f"countdown/0/{i}" for i in range(4)}
