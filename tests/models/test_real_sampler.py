"""The sampler on SmolLM2-135M-Instruct (a real tokenizer, chat template and 49k vocabulary): recorded log-probs
against the trainer's recomputation, the same tokens for the same seed, continuous batching that returns each request
once with its own prompt, and pyfunc answers that stop at their closing code fence. A few short samples each."""
import pytest
import torch

from spo_lake.models.backend import TransformersPolicy
from spo_lake.models.decode import CLOSING_FENCE, hits_stop
from spo_lake.rl.examples import Example, collate
from spo_lake.rl.scoring import response_log_probs
from spo_lake.tasks.extract import extract_code
from spo_lake.tasks.pyfunc import load

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


@pytest.fixture(scope="module")
def policy(smollm2_dir) -> TransformersPolicy:
    return TransformersPolicy.from_pretrained(str(smollm2_dir), batch_size=2)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    records, _ = load(n=3, seed=0)
    return [r["prompt"] for r in records]


def test_recorded_log_probs_equal_the_trainers_and_a_seed_repeats_its_tokens(policy, prompts):
    results = policy.sample(prompts, n=2, max_new_tokens=10, seed=7)
    again = policy.sample(prompts, n=2, max_new_tokens=10, seed=7)
    assert [r.token_ids for r in results] == [r.token_ids for r in again]
    batch = collate([Example(0, str(r.prompt_index), policy.encode_prompt(prompts[r.prompt_index]), r.token_ids,
                             0.0, 0.0) for r in results], policy.pad_id)
    with torch.no_grad():
        pi_old = response_log_probs(policy.model, batch)
    worst = max((pi_old[row, : len(r.token_ids)] - torch.tensor(r.policy_logprobs)).abs().max().item()
                for row, r in enumerate(results))
    assert worst <= 1e-4, worst  # float32 (policy.precision): batch shapes differ, the values may not
    assert all(r.logprobs == r.policy_logprobs for r in results)  # temperature 1, top-p 1: the model's own


def test_continuous_batching_returns_each_request_once_with_its_own_prompt(policy, prompts):
    # 3 prompts × 2 through 2 slots, some ending early at a stop string: slots are refilled
    together = policy.sample(prompts, n=2, max_new_tokens=8, stop=["def"], seed=3)
    assert [r.prompt_index for r in together] == [0, 0, 1, 1, 2, 2]
    policy.batch_size = 1
    try:
        alone = policy.sample(prompts, n=2, max_new_tokens=8, stop=["def"], seed=3)
    finally:
        policy.batch_size = 2
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]


def test_a_pyfunc_answer_stops_at_its_closing_fence(policy, prompts):
    results = policy.sample(prompts[:1], n=2, temperature=0.3, max_new_tokens=120, stop=[CLOSING_FENCE], seed=0)
    fenced = [r for r in results if r.finish_reason == "stop" and r.token_ids[-1] != policy.tokenizer.eos_token_id]
    assert fenced, [r.text for r in results]  # at temperature 0.3 SmolLM2 writes its function in a fenced block
    for r in fenced:
        assert r.text == policy.tokenizer.decode(r.token_ids, skip_special_tokens=True)
        assert extract_code(r.text).method.startswith("fence") and r.text.rstrip().endswith("```")
        assert not hits_stop(policy.tokenizer, r.token_ids[:-1], [CLOSING_FENCE])
