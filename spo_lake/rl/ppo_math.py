"""PPO baseline math (paper §3.1.4): KL-regularised per-token rewards, GAE, clipped surrogate and value losses.

Shapes: B sequences, T padded response positions; `mask` (B, T) bool with valid tokens left-aligned.
values[:, t] is V of the state in which token t is chosen; rewards[:, t] arrives after token t.
Token-level losses are averaged over all valid tokens of the batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from spo_lake.rl.losses import sequence_lengths


class ClippedLossOutput(NamedTuple):
    loss: torch.Tensor  # scalar, mean over valid tokens
    clip_fraction: torch.Tensor  # scalar, share of valid tokens whose clipped branch was taken


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over the True entries of mask (0 when there are none)."""
    return torch.where(mask, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1)


def kl_penalized_rewards(
    reward: torch.Tensor,
    policy_logprobs_old: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """Per-token rewards of the KL-regularised objective E[r] − β·KL[π, π0] (eq. 1), (B, T).

    Each valid token gets −β·(log π_old − log π0) (the per-token KL sample under the behaviour policy);
    the terminal reward r (B,) is added at each sequence's last valid token. Padding gets 0.
    """
    lengths = sequence_lengths(mask)
    if bool((lengths == 0).any()):
        raise ValueError("kl_penalized_rewards: every sequence needs at least one valid token to carry its reward")
    kl_penalty = -beta * (policy_logprobs_old - ref_logprobs)
    rewards = torch.where(mask, kl_penalty, torch.zeros_like(kl_penalty))
    return rewards.scatter_add(1, (lengths - 1)[:, None], reward.to(rewards.dtype)[:, None])


@torch.no_grad()
def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016); returns (advantages, returns), (B, T) each.

    δ_t = r_t + γ·V_{t+1} − V_t and A_t = δ_t + γλ·A_{t+1}, with V = 0 after the last valid token (the
    episode ends there). returns = A + V are the value targets. Both are constants (no gradient); padding is 0.
    """
    sequence_lengths(mask)  # validates left alignment: the bootstrap-at-end rule relies on it
    zeros = torch.zeros_like(values)
    values, rewards = torch.where(mask, values, zeros), torch.where(mask, rewards, zeros)
    next_value = next_advantage = torch.zeros_like(values[:, 0])
    steps = []
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = torch.where(mask[:, t], delta + gamma * lam * next_advantage, torch.zeros_like(delta))
        steps.append(advantage)
        next_value, next_advantage = values[:, t], advantage
    advantages = torch.stack(steps[::-1], dim=1)
    return advantages, advantages + values


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise x to zero mean, unit variance over the valid entries (population variance); padding is 0."""
    mean = masked_mean(x, mask)
    variance = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(variance + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, torch.zeros_like(out))


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
) -> ClippedLossOutput:
    """Clipped surrogate max(−A·ρ, −A·clip(ρ, 1−ε, 1+ε)), ρ = πθ/π_old per token (Schulman et al. 2017).

    ρ is also the per-token importance weight that corrects slightly stale rollouts (old_logprobs are the
    behaviour policy's log-probs recorded at sampling time), §3.1.4. All inputs (B, T); advantages constant.
    """
    per_token, clipped = clipped_surrogate(logprobs, old_logprobs, advantages, clip_eps)
    loss = masked_mean(per_token, mask)
    return ClippedLossOutput(loss, masked_mean(clipped.to(loss.dtype), mask))


def clipped_surrogate(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token −min(ρ·A, clip(ρ, 1−ε, 1+ε)·A), ρ = exp(logprobs − old_logprobs), and (bool, no gradient) where
    the clipped branch was taken. advantages broadcast against the (B, T) log-probs; padding is not masked here."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).detach()


def value_loss(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """½·(V − R)² averaged over valid tokens, inputs (B, T). Unclipped: with one update per batch the values a
    PPO value clip would hold V near are V itself (the clipped and unclipped losses are the same function)."""
    return 0.5 * masked_mean((values - returns) ** 2, mask)
