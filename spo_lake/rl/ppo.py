"""The PPO baseline (paper §3.1.4): a separate value model and the per-batch PPO loss on online rollouts.

Same β as SPO (KL-regularised per-token reward), GAE(γ, λ), clipped surrogate whose ratio πθ/π_old is also the
importance weight of slightly stale rollouts, squared-error value loss. π_old is the sampling policy's *own*
distribution (temperature 1, no top-p), recorded at sampling time next to the tempered sampled-from log-probs: with
the tempered ones a fresh policy would already look off-policy (ratio ≠ 1, clipped tokens) at zero staleness.
One update per batch, as in the paper's asynchronous setup.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoModel

from spo_lake.models.sampling import positions_from_mask
from spo_lake.rl.examples import Batch
from spo_lake.rl.ppo_math import gae, kl_penalized_rewards, masked_mean, ppo_policy_loss, value_loss, whiten


class ValueModel(torch.nn.Module):
    """A copy of the policy's backbone with a scalar head: V of the state in which each response token is chosen."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)  # V starts at 0: the first advantages are the rewards themselves
        torch.nn.init.zeros_(self.head.bias)

    @classmethod
    def from_pretrained(cls, path: str, dtype: torch.dtype, device: torch.device | str) -> ValueModel:
        backbone = AutoModel.from_pretrained(path, dtype=dtype, use_safetensors=True, trust_remote_code=False)
        return cls(backbone, backbone.config.hidden_size).to(device=device, dtype=dtype)

    def forward(self, batch: Batch) -> torch.Tensor:
        """(B, T) float32 values; column t is the state after the prompt and the first t response tokens."""
        width = batch.response_ids.shape[1]
        hidden = self.backbone(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask,
            position_ids=positions_from_mask(batch.attention_mask), use_cache=False,
        ).last_hidden_state[:, -(width + 1) : -1]
        return self.head(hidden).squeeze(-1).float()


@dataclass(frozen=True)
class PPOSettings:
    beta: float
    gamma: float = 1.0
    lam: float = 0.95
    clip_eps: float = 0.2
    value_coef: float = 0.5


def ppo_loss(policy_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, values: torch.Tensor, batch: Batch,
             settings: PPOSettings) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy + value loss of one batch of rollouts and its diagnostics. All per-token inputs (B, T)."""
    mask = batch.response_mask
    if not bool(batch.has_policy.all()):
        raise ValueError("PPO needs the sampling policy's log-probs on every sequence (online rollouts only)")
    old_logprobs = batch.policy_logprobs
    rewards = kl_penalized_rewards(batch.reward, old_logprobs, ref_logprobs, mask, settings.beta)
    advantages, returns = gae(rewards, values.detach(), mask, settings.gamma, settings.lam)
    policy = ppo_policy_loss(policy_logprobs, old_logprobs, whiten(advantages, mask), mask, settings.clip_eps)
    value = value_loss(values, returns, mask)
    log_ratio = torch.where(mask, policy_logprobs - ref_logprobs, torch.zeros_like(policy_logprobs)).detach()
    stats = {
        "policy_loss": policy.loss.item(), "value_loss": value.item(),
        "clip_fraction": policy.clip_fraction.item(),
        "value_mean": masked_mean(values.detach(), mask).item(), "kl": log_ratio.sum(dim=1).mean().item(),
        "importance_weight": masked_mean(torch.exp(policy_logprobs.detach() - old_logprobs), mask).item(),
    }
    return policy.loss + settings.value_coef * value, stats
