"""TransformersPolicy on the real tiny model: sampled-from log-probs, scoring invariances, seeds, stops, top-p."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from spo_lake.models.backend import TransformersPolicy
from spo_lake.models.sampling import sampling_log_probs
from spo_lake.tasks.countdown import make_problems

MAX_NEW = 24


@pytest.fixture(scope="module")
def policy(fast_model_dir) -> TransformersPolicy:
    return TransformersPolicy.from_pretrained(str(fast_model_dir), batch_size=16)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    records, _ = make_problems(6, seed=11)
    return [r["prompt"] for r in records]


def full_next_token_logits(policy: TransformersPolicy, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    """Logits [len(response), V] at each response position from one unpadded forward pass (the reference)."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0]
    return logits[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(response_ids)].float()


def test_the_saved_model_loads_with_the_auto_classes(fast_model_dir):
    model = AutoModelForCausalLM.from_pretrained(fast_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(fast_model_dir)
    assert isinstance(model, LlamaForCausalLM)
    assert 500_000 <= sum(p.numel() for p in model.parameters()) <= 5_000_000
    assert None not in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert model.config.eos_token_id == tokenizer.eos_token_id
    text = "Using the numbers 3, 7, 12 (each at most once)\nAnswer: (12-7)*3"
    assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text


def test_loading_a_missing_model_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="no such directory") as info:
        TransformersPolicy.from_pretrained(str(tmp_path / "nope"))
    assert "\n" not in str(info.value)


def test_sampled_logprobs_agree_with_score_at_temperature_one(policy, prompts):
    results = policy.sample(prompts, n=3, temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW, seed=0)
    assert [r.prompt_index for r in results] == [i for i in range(len(prompts)) for _ in range(3)]
    prompt_ids = [policy.encode_prompt(prompts[r.prompt_index]) for r in results]
    scores = policy.score(prompt_ids, [r.token_ids for r in results], batch_size=5)
    for r, fresh in zip(results, scores):
        assert len(r.token_ids) == len(r.logprobs) == len(fresh) >= 1
        assert r.logprobs == pytest.approx(fresh, abs=1e-4)
        assert r.finish_reason == ("stop" if r.token_ids[-1] == policy.tokenizer.eos_token_id else "length")
        assert r.text == policy.tokenizer.decode(r.token_ids, skip_special_tokens=True)


def test_score_does_not_depend_on_batch_or_padding_side(policy, prompts):
    pairs = [policy.tokenize_response(p, r) for p, r in zip(prompts, ["3", "(12-7)*3+1", "19+2*4-(1+1)", "", "7", "1/2"])]
    prompt_ids, response_ids = [p for p, _ in pairs], [r for _, r in pairs]
    alone = [policy.score([p], [r])[0] for p, r in pairs]
    for batch_size in (2, 6):
        for side in ("right", "left"):
            together = policy.score(prompt_ids, response_ids, batch_size=batch_size, padding_side=side)
            for a, b in zip(alone, together):
                assert len(a) == len(b) and max((abs(x - y) for x, y in zip(a, b)), default=0.0) < 1e-5
    reference = full_next_token_logits(policy, prompt_ids[1], response_ids[1]).log_softmax(-1)
    expected = reference.gather(-1, torch.tensor(response_ids[1]).unsqueeze(-1)).squeeze(-1).tolist()
    assert alone[1] == pytest.approx(expected, abs=1e-5)


