"""GRPO math (Shao et al. 2024, "DeepSeekMath", §4.1): group-relative advantages and the clipped objective, eq. 3,
computed as TRL's GRPOTrainer computes them (trl 1.16: advantages in `_generate_and_score_completions`, the loss in
`_compute_loss`; tests/rl/test_grpo.py checks loss and gradients against it).

    J(θ) = E[ 1/G Σ_i 1/|o_i| Σ_t { min(ρ_it·Â_i, clip(ρ_it, 1−ε, 1+ε)·Â_i) − β_KL·D_KL[πθ‖π_ref] } ]   (eq. 3)

ρ_it = πθ(o_it | q, o_i<t) / π_old(o_it | q, o_i<t), π_old the policy that sampled the group; Â_i = (r_i − mean r) /
std r over the G outputs of one prompt (outcome supervision, §4.1.2); D_KL per token by the unbiased k3 estimator
π_ref/πθ − log(π_ref/πθ) − 1 (eq. 4), weighted by ρ_it as TRL does by default. No value model.

Shapes: B sequences, T padded response positions; `mask` (B, T) bool, each sequence's valid tokens left-aligned.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from spo_lake.rl.ppo_math import clipped_surrogate

SCALE_REWARDS = ("group", "batch", "none")  # TRL's `scale_rewards`
# How per-token losses become the batch loss (TRL's `loss_type`): dapo = Σ_it / Σ_i |o_i| (TRL's default; DAPO, Yu
# et al. 2025), grpo = eq. 3's 1/G Σ_i 1/|o_i| Σ_t, dr_grpo = Σ_it / (G · max_completion_length) (Liu et al. 2025).
LOSS_TYPES = ("dapo", "grpo", "dr_grpo")
STD_EPS = 1e-4  # TRL's: Â = (r − mean) / (std + 1e-4)


class GRPOLossOutput(NamedTuple):
    loss: torch.Tensor  # scalar to backpropagate
    clip_fraction: torch.Tensor  # share of valid tokens whose clipped branch was taken (TRL's clip_ratio/region_mean)
    importance_weight: torch.Tensor  # mean ρ over valid tokens
    kl: torch.Tensor  # mean ρ-weighted k3 estimate of KL[πθ ‖ π_ref] over valid tokens (0 without ref_logprobs)


@torch.no_grad()
def group_advantages(reward: torch.Tensor, group: torch.Tensor, scale: str = "group") -> torch.Tensor:
    """Â_i = (r_i − mean of its group) / (std + 1e-4), (B,) from reward (B,) float and group (B,) ids.

    scale: "group" divides by the group's std, "batch" by the whole batch's, "none" not at all (Dr. GRPO). Stds are
    Bessel-corrected (TRL's nanstd). A group of one sequence has no baseline to compare with: its advantage is 0.
    """
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale {scale!r} not in {SCALE_REWARDS}")
    if reward.shape != group.shape or reward.dim() != 1:
        raise ValueError(f"reward and group must share shape (B,), got {tuple(reward.shape)}, {tuple(group.shape)}")
    reward = reward.float()
    _, inverse = torch.unique(group, return_inverse=True)
    zeros = reward.new_zeros(int(inverse.max()) + 1)
    count = zeros.index_add(0, inverse, torch.ones_like(reward))
    centred = reward - (zeros.index_add(0, inverse, reward) / count)[inverse]
    if scale == "none":
        return centred
    if scale == "group":
        variance = zeros.index_add(0, inverse, centred**2) / (count - 1).clamp(min=1)
        std = torch.where(count > 1, variance.sqrt(), torch.zeros_like(variance))[inverse]
    else:
        std = reward.std() if len(reward) > 1 else reward.new_zeros(())
    return centred / (std + STD_EPS)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logprobs: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    loss_type: str = "dapo",
    max_completion_length: int | None = None,
    total_tokens: int | None = None,
    total_sequences: int | None = None,
) -> GRPOLossOutput:
    """The negated GRPO objective (eq. 3) on a batch, aggregated as `loss_type`.

    logprobs: (B, T) log πθ with gradient; old_logprobs: (B, T) log π_old recorded at sampling time (untempered);
    advantages: (B,) constant (group_advantages); mask: (B, T) bool; ref_logprobs: (B, T) log π_ref, needed when
    kl_coef > 0 (the KL term's coefficient, TRL's `beta`). max_completion_length: dr_grpo's constant.
    total_tokens / total_sequences: the whole batch's valid tokens / sequences when this is one micro-batch of it
    (default: this batch's), so micro-batch losses add up to the batch loss.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type {loss_type!r} not in {LOSS_TYPES}")
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape or advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"logprobs, old_logprobs, mask must be (B, T) and advantages (B,), got {tuple(logprobs.shape)}"
                         f", {tuple(old_logprobs.shape)}, {tuple(mask.shape)}, {tuple(advantages.shape)}")
    if kl_coef and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    if loss_type == "dr_grpo" and not max_completion_length:
        raise ValueError("loss_type 'dr_grpo' needs max_completion_length")
    per_token, clipped = clipped_surrogate(logprobs, old_logprobs, advantages[:, None].to(logprobs.dtype), clip_eps)
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None:
        log_ratio = ref_logprobs - logprobs
        # k3 (unbiased, ≥ 0) times ρ: with the ratio its gradient is the unbiased reverse-KL gradient on π_old's
        # samples (DeepSeek-V3.2; TRL's default `use_bias_correction_kl`)
        kl = (torch.exp(log_ratio) - log_ratio - 1) * torch.exp(logprobs - old_logprobs)
    if kl_coef:
        per_token = per_token + kl_coef * kl
    zero = torch.zeros_like(per_token)
    per_token = torch.where(mask, per_token, zero)  # padding holds garbage log-probs: no value, no gradient
    tokens = total_tokens if total_tokens is not None else int(mask.sum())
    sequences = total_sequences if total_sequences is not None else mask.shape[0]
    if loss_type == "dapo":
        loss = per_token.sum() / max(tokens, 1)
    elif loss_type == "grpo":
        loss = (per_token.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).sum() / max(sequences, 1)
    else:
        assert max_completion_length is not None
        loss = per_token.sum() / (max(sequences, 1) * max_completion_length)
    valid = mask.sum().clamp(min=1)
    with torch.no_grad():
        ratio = torch.where(mask, torch.exp(logprobs - old_logprobs), zero)
        return GRPOLossOutput(loss, (clipped & mask).sum() / valid, ratio.sum() / valid,
                              torch.where(mask, kl, zero).sum() / valid)
