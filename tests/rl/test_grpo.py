"""GRPO's math: the loss and its gradients equal TRL's GRPOTrainer loss on the same batch; group advantages."""
from __future__ import annotations

import datasets
import pytest
import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer

from spo_lake.rl.examples import Example, collate
from spo_lake.rl.grpo_math import STD_EPS, group_advantages, grpo_loss
from spo_lake.rl.scoring import response_log_probs

MAX_COMPLETION = 10


def fixed_batch(vocab: int, pad_id: int) -> tuple[list[Example], torch.Tensor]:
    """Two groups of three completions (ragged lengths) of two equal-length prompts, with rewards of both kinds.
    Equal prompt lengths: TRL does not pass position ids, so left-padded prompts would be positioned differently."""
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    prompts = [ids(7), ids(7)]
    lengths, rewards = [4, 9, 6, 10, 3, 7], [0.0, -1.0, -1.0, 0.0, 0.0, -1.0]
    examples = [Example(stream=0, prompt_id=f"p{i // 3}", prompt_ids=prompts[i // 3], response_ids=ids(n),
                        reward=r, q0=0.0, group=i // 3) for i, (n, r) in enumerate(zip(lengths, rewards))]
    return examples, torch.tensor(rewards)


# TRL's default (dapo) with and without the KL term, and the other aggregations with it (each case builds a trainer)
@pytest.mark.parametrize("loss_type, beta", [("dapo", 0.0), ("dapo", 0.04), ("grpo", 0.04), ("dr_grpo", 0.04)])
def test_grpo_loss_and_gradients_equal_trls_grpo_trainer(fast_model_dir, tmp_path, loss_type, beta):
    tokenizer = AutoTokenizer.from_pretrained(fast_model_dir)
    theirs_model = AutoModelForCausalLM.from_pretrained(fast_model_dir)
    ours_model = AutoModelForCausalLM.from_pretrained(fast_model_dir)  # the same weights, unpatched by TRL
    args = trl.GRPOConfig(output_dir=str(tmp_path), num_generations=3, per_device_train_batch_size=3,
                          max_completion_length=MAX_COMPLETION, beta=beta, loss_type=loss_type, use_cpu=True,
                          bf16=False,  # float32 like our CPU trainer (TRL defaults to bf16 autocast)
                          report_to=[], save_strategy="no", disable_tqdm=True)
    assert (args.epsilon, args.scale_rewards, args.temperature) == (0.2, "group", 1.0)  # the defaults we match
    trainer = trl.GRPOTrainer(model=theirs_model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                              args=args, train_dataset=datasets.Dataset.from_list([{"prompt": "1 2"}] * 6),
                              processing_class=tokenizer)
    examples, rewards = fixed_batch(len(tokenizer), tokenizer.pad_token_id)
    batch = collate(examples, tokenizer.pad_token_id)
    for model in (trainer.model, ours_model):
        model.eval()  # no dropout; TRL's "eval" mode also skips its gradient-accumulation divisor
    logprobs = response_log_probs(ours_model, batch)
    # π_old and π_ref a little away from πθ, so that some ratios leave [0.8, 1.2] and the KL term is not 0
    g = torch.Generator().manual_seed(1)
    old = (logprobs.detach() + 0.4 * torch.randn(logprobs.shape, generator=g)) * batch.response_mask
    ref = (logprobs.detach() + 0.3 * torch.randn(logprobs.shape, generator=g)) * batch.response_mask
    advantages = group_advantages(rewards, torch.tensor([e.group for e in examples]))

    prompt_width = batch.input_ids.shape[1] - batch.response_ids.shape[1]
    inputs = {"prompt_ids": batch.input_ids[:, :prompt_width], "prompt_mask": batch.attention_mask[:, :prompt_width],
              "completion_ids": batch.response_ids, "completion_mask": batch.response_mask.long(),
              "advantages": advantages, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": batch.response_mask.sum()}
    theirs = trainer._compute_loss(trainer.model, inputs)
    theirs.backward()
    ours = grpo_loss(logprobs, old, advantages, batch.response_mask, ref_logprobs=ref, kl_coef=beta,
                     loss_type=loss_type, max_completion_length=MAX_COMPLETION)
    ours.loss.backward()

    assert ours.loss.item() == pytest.approx(theirs.item(), abs=1e-6)
    assert 0 < ours.clip_fraction.item() < 1  # the clipped branch is exercised
    assert ours.clip_fraction.item() == pytest.approx(trainer._metrics["eval"]["clip_ratio/region_mean"][-1], abs=1e-6)
    if beta:
        assert ours.kl.item() == pytest.approx(trainer._metrics["eval"]["kl"][-1], abs=1e-6)
    pairs = list(zip(theirs_model.named_parameters(), ours_model.named_parameters()))
    assert all(a.grad is not None for (_, a), _ in pairs)
    for (name, a), (_, b) in pairs:
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_group_advantages_are_group_relative_and_scaled_by_the_group_std():
    reward = torch.tensor([0.0, -1.0, -1.0, -1.0, 0.0, 0.0, -1.0])
    group = torch.tensor([5, 5, 5, 5, 2, 2, 9])
    out = group_advantages(reward, group)
    std = torch.tensor([0.0, -1.0, -1.0, -1.0]).std()  # Bessel-corrected, as TRL's nanstd: 0.5
    assert std.item() == pytest.approx(0.5)
    expected = [0.75 / (0.5 + STD_EPS), -0.25 / (0.5 + STD_EPS), -0.25 / (0.5 + STD_EPS), -0.25 / (0.5 + STD_EPS),
                0.0, 0.0, 0.0]  # a group without spread (2) or of one sequence (9) carries no signal
    assert out.tolist() == pytest.approx(expected)
    assert group_advantages(reward, group, "none").tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0, 0, 0])
    batch_std = reward.std().item()
    assert group_advantages(reward, group, "batch")[0].item() == pytest.approx(0.75 / (batch_std + STD_EPS))
    with pytest.raises(ValueError, match="scale"):
        group_advantages(reward, group, "rank")


def test_micro_batches_add_up_to_the_batch_loss():
    g = torch.Generator().manual_seed(0)
    logprobs = torch.randn(6, 5, generator=g, requires_grad=True)
    old, ref = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    mask = torch.arange(5)[None, :] < torch.tensor([5, 2, 3, 1, 4, 5])[:, None]
    advantages = torch.randn(6, generator=g)
    for loss_type in ("dapo", "grpo", "dr_grpo"):
        settings = dict(kl_coef=0.1, loss_type=loss_type, max_completion_length=5)
        whole = grpo_loss(logprobs, old, advantages, mask, ref_logprobs=ref, **settings).loss
        totals = dict(total_tokens=int(mask.sum()), total_sequences=6)
        parts = [grpo_loss(logprobs[s], old[s], advantages[s], mask[s], ref_logprobs=ref[s], **settings, **totals).loss
                 for s in (slice(0, 2), slice(2, 6))]
        assert (parts[0] + parts[1]).item() == pytest.approx(whole.item(), rel=1e-6)
