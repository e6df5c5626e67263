"""PPO baseline math: KL-penalised rewards, GAE against a hand loop, the clipped policy loss at hand-made ratios,
the value loss."""

import math

import pytest
import torch

from spo_lake.rl.ppo_math import gae, kl_penalized_rewards, ppo_policy_loss, value_loss, whiten

MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_kl_penalized_rewards_hand_values():
    old = torch.tensor([[-0.1, -0.5, -0.2], [-1.0, -0.2, 9.0]])
    ref = torch.tensor([[-0.3, -0.4, -0.6], [-0.5, -0.7, 9.0]])
    rewards = kl_penalized_rewards(torch.tensor([0.0, -1.0]), old, ref, MASK, beta=0.5)
    # −β(old − ref) per token; r added at the last valid token (index 2 and 1); padding 0
    expected = torch.tensor([[-0.1, 0.05, -0.2 + 0.0], [0.25, -0.25 - 1.0, 0.0]])
    torch.testing.assert_close(rewards, expected)


def test_kl_penalized_rewards_rejects_empty_sequences():
    mask = torch.tensor([[True, False], [False, False]])
    with pytest.raises(ValueError, match="at least one valid token"):
        kl_penalized_rewards(torch.zeros(2), torch.zeros(2, 2), torch.zeros(2, 2), mask, beta=0.1)


def gae_by_hand(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """Textbook GAE for one unpadded episode: A_t = Σ_l (γλ)^l δ_{t+l}, V after the end = 0."""
    n = len(rewards)
    deltas = [rewards[t] + gamma * (values[t + 1] if t + 1 < n else 0.0) - values[t] for t in range(n)]
    return [sum((gamma * lam) ** (u - t) * deltas[u] for u in range(t, n)) for t in range(n)]


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0)])
def test_gae_matches_the_hand_loop(gamma, lam):
    g = torch.Generator().manual_seed(0)
    lengths = [6, 3, 1, 5]
    mask = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]
    rewards = torch.randn(4, 6, generator=g, dtype=torch.float64)
    values = torch.randn(4, 6, generator=g, dtype=torch.float64)
    advantages, returns = gae(rewards, values, mask, gamma=gamma, lam=lam)
    for i, n in enumerate(lengths):
        expected = gae_by_hand(rewards[i, :n].tolist(), values[i, :n].tolist(), gamma, lam)
        assert advantages[i, :n].tolist() == pytest.approx(expected)
        assert returns[i, :n].tolist() == pytest.approx([a + v for a, v in zip(expected, values[i, :n].tolist())])
        assert (advantages[i, n:] == 0).all() and (returns[i, n:] == 0).all()


def test_gae_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.1, -0.2, -1.0]])
    values = torch.tensor([[0.5, 0.3, -0.4]])
    advantages, returns = gae(rewards, values, torch.ones(1, 3, dtype=torch.bool), gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor([[-1.1, -1.2, -1.0]]))
    torch.testing.assert_close(advantages, torch.tensor([[-1.6, -1.5, -0.6]]))


def test_policy_loss_at_hand_made_ratios():
    # ratios 1.5, 1.5, 0.5, 0.5 against advantages +1, −1, +1, −1 (ε = 0.2); last column is padding
    ratios = torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.0]], dtype=torch.float64)
    old = torch.full((1, 5), -1.0, dtype=torch.float64)
    logprobs = (old + ratios.log()).requires_grad_(True)
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, False]])
    out = ppo_policy_loss(logprobs, old, advantages, mask, clip_eps=0.2)
    # per token max(−Aρ, −A·clip(ρ)): max(−1.5, −1.2) = −1.2 (clipped), max(1.5, 1.2) = 1.5,
    # max(−0.5, −0.8) = −0.5, max(0.5, 0.8) = 0.8 (clipped)
    assert out.loss.item() == pytest.approx((-1.2 + 1.5 - 0.5 + 0.8) / 4)
    assert out.clip_fraction.item() == pytest.approx(0.5)
    out.loss.backward()
    # unclipped tokens: d(−Aρ)/d log π = −Aρ; clipped tokens and padding: 0
    expected = torch.tensor([[0.0, 1.5, -0.5, 0.0, 0.0]], dtype=torch.float64) / 4
    torch.testing.assert_close(logprobs.grad, expected)


def test_policy_loss_on_policy_is_minus_mean_advantage():
    logprobs = torch.tensor([[-0.3, -2.0]], requires_grad=True)
    advantages = torch.tensor([[0.4, -1.0]])
    out = ppo_policy_loss(logprobs, logprobs.detach(), advantages, torch.ones(1, 2, dtype=torch.bool))
    assert out.loss.item() == pytest.approx(0.3)
    assert out.clip_fraction.item() == 0.0


def test_value_loss_at_hand_made_values():
    values = torch.tensor([[0.5, 0.5, 0.1, 0.3]], requires_grad=True)
    returns = torch.tensor([[1.0, -1.0, 1.0, 0.0]])
    loss = value_loss(values, returns, torch.tensor([[True, True, True, False]]))
    # ½·(V − R)² over the three valid tokens: 0.25, 2.25, 0.81; padding ignored
    assert loss.item() == pytest.approx(0.5 * (0.25 + 2.25 + 0.81) / 3)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[-0.5 / 3, 1.5 / 3, -0.9 / 3, 0.0]]))


def test_whiten_normalises_valid_entries_and_ignores_padding():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 1e6]])
    out = whiten(x, MASK)
    valid = out[MASK]
    assert valid.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert valid.pow(2).mean().item() == pytest.approx(1.0, rel=1e-5)
    assert out[1, 2].item() == 0.0
    expected = (torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]) - 3.0) / math.sqrt(2.0)
    torch.testing.assert_close(valid, expected)
    unshifted = whiten(x, MASK, shift_mean=False)
    torch.testing.assert_close(unshifted[MASK], expected + 3.0)


def test_right_aligned_masks_are_rejected():
    mask = torch.tensor([[False, True]])
    with pytest.raises(ValueError, match="left-aligned"):
        gae(torch.zeros(1, 2), torch.zeros(1, 2), mask)
