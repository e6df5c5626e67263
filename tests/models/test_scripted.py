"""The scripted policy backend (spo_lake.models.scripted) as a backend in its own right: what plumbing tests rely on."""
import math

import pytest
import torch

from spo_lake.errors import InputError
from spo_lake.models import load_policy
from spo_lake.models.sampling import sampling_log_probs
from spo_lake.models.scripted import ScriptedPolicy, write_scripted_model
from spo_lake.rollouts.engine import PolicySpec


@pytest.fixture(scope="module")
def policy(scripted_model_dir) -> ScriptedPolicy:
    loaded = load_policy(str(scripted_model_dir))
    assert isinstance(loaded, ScriptedPolicy)
    return loaded


def as_tuples(results):
    return [(r.prompt_index, r.token_ids, r.logprobs, r.finish_reason, r.text) for r in results]


def test_loads_by_path_like_a_model_and_samples_the_same_per_seed_anywhere(policy, scripted_model_dir):
    prompts = ["Using the numbers 1, 2 write 3.\nAnswer:", "reach 10"]
    first = policy.sample(prompts, n=10, max_new_tokens=16, seed=7)
    again = PolicySpec.of(policy).load()  # as a Ray worker loads it: by path, in a fresh backend
    assert again.model_id == policy.model_id == load_policy(str(scripted_model_dir)).model_id
    assert as_tuples(again.sample(prompts, n=10, max_new_tokens=16, seed=7)) == as_tuples(first)
    assert as_tuples(policy.sample(prompts, n=10, max_new_tokens=16, seed=8)) != as_tuples(first)
    assert [r.prompt_index for r in first] == [0] * 10 + [1] * 10
    # the script's responses (their closing EOS included), plus the rare stray token the epsilon floor allows
    script = {tuple(r) for r in policy.script}
    assert sum(tuple(r.token_ids) in script for r in first) >= 15
    for r in first:
        assert r.text == policy.tokenizer.decode(r.token_ids, skip_special_tokens=True)
        assert r.finish_reason == ("stop" if r.token_ids[-1] == policy.tokenizer.eos_token_id else "length")


def test_logprobs_are_those_of_the_tempered_distribution_per_prompt_and_score_gives_the_models(policy):
    prompts = ["a", "b", "c"]
    temperatures = [1.0, 0.5, 2.0]
    results = policy.sample(prompts, n=3, temperature=temperatures, top_p=0.9, max_new_tokens=12, seed=1)
    encoded = [policy.encode_prompt(p) for p in prompts]
    scored = policy.score([encoded[r.prompt_index] for r in results], [r.token_ids for r in results])
    for r, model_logprobs in zip(results, scored):
        temperature = temperatures[r.prompt_index]
        for i, token in enumerate(r.token_ids):
            model = policy.log_probs(encoded[r.prompt_index] + r.token_ids[:i])
            assert math.isclose(float(model.exp().sum()), 1.0, rel_tol=1e-5)
            tempered = sampling_log_probs(model.unsqueeze(0), temperature, 0.9)[0]
            assert r.logprobs[i] == pytest.approx(float(tempered[token]), abs=1e-6)
        assert r.policy_logprobs == pytest.approx(model_logprobs, abs=1e-6)
    with pytest.raises(InputError, match="2 temperatures for 3 prompts"):
        policy.sample(prompts, temperature=[1.0, 0.5])


def test_the_distribution_is_the_script_with_an_epsilon_floor(policy):
    prompt = policy.encode_prompt("any prompt")
    eos, vocab, epsilon = policy.tokenizer.eos_token_id, len(policy.tokenizer), policy.epsilon
    _, known = policy.tokenize_response("any prompt", "I do not know.")
    _, stray = policy.tokenize_response("any prompt", "zzz")
    first = {r[0] for r in policy.script}
    # the first token: each scripted response's first token equally likely (4 responses, distinct first tokens)
    assert len(first) == len(policy.script) == 4
    assert policy.score([prompt], [known])[0][0] == pytest.approx(math.log((1 - epsilon) / 4 + epsilon / vocab))
    # then the response is certain up to the floor, its EOS included
    assert policy.score([prompt], [known])[0][1:] == pytest.approx([math.log(1 - epsilon + epsilon / vocab)] *
                                                                   (len(known) - 1))
    # off the script every token but EOS has only the floor, and EOS takes the rest
    stray_scores = policy.score([prompt], [stray])[0]
    assert stray_scores[-1] == pytest.approx(math.log(1 - epsilon + epsilon / vocab)) and stray[-1] == eos
    assert stray_scores[1:-1] == pytest.approx([math.log(epsilon / vocab)] * (len(stray) - 2))


def test_continuations_continue_their_prefix_and_stop_at_a_stop_string(policy):
    prompt = policy.encode_prompt("reach 56")
    signing_off = next(r for r in policy.script if "Hope" in policy.tokenizer.decode(r))
    prefixes = [prompt + signing_off[:1], prompt + signing_off[:2]]
    greedy = policy.sample_continuations(prefixes, temperature=0.0, max_new_tokens=20, seed=0)
    for prefix, result in zip(prefixes, greedy):
        assert prefix[len(prompt):] + result.token_ids == signing_off  # the rest of the one response it started
        assert result.finish_reason == "stop" and all(lp == 0.0 for lp in result.logprobs)  # greedy: a point mass
    stopped = policy.sample_continuations(prefixes[:1], temperature=0.0, max_new_tokens=20, stop=["\n"], seed=0)[0]
    # it ends at the token that completed the stop string (kept in its text), before the response's EOS
    assert stopped.finish_reason == "stop" and "\n" in stopped.text
    assert "\n" not in policy.tokenizer.decode(stopped.token_ids[:-1]) and len(stopped.token_ids) < len(greedy[0].token_ids)
    assert policy.sample_continuations(prefixes, seed=3) == policy.sample_continuations(prefixes, seed=3)


def test_refuses_what_it_cannot_do(policy, tmp_path):
    with pytest.raises(InputError, match="no weights"):
        policy.load_weights({"w": torch.zeros(1)})
    with pytest.raises(InputError, match="response marker"):
        policy.score([[1, 2]], [[3]])
    with pytest.raises(InputError, match="needs responses"):
        write_scripted_model(tmp_path / "empty", [])