def test_sampling_is_deterministic_for_a_seed(policy, prompts):
    def run(seed: int) -> list[list[int]]:
        return [r.token_ids for r in policy.sample(prompts, n=2, max_new_tokens=MAX_NEW, seed=seed)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_stop_strings_end_a_response_at_the_token_that_completes_them(policy, prompts):
    free = policy.sample(prompts, n=4, max_new_tokens=MAX_NEW, seed=2)
    stopped = policy.sample(prompts, n=4, max_new_tokens=MAX_NEW, stop=["+"], seed=2)
    assert any("+" in r.text for r in free)
    for f, s in zip(free, stopped):
        # Same seed: the stopped run is the free run cut right after the stop string appears (each request draws
        # from its own stream; a slot refilled earlier changes the batch's rows, so log-probs only to float rounding)
        assert s.token_ids == f.token_ids[: len(s.token_ids)]
        assert s.logprobs == pytest.approx(f.logprobs[: len(s.token_ids)], abs=1e-5)
        if "+" in f.text:
            assert s.finish_reason == "stop" and "+" in s.text
            assert "+" not in policy.tokenizer.decode(s.token_ids[:-1], skip_special_tokens=True)
        else:
            assert s.token_ids == f.token_ids and s.finish_reason == f.finish_reason


def test_top_p_samples_inside_the_nucleus_and_reports_renormalised_logprobs(policy, prompts):
    top_p, temperature = 0.6, 0.8
    results = policy.sample(prompts, n=4, temperature=temperature, top_p=top_p, max_new_tokens=MAX_NEW, seed=4)
    checked = 0
    for r in results:
        logits = full_next_token_logits(policy, policy.encode_prompt(prompts[r.prompt_index]), r.token_ids)
        for position, (token, reported) in enumerate(zip(r.token_ids, r.logprobs)):
            probs = torch.softmax(logits[position] / temperature, dim=-1).tolist()
            ranked = sorted(range(len(probs)), key=lambda t: -probs[t])
            nucleus, mass = [], 0.0
            for t in ranked:  # smallest top set whose mass reaches top_p
                nucleus.append(t)
                mass += probs[t]
                if mass >= top_p:
                    break
            assert token in nucleus
            assert reported == pytest.approx(math.log(probs[token] / mass), abs=1e-4)
            checked += 1
    assert checked > 20


def test_greedy_ignores_the_seed_and_takes_the_argmax(policy, prompts):
    a = policy.sample(prompts, temperature=0.0, max_new_tokens=MAX_NEW, seed=1)
    b = policy.sample(prompts, temperature=0.0, max_new_tokens=MAX_NEW, seed=2)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    for r in a:
        logits = full_next_token_logits(policy, policy.encode_prompt(prompts[r.prompt_index]), r.token_ids)
        assert logits.argmax(-1).tolist() == r.token_ids and r.logprobs == [0.0] * len(r.token_ids)


def test_prompts_at_different_temperatures_share_a_batch_and_each_reports_its_own_distribution(policy, prompts):
    temperatures = [0.3, 1.0, 0.0, 0.7, 1.6, 0.3]  # 0: greedy, in the same batch as the others
    results = policy.sample(prompts, n=2, temperature=temperatures, top_p=0.9, max_new_tokens=MAX_NEW, seed=5)
    assert [r.prompt_index for r in results] == [i for i in range(len(prompts)) for _ in range(2)]
    for r in results:
        t = temperatures[r.prompt_index]
        logits = full_next_token_logits(policy, policy.encode_prompt(prompts[r.prompt_index]), r.token_ids)
        expected = sampling_log_probs(logits, t, 0.9).gather(-1, torch.tensor(r.token_ids).unsqueeze(-1))
        assert r.logprobs == pytest.approx(expected.squeeze(-1).tolist(), abs=1e-4)
        if t == 0:
            assert logits.argmax(-1).tolist() == r.token_ids
    # one temperature given as a list is the same draw as that temperature given once
    same = policy.sample(prompts, n=2, temperature=[0.7] * len(prompts), max_new_tokens=MAX_NEW, seed=5)
    assert same == policy.sample(prompts, n=2, temperature=0.7, max_new_tokens=MAX_NEW, seed=5)
    with pytest.raises(ValueError, match="2 temperatures for 6 prompts"):
        policy.sample(prompts, temperature=[0.5, 0.5])


def test_a_column_of_temperatures_scales_each_row_as_its_own_temperature_would():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    column = torch.tensor([[0.5], [1.0], [0.0], [2.0]])
    mixed = sampling_log_probs(logits, column, 0.8)
    for row, t in enumerate(column.squeeze(-1).tolist()):
        assert torch.allclose(mixed[row], sampling_log_probs(logits[row:row + 1], t, 0.8)[0], atol=1e-6)


def test_continuations_of_token_ids_continue_exactly_the_given_prefix(policy, prompts):
    greedy = policy.sample(prompts, temperature=0.0, max_new_tokens=MAX_NEW)
    prefixes = [policy.encode_prompt(prompts[r.prompt_index]) + r.token_ids[:3] for r in greedy]
    # Greedy from the prompt plus a greedy response's first 3 tokens is the rest of that response.
    rest = policy.sample_continuations(prefixes, temperature=0.0, max_new_tokens=MAX_NEW - 3)
    assert [r.prompt_index for r in rest] == list(range(len(prefixes)))
    assert [r.token_ids for r in rest] == [g.token_ids[3:] for g in greedy]
    # Sampled: equal prefixes get different continuations, the same seed the same ones, and the reported log-probs
    # are the model's given the whole prefix. 16 copies, not 4: 4 of the fast model's continuations are typically 3
    # distinct (none of 40 seeds gave 4 alike here), yet a machine that rounds differently draws other ones; 16
    # alike would take a far more certain model, whatever the machine
    def draw(seed: int):
        return policy.sample_continuations([prefixes[0]] * 16, max_new_tokens=MAX_NEW, seed=seed)

    drawn = draw(3)
    assert len({tuple(r.token_ids) for r in drawn}) > 1
    assert [r.token_ids for r in drawn] == [r.token_ids for r in draw(3)] != [r.token_ids for r in draw(4)]
    scores = policy.score([prefixes[0]] * len(drawn), [r.token_ids for r in drawn])
    for r, fresh in zip(drawn, scores):
        assert r.logprobs == pytest.approx(fresh, abs=1e-4) and r.policy_logprobs == pytest.approx(fresh, abs=1e-4)


def test_tokenize_response_matches_the_prompt_encoding_and_ends_with_eos(policy, prompts):
    prompt_ids, response_ids = policy.tokenize_response(prompts[0], "(12-7)*3")
    assert prompt_ids == policy.encode_prompt(prompts[0]) and prompt_ids[0] == policy.tokenizer.bos_token_id
    assert response_ids[-1] == policy.tokenizer.eos_token_id
    assert policy.tokenizer.decode(response_ids, skip_special_tokens=True) == "(12-7)*3"


def test_a_chat_template_is_applied_when_the_tokenizer_has_one(fast_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(fast_model_dir)
    tokenizer.chat_template = "{% for m in messages %}<s>User: {{ m['content'] }}\n{% endfor %}Assistant:"
    policy = TransformersPolicy(AutoModelForCausalLM.from_pretrained(fast_model_dir), tokenizer, "templated")
    ids = policy.encode_prompt("make 24")
    assert ids.count(tokenizer.bos_token_id) == 1  # the template's own, not a second one
    assert tokenizer.decode(ids) == "<s>User: make 24\nAssistant:"
    prompt_ids, response_ids = policy.tokenize_response("make 24", "3*8")
    assert prompt_ids == ids and tokenizer.decode(response_ids, skip_special_tokens=True) == "3*8"


def test_bad_sampling_settings_are_rejected(policy, prompts):
    with pytest.raises(ValueError, match="top_p"):
        policy.sample(prompts, top_p=0.0)


def test_auto_backend_falls_back_to_transformers_and_vllm_fails_clearly(fast_model_dir):
    from spo_lake.models import load_policy
    from spo_lake.models.vllm_backend import VLLMPolicy, vllm_available, vllm_device

    if vllm_available():
        pytest.skip("vLLM and a GPU are present: the fallback cannot be observed here")
    assert isinstance(load_policy(str(fast_model_dir)), TransformersPolicy)
    if vllm_device() is None:  # with vLLM's CPU build it loads instead (tests/models/test_vllm_backend.py)
        with pytest.raises(RuntimeError, match="vllm"):
            VLLMPolicy.from_pretrained(str(fast_model_dir))
    with pytest.raises(ValueError, match="backend"):
        load_policy(str(fast_model_dir), backend="tgi")
