import pytest

from spo_lake.models.scripted import ScriptedPolicy
from spo_lake.models.tokens import render_prompt, tokenizer_id
from spo_lake.pipelines.refprobs import refprobs
from spo_lake.pipelines.sample import sample
from spo_lake.tasks import Problem


@pytest.fixture(scope="module")
def policy(scripted_model_dir) -> ScriptedPolicy:
    return ScriptedPolicy.from_pretrained(str(scripted_model_dir))


def cached(lake) -> list[dict]:
    return lake.sql("""SELECT l.*, t.prompt_id, t.source, t.response_text, t.token_ids AS own_ids, p.task, p.prompt, p.tests
                       FROM logprobs l JOIN trajectories t USING (trajectory_id) JOIN prompts p USING (prompt_id)
                       ORDER BY trajectory_id""").to_pylist()


def test_refprobs_equal_a_fresh_score_for_sampled_and_text_only_trajectories(countdown_lake, policy):
    lake = countdown_lake
    sample(lake, policy, n=1, max_new_tokens=12, show_progress=False)
    humans = lake.sql("SELECT count(*) AS n FROM trajectories WHERE source = 'human'").column("n")[0].as_py()

    first = refprobs(lake, policy, where="t.source = 'human'", batch_size=4, show_progress=False)
    assert (first.scored, first.tokenized, first.already_cached) == (humans, humans, 0)
    rest = refprobs(lake, policy, batch_size=4, show_progress=False)
    assert (rest.scored, rest.tokenized, rest.already_cached) == (4, 0, humans)

    rows = cached(lake)
    assert len(rows) == humans + 4
    prompts, responses = [], []
    for r in rows:
        prompt = render_prompt(Problem.from_row(r))
        assert (r["model_id"], r["tokenizer_id"]) == (policy.model_id, tokenizer_id(policy))
        if r["source"] == "human":  # text only: tokenised with the model's tokenizer, EOS appended
            assert r["own_ids"] is None and r["token_ids"] == policy.tokenize_response(prompt, r["response_text"])[1]
        else:  # sampled by this model: scored on its own token ids
            assert r["token_ids"] == r["own_ids"]
        prompts.append(policy.encode_prompt(prompt))
        responses.append(r["token_ids"])
    for r, fresh in zip(rows, policy.score(prompts, responses, batch_size=1)):
        assert len(r["logprobs"]) == len(r["token_ids"]) and r["logprobs"] == pytest.approx(fresh, abs=1e-5)

    again = refprobs(lake, policy, show_progress=False)
    assert (again.scored, again.already_cached) == (0, humans + 4)
