"""The sampler's decoding loop (spo_lake.models.decode) and draws (sampling.draw_tokens), on a random-weight Llama built
in milliseconds: continuous batching returns every request once with its own prompt, the same seed gives the same
tokens, recorded log-probs equal the trainer's recomputation, stop strings and the closing-fence rule."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from spo_lake.models.backend import TransformersPolicy
from spo_lake.models.decode import CLOSING_FENCE, fence_end, hits_stop
from spo_lake.models.sampling import NUCLEUS_CANDIDATES, draw_tokens, sampling_log_probs
from spo_lake.models.tiny import build_tokenizer
from spo_lake.rl.examples import Example, collate
from spo_lake.rl.scoring import response_log_probs

TEXTS = ["Write a function f(x) that adds 3.\n```python\ndef f(x):\n    return x + 3\n```\nDone.",
         "Using the numbers 3, 7, 12 write an expression equal to 30.\nAnswer: (12-7)*3 + 15"]


@pytest.fixture(scope="module")
def policy() -> TransformersPolicy:
    tokenizer = build_tokenizer(TEXTS)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config._attn_implementation = "sdpa"
    return TransformersPolicy(LlamaForCausalLM(config), tokenizer, "random-llama", batch_size=4)


def prompts(k: int) -> list[str]:
    # lengths from a few tokens to ~60: a later, longer prompt must widen the cache of the rows in flight
    return [("Write f(x) that adds 3. " * (1 + (i * 5) % 7))[: 10 + (i * 37) % 150] for i in range(k)]


def test_continuous_batching_returns_every_request_once_with_what_it_gives_alone(policy):
    asked = prompts(7)
    together = policy.sample(asked, n=3, max_new_tokens=12, stop=["3"], seed=5)
    assert [r.prompt_index for r in together] == [i for i in range(7) for _ in range(3)]
    assert len({r.finish_reason for r in together}) == 2  # mixed lengths: slots were refilled mid-batch
    policy.batch_size = 1
    try:
        alone = policy.sample(asked, n=3, max_new_tokens=12, stop=["3"], seed=5)
    finally:
        policy.batch_size = 4
    for a, b in zip(together, alone):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_a_long_run_of_refills_cuts_the_cache_and_keeps_each_request_exact(policy):
    asked = prompts(3)
    requests = [policy.encode_prompt(p) for p in asked]
    # 3 × 12 requests through 4 slots: the cache fills and is cut (and widened in front) many times
    together = policy.sample(asked, n=12, max_new_tokens=20, stop=["+"], seed=9)
    assert [r.prompt_index for r in together] == [i for i in range(3) for _ in range(12)]
    for r in together:  # each against an unpadded forward pass of its own prompt and tokens
        scored = policy.score([requests[r.prompt_index]], [r.token_ids])[0]
        assert r.policy_logprobs == pytest.approx(scored, abs=1e-4)


def test_the_same_seed_gives_the_same_tokens_and_another_seed_others(policy):
    asked = prompts(5)
    first = policy.sample(asked, n=2, max_new_tokens=10, seed=3)
    again = policy.sample(asked, n=2, max_new_tokens=10, seed=3)
    other = policy.sample(asked, n=2, max_new_tokens=10, seed=4)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    assert [r.logprobs for r in first] == [r.logprobs for r in again]
    assert [r.token_ids for r in first] != [r.token_ids for r in other]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_recorded_log_probs_equal_the_trainers_recomputation(policy, temperature, top_p):
    asked = prompts(4)
    results = policy.sample(asked, n=2, temperature=temperature, top_p=top_p, max_new_tokens=10, seed=1)
    examples = [Example(0, str(r.prompt_index), policy.encode_prompt(asked[r.prompt_index]), r.token_ids, 0.0, 0.0)
                for r in results]
    batch = collate(examples, policy.pad_id)
    with torch.no_grad():
        pi_old = response_log_probs(policy.model, batch)  # what PPO's ratio and the trainer recompute
    worst = 0.0
    for row, r in enumerate(results):
        recomputed = pi_old[row, : len(r.token_ids)]
        worst = max(worst, (recomputed - torch.tensor(r.policy_logprobs)).abs().max().item())
        if temperature == 1.0 and top_p == 1.0:  # sampled from the model itself: both records are π_old
            assert r.logprobs == r.policy_logprobs
    assert worst <= 1e-4  # float32 (policy.precision), different batch shapes


def test_draws_follow_the_sampled_from_distribution_and_report_its_log_probs():
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(2, 50, generator=g)
    draws = 20_000
    uniform = torch.rand(draws, generator=g)
    for top_p in (1.0, 0.8):
        expected = sampling_log_probs(logits, 0.9, top_p)
        for row in range(2):
            tokens, chosen = draw_tokens(logits[row].expand(draws, -1), 0.9, top_p, uniform)
            assert torch.isfinite(chosen).all()  # never a token outside the nucleus
            torch.testing.assert_close(chosen, expected[row, tokens], rtol=0, atol=1e-5)
            frequency = torch.bincount(tokens, minlength=50) / draws
            assert (frequency - expected[row].exp()).abs().max() < 0.015


def test_a_nucleus_wider_than_the_candidates_is_still_exact():
    flat = torch.zeros(3, 3 * NUCLEUS_CANDIDATES)
    flat[1, 0] = 50.0  # one row whose nucleus is a single token among the candidates
    uniform = torch.tensor([0.1, 0.5, 0.999])
    tokens, chosen = draw_tokens(flat, 1.0, 0.9, uniform)
    expected = sampling_log_probs(flat, 1.0, 0.9)
    assert tokens[1] == 0
    torch.testing.assert_close(chosen, expected.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), rtol=0, atol=1e-5)
    assert torch.isfinite(chosen).all()


def test_rows_at_temperature_zero_take_the_argmax_whatever_their_uniform():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(1))
    tokens, chosen = draw_tokens(logits, torch.tensor([[0.0], [1.0], [0.0]]), 1.0, torch.tensor([0.3, 0.3, 0.9]))
    assert tokens[0] == logits[0].argmax() and tokens[2] == logits[2].argmax()
    assert chosen[0] == 0 and chosen[2] == 0 and chosen[1] < 0


def test_the_closing_fence_rule_stops_after_a_complete_block_not_at_the_opening(policy):
    tokenizer = policy.tokenizer
    # one token per character: a model may well write the fence in pieces
    ids = [i for c in TEXTS[0] for i in tokenizer(c, add_special_tokens=False).input_ids]
    ends = [k for k in range(1, len(ids) + 1) if hits_stop(tokenizer, ids[:k], [CLOSING_FENCE])]
    first = tokenizer.decode(ids[: ends[0]])
    assert first.rstrip("\n").endswith("    return x + 3\n```")  # the closing fence, not the opening one
    assert not hits_stop(tokenizer, ids[: ends[0] - 1], [CLOSING_FENCE])
    assert fence_end(tokenizer, ids) == ends[0]  # where a backend that cannot stop at the rule cuts (vLLM)
    assert fence_end(tokenizer, ids[: ends[0] - 1]) is None
    opening = tokenizer.decode(ids[: next(k for k in range(1, len(ids)) if hits_stop(tokenizer, ids[:k], ["```"]))])
    assert opening.endswith("```") and "def" not in opening  # a plain "```" stop would end at the opening fence


def test_a_response_stopped_at_its_fence_keeps_the_fence_in_its_ids_and_text(policy):
    results = policy.sample(prompts(4), n=4, max_new_tokens=30, stop=[CLOSING_FENCE, "3"], seed=2)
    for r in results:
        assert r.text == policy.tokenizer.decode(r.token_ids, skip_special_tokens=True)
        assert len(r.token_ids) == len(r.logprobs) == len(r.policy_logprobs)
        if r.finish_reason == "stop" and r.token_ids[-1] != policy.tokenizer.eos_token_id:
            assert hits_stop(policy.tokenizer, r.token_ids, [CLOSING_FENCE, "3"])
            assert not hits_stop(policy.tokenizer, r.token_ids[:-1], [CLOSING_FENCE, "3"])
