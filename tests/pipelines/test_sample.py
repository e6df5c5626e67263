import json
import shutil

import pytest

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models import load_policy
from spo_lake.models.scripted import ScriptedPolicy
from spo_lake.models.tokens import render_prompt, tokenizer_id
from spo_lake.pipelines.sample import SampleSettings, sample
from spo_lake.tasks import Problem

SHORT = 12  # max_new_tokens: countdown answers are short; keeps the tests fast


@pytest.fixture(scope="module")
def policy(scripted_model_dir) -> ScriptedPolicy:
    """Plumbing: what the pipeline records of whatever a policy samples, so a scripted one (no forward pass)."""
    return ScriptedPolicy.from_pretrained(str(scripted_model_dir))


def sampled_rows(lake, where: str = "TRUE") -> list[dict]:
    return lake.sql(f"""SELECT t.*, p.task, p.prompt, p.tests FROM trajectories t JOIN prompts p USING (prompt_id)
                        WHERE t.source <> 'human' AND {where} ORDER BY trajectory_id""").to_pylist()


def test_sample_writes_provenance_and_behaviour_logprobs_that_match_score(countdown_lake, policy):
    lake = countdown_lake
    report = sample(lake, policy, n=2, temperature=1.0, top_p=1.0, max_new_tokens=SHORT, source="reference", seed=3,
                    show_progress=False)
    rows = sampled_rows(lake)
    assert report.sampled == len(rows) == 4 * 2 and report.skipped == 0
    run = lake.sql(f"SELECT * FROM runs WHERE run_id = '{report.run_id}' ORDER BY created_at").to_pylist()
    assert [r["status"] for r in run] == ["running", "finished"] and run[0]["kind"] == "sample"
    assert json.loads(run[-1]["metrics"])["sampled"] == 8
    eos = policy.tokenizer.eos_token_id
    for r in rows:
        meta = json.loads(r["metadata"])
        assert (r["source"], r["model_id"], r["run_id"], r["policy_version"]) == ("reference", policy.model_id, report.run_id, 0)
        assert (r["temperature"], r["top_p"], r["tokenizer_id"]) == (1.0, 1.0, tokenizer_id(policy))
        assert 1 <= len(r["token_ids"]) <= SHORT and len(r["behavior_logprobs"]) == len(r["token_ids"])
        assert meta["finish_reason"] == ("stop" if r["token_ids"][-1] == eos else "length")
        assert (meta["seed"], meta["template"], meta["max_new_tokens"]) == (3, None, SHORT)
        assert r["response_text"] == policy.tokenizer.decode(r["token_ids"], skip_special_tokens=True)
    # At temperature 1 / top-p 1 the sampled-from distribution is the model itself.
    prompts = [policy.encode_prompt(render_prompt(Problem.from_row(r))) for r in rows]
    scores = policy.score(prompts, [r["token_ids"] for r in rows])
    for r, fresh in zip(rows, scores):
        assert r["behavior_logprobs"] == pytest.approx(fresh, abs=1e-4)
    assert {json.loads(r["metadata"])["sample_index"] for r in rows} == {0, 1}


def test_a_rebuilt_lake_gets_the_same_trajectory_ids(tmp_path, policy):
    """Ids come from what determines a sample (not from the run), so SQL that hashes them repeats on a rebuild."""
    ids = []
    for name in ("a", "b"):  # the same weights in another directory: the same draws
        model = shutil.copytree(policy.source, tmp_path / name / "model")
        lake = Lake.init(tmp_path / name / "lake")
        ingest_dataset(lake, "countdown", None, n=4, seed=0)
        sample(lake, load_policy(str(model)), n=2, temperature_range=(0.1, 0.8),
               max_new_tokens=SHORT, seed=5, show_progress=False)
        ids.append([(r["trajectory_id"], r["response_text"], r["run_id"]) for r in sampled_rows(lake)])
    assert [(t, text) for t, text, _ in ids[0]] == [(t, text) for t, text, _ in ids[1]] and len(ids[0]) == 8
    assert ids[0][0][2] != ids[1][0][2]  # two runs, recorded as such


def test_sample_resumes_instead_of_duplicating(countdown_lake, policy):
    lake = countdown_lake
    first = sample(lake, policy, n=2, max_new_tokens=SHORT, seed=0, show_progress=False)
    again = sample(lake, policy, n=2, max_new_tokens=SHORT, seed=0, show_progress=False)
    assert first.sampled == 8 and again.sampled == 0 and again.skipped == 4
    assert len(sampled_rows(lake)) == 8
    more = sample(lake, policy, n=3, max_new_tokens=SHORT, seed=0, show_progress=False)
    rows = sampled_rows(lake)
    assert more.sampled == 4 and len(rows) == 12
    assert len({r["trajectory_id"] for r in rows}) == 12
    # the resumed samples draw with their own seeds, not a replay of the first ones
    seeds = {json.loads(r["metadata"])["call_seed"] for r in rows}
    assert len(seeds) == 2
    # other settings are other work: a different source or top-p samples again
    assert sample(lake, policy, n=1, max_new_tokens=SHORT, seed=0, source="policy", show_progress=False).sampled == 4
    assert sample(lake, policy, n=1, max_new_tokens=SHORT, seed=0, top_p=0.9, show_progress=False).sampled == 4


def test_sample_with_template_temperature_range_and_evaluation(countdown_lake, policy):
    lake = countdown_lake
    template = "Solve it.\n{prompt}"
    report = sample(lake, policy, n=2, max_new_tokens=SHORT, source="cot", template=template,
                    temperature_range=(0.1, 0.8), seed=1, evaluate=True, show_progress=False)
    rows = sampled_rows(lake)
    assert report.sampled == report.evaluated == 8
    temperatures = {}
    for r in rows:
        assert 0.1 <= r["temperature"] <= 0.8 and json.loads(r["metadata"])["template"] == template
        temperatures.setdefault(r["prompt_id"], set()).add(r["temperature"])
    assert all(len(t) == 1 for t in temperatures.values()) and len(set.union(*temperatures.values())) == 4
    verdicts = lake.sql("""SELECT e.* FROM evaluations e JOIN trajectories t USING (trajectory_id)
                           WHERE t.source = 'cot'""").to_pylist()
    assert len(verdicts) == 8 and {v["verifier"] for v in verdicts} == {"countdown"}
    assert sum(v["passed"] for v in verdicts) == report.passed
    again = sample(lake, policy, n=2, max_new_tokens=SHORT, source="cot", template=template,
                   temperature_range=(0.1, 0.8), seed=1, evaluate=True, show_progress=False)
    assert again.sampled == 0


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(ValueError, match="placeholder"):
        SampleSettings("reference", template="no placeholder here")
    with pytest.raises(ValueError, match="top_p"):
        SampleSettings("reference", top_p=0.0)
