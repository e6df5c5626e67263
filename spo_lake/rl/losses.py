"""SPO losses: the cumulative Q-parameterisation and the off-policy objectives built on it (paper §2–3).

Shapes: B sequences, T padded response positions; `mask` (B, T) bool with each sequence's valid tokens
left-aligned. Q has shape (B, T+1): position p means "after the first p response tokens", so Q[:, 0] = Q̂0.
Rewards are terminal, r ∈ {0, −1} (0 = success); β > 0.

Reduction: a sequence's loss is a *sum* over its terms (one for `terminal`/`advantage`, one per valid token for
`reverse_q`, plus one per valid Monte-Carlo position); the batch loss is the *mean over sequences*. Summing
within a sequence keeps the paper's L = Σ_t L(Q_t, R_t); averaging across sequences keeps the gradient scale
independent of the batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from spo_lake.scores import check_beta, soft_value

OBJECTIVES = ("terminal", "reverse_q", "advantage")
LOSSES = ("squared", "ce")
_LN2 = math.log(2.0)


def sequence_lengths(mask: torch.Tensor) -> torch.Tensor:
    """Number of valid tokens per sequence, (B,) long, from a left-aligned (B, T) bool mask."""
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise ValueError(f"mask must be a 2-D bool tensor (B, T), got {mask.dtype} of shape {tuple(mask.shape)}")
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError("mask must be left-aligned: every sequence's valid tokens first, then padding")
    return mask.sum(dim=1)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − exp(x)) for x < 0, accurate at both ends (Mächler 2012).

    Near 0, 1 − exp(x) cancels, so use log(−expm1(x)); far below, exp(x) is tiny, so use log1p(−exp(x)).
    Each branch sees only inputs where it is finite, so torch.where cannot leak NaN gradients.
    """
    near_zero = x > -_LN2
    return torch.where(
        near_zero,
        torch.log(-torch.expm1(x.clamp(min=-_LN2))),
        torch.log1p(-torch.exp(x.clamp(max=-_LN2))),
    )


def log_prob_cross_entropy(logp: torch.Tensor, target_prob: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Elementwise binary cross-entropy between a predicted log-probability and a target probability (§3.1.1).

    x·relu(−ℓ̂) − (1−x)·log(1 − exp(ℓ̂_c)), with ℓ̂_c = min(ℓ̂, −eps) in the forward pass and an identity
    gradient (straight-through), so ℓ̂ ≥ 0 stays finite yet is still pushed down. relu(−ℓ̂) replaces −ℓ̂ so
    nothing rewards ℓ̂ above 0.
    """
    clipped = logp + (logp.clamp(max=-eps) - logp).detach()
    return target_prob * torch.relu(-logp) - (1.0 - target_prob) * log1mexp(clipped)


def success_target_prob(success_rate: torch.Tensor, beta: float) -> torch.Tensor:
    """Exponentiated Monte-Carlo value target x = E[exp(r/β)] = S + (1−S)·e^{−1/β} (§3.1.3), unbiased in S."""
    return success_rate + (1.0 - success_rate) * math.exp(-1.0 / beta)


def _masked_log_ratio(policy_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log πθ − log π0 on valid tokens, 0 on padding (whatever garbage the padding holds), (B, T)."""
    return torch.where(mask, policy_logprobs - ref_logprobs, torch.zeros_like(policy_logprobs))


def cumulative_q(
    policy_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, q0: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """Cumulative Q-parameterisation Q_t = Q̂0 + Σ_{t'≤t} A_t', A_t = β·(log πθ − log π0) (eqs. 11–12).

    policy_logprobs, ref_logprobs: (B, T) float; q0: (B,); mask: (B, T) bool, left-aligned.
    Returns Q: (B, T+1) with Q[:, 0] = q0; positions past a sequence's end repeat its Q_T.
    """
    advantages = beta * _masked_log_ratio(policy_logprobs, ref_logprobs, mask)
    return torch.cat([q0[:, None], q0[:, None] + advantages.cumsum(dim=1)], dim=1)


def _pointwise_loss(pred, target, beta: float, loss: str, eps: float, target_prob=None) -> torch.Tensor:
    """L(ŷ, y) of §3.1.1, elementwise. CE works on ℓ̂ = ŷ/β against x = exp(min(y, 0)/β) unless x is given."""
    if loss == "squared":
        return (pred - target) ** 2
    if target_prob is None:
        target_prob = torch.exp(target.clamp(max=0.0) / beta)
    return log_prob_cross_entropy(pred / beta, target_prob, eps)


def _mc_loss(q, lengths, mc_positions, mc_success, mc_mask, beta: float, loss: str, eps: float) -> torch.Tensor:
    """Σ over valid Monte-Carlo positions p of L(Q_p, β·log(S + (1−S)·e^{−1/β})) (§3.1.3), (B,)."""
    if not (mc_positions.shape == mc_success.shape == mc_mask.shape) or mc_positions.shape[0] != q.shape[0]:
        raise ValueError(
            f"mc_positions, mc_success and mc_mask must share shape (B, M) with B={q.shape[0]}, got "
            f"{tuple(mc_positions.shape)}, {tuple(mc_success.shape)}, {tuple(mc_mask.shape)}"
        )
    out_of_range = mc_mask & ((mc_positions < 0) | (mc_positions > lengths[:, None]))
    if bool(out_of_range.any()):
        raise ValueError("mc_positions must lie in 0..sequence length where mc_mask is set")
    bad_rate = mc_mask & ~((mc_success >= 0) & (mc_success <= 1))
    if bool(bad_rate.any()):
        raise ValueError("mc_success must lie in [0, 1] where mc_mask is set")
    positions = torch.where(mc_mask, mc_positions, torch.zeros_like(mc_positions))
    success = torch.where(mc_mask, mc_success.to(q.dtype), torch.ones_like(q[:, :1]))
    q_at = q.gather(1, positions)
    terms = _pointwise_loss(
        q_at, soft_value(success, beta), beta, loss, eps, target_prob=success_target_prob(success, beta)
    )
    return torch.where(mc_mask, terms, torch.zeros_like(terms)).sum(dim=1)


@dataclass(frozen=True)
class SPOLossOutput:
    """The loss to backpropagate plus detached diagnostics (all scalars except per_sequence)."""

    loss: torch.Tensor  # mean of per_sequence
    per_sequence: torch.Tensor  # (B,) each sequence's summed loss, for weighting mixed streams
    q_terminal_mean: torch.Tensor  # mean Q_T
    abs_err_mean: torch.Tensor  # mean |Q_T − r|
    advantage_mean: torch.Tensor  # mean A_t over valid tokens
    kl_estimate: torch.Tensor  # mean over sequences of Σ_t (log πθ − log π0)
    guarded: int = 0  # sequences the divergence guard (log_ratio_cap) dropped from the loss


def spo_loss(
    policy_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    reward: torch.Tensor,
    q0: torch.Tensor,
    beta: float,
    *,
    objective: str = "terminal",
    loss: str = "squared",
    mc_positions: torch.Tensor | None = None,
    mc_success: torch.Tensor | None = None,
    mc_mask: torch.Tensor | None = None,
    eps: float = 1e-6,
    advantage_scale: float = 1.0,
    token_weights: torch.Tensor | None = None,
    negative_weight: float = 0.0,
    log_ratio_cap: float = 0.0,
) -> SPOLossOutput:
    """SPO off-policy loss on any trajectories, from any source (§3.1.2), averaged over sequences.

    policy_logprobs, ref_logprobs: (B, T) log πθ(a_t|a_<t,x), log π0(a_t|a_<t,x); padding values are ignored.
    mask: (B, T) bool, left-aligned. reward, q0: (B,). loss ∈ {"squared", "ce"}. objective:
      terminal   L(Q_T, r)                                          (eq. 13)
      reverse_q  Σ_{t=1..T} L(Q_t, R_t), R_t = detach(r − Σ_{t'>t} A_t')
      advantage  BCE(σ(ΣA/(sβ)), σ((r − Q̂0)/(sβ))), sigmoid-warped advantage regression, s = advantage_scale
                 (the paper does not pin the warp's scale; s = 1 makes σ(ΣA/β) the sigmoid of log πθ/π0); loss="ce"
    eps: the CE loss's clip of Q/β (forward ≤ −eps, straight-through gradient).
    Optional Monte-Carlo targets (§3.1.3) add Σ_p L(Q_p, β·log(S + (1−S)·e^{−1/β})) per sequence:
    mc_positions (B, M) long (p = after the first p response tokens), mc_success (B, M) in [0, 1], mc_mask (B, M).
    The log-probs are upcast to at least float32 so long cumulative sums keep their precision.
    Mechanisms (off by default; TrainConfig.mechanisms): token_weights (B, T) scale each token's gradient (LUFFY,
    luffy_token_weights); negative_weight > 0 adds negative_push on sequences with r < 0; log_ratio_cap > 0 drops
    the sequences far_off_policy flags from the loss.

    kl_estimate is the mean sequence log-ratio Σ_t (log πθ − log π0); it estimates KL[πθ, π0] only when the
    sequences were sampled from πθ itself (on-policy), otherwise it is just a drift diagnostic.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown SPO objective {objective!r}; expected one of {OBJECTIVES}")
    if loss not in LOSSES:
        raise ValueError(f"unknown SPO loss {loss!r}; expected one of {LOSSES}")
    if objective == "advantage" and loss != "ce":
        raise ValueError("objective 'advantage' needs loss='ce' (squared advantage regression is terminal regression)")
    check_beta(beta)
    if eps <= 0 or advantage_scale <= 0:
        raise ValueError(f"eps and advantage_scale must be > 0, got {eps}, {advantage_scale}")
    if policy_logprobs.shape != ref_logprobs.shape or policy_logprobs.shape != mask.shape:
        raise ValueError(
            f"policy_logprobs, ref_logprobs and mask must share shape (B, T), got {tuple(policy_logprobs.shape)}, "
            f"{tuple(ref_logprobs.shape)}, {tuple(mask.shape)}"
        )
    batch = policy_logprobs.shape[0]
    if reward.shape != (batch,) or q0.shape != (batch,):
        raise ValueError(f"reward and q0 must have shape ({batch},), got {tuple(reward.shape)}, {tuple(q0.shape)}")
    mc_given = [t is not None for t in (mc_positions, mc_success, mc_mask)]
    if any(mc_given) and not all(mc_given):
        raise ValueError("give all of mc_positions, mc_success and mc_mask, or none")
    if negative_weight < 0 or log_ratio_cap < 0:
        raise ValueError(f"negative_weight and log_ratio_cap must be >= 0, got {negative_weight}, {log_ratio_cap}")
    lengths = sequence_lengths(mask)

    dtype = torch.promote_types(policy_logprobs.dtype, torch.float32)
    policy_logprobs, ref_logprobs = policy_logprobs.to(dtype), ref_logprobs.to(dtype)
    if token_weights is not None:
        policy_logprobs = scale_gradient(policy_logprobs, token_weights.to(dtype))
    reward, q0 = reward.to(dtype), q0.to(dtype)
    log_ratio = _masked_log_ratio(policy_logprobs, ref_logprobs, mask)  # (B, T)
    q = cumulative_q(policy_logprobs, ref_logprobs, q0, mask, beta)  # (B, T+1)
    q_terminal = q[:, -1]

    if objective == "terminal":
        per_sequence = _pointwise_loss(q_terminal, reward, beta, loss, eps)
    elif objective == "reverse_q":
        q_t = q[:, 1:]
        reverse_targets = (q_t + (reward - q_terminal)[:, None]).detach()  # r − Σ_{t'>t} A_t' (eq. 9)
        terms = _pointwise_loss(q_t, reverse_targets, beta, loss, eps)
        per_sequence = torch.where(mask, terms, torch.zeros_like(terms)).sum(dim=1)
    else:
        # σ(ΣA/β) = σ(log πθ/π0) against σ((r − Q̂0)/β) = σ(log π*/π0) on the sequence (s = 1).
        per_sequence = F.binary_cross_entropy_with_logits(
            log_ratio.sum(dim=1) / advantage_scale, torch.sigmoid((reward - q0) / (beta * advantage_scale)),
            reduction="none",
        )
    if mc_positions is not None:
        per_sequence = per_sequence + _mc_loss(q, lengths, mc_positions, mc_success, mc_mask, beta, loss, eps)
    if negative_weight:
        per_sequence = per_sequence + negative_push(log_ratio.sum(dim=1), reward < 0, negative_weight)
    guarded = far_off_policy(log_ratio.sum(dim=1), log_ratio_cap if log_ratio_cap else math.inf)
    per_sequence = torch.where(guarded, torch.zeros_like(per_sequence), per_sequence)

    q_terminal, log_ratio = q_terminal.detach(), log_ratio.detach()
    return SPOLossOutput(
        loss=per_sequence.mean(),
        per_sequence=per_sequence,
        q_terminal_mean=q_terminal.mean(),
        abs_err_mean=(q_terminal - reward).abs().mean(),
        advantage_mean=beta * log_ratio.sum() / lengths.sum().clamp(min=1),
        kl_estimate=log_ratio.sum(dim=1).mean(),
        guarded=int(guarded.sum()),
    )


# ---------------------------------------------------------------------------------------------- mechanisms
# Options for what SPO's terminal target leaves untouched (docs/algorithms.md "Mechanisms"); each is off by default
# (TrainConfig.mechanisms) and measured by bench/spo_mechanisms.py.


def lake_bounded_q0(q0: torch.Tensor, solution_log_mass: torch.Tensor, beta: float) -> torch.Tensor:
    """max(Q̂0, β·log(M + (1−M)·e^{−1/β})) with M = Σ_{y∈K} π0(y) over the lake's distinct correct solutions K.

    V*(x) = β·log E_{π0}[e^{r/β}] ≥ that bound for r ∈ {0, −1} (off-policy notes §1): a prompt π0's few samples
    never solved gets Q̂0 above −1, so a wrong answer's target log-ratio (r − Q̂0)/β turns negative.
    solution_log_mass: log M per sequence, −inf where the lake holds no solution (then Q̂0 is unchanged).
    """
    mass = solution_log_mass.clamp(max=0.0)
    bound = beta * torch.logaddexp(mass, log1mexp(mass.clamp(max=-1e-12)) - 1.0 / beta)
    return torch.where(torch.isfinite(solution_log_mass), torch.maximum(q0, bound), q0)


def negative_push(log_ratio_seq: torch.Tensor, wrong: torch.Tensor, weight: float) -> torch.Tensor:
    """Bounded negative reinforcement on wrong sequences: weight·sg(min(1, e^ℓ))·ℓ, ℓ = Σ_t log πθ/π0, (B,).

    Its gradient is weight·min(1, πθ(y)/π0(y))·∇log πθ(y): NSR's push-down (arXiv 2506.01347) with TOPR's clamp of the
    ratio to [0, 1] (arXiv 2503.14286), so the push fades once πθ(y) falls below π0(y) and the term stays in
    [−weight/e, ∞) instead of driving log πθ(y) to −∞.
    """
    clamped = torch.exp(log_ratio_seq.detach()).clamp(max=1.0)
    return torch.where(wrong, weight * clamped * log_ratio_seq, torch.zeros_like(log_ratio_seq))


def luffy_token_weights(policy_logprobs: torch.Tensor, gamma: float = 0.1) -> torch.Tensor:
    """Per-token gradient weights 4γπ/(π+γ)² ∈ (0, 1], π = πθ(a_t) detached: LUFFY's shaping f(π) = π/(π+γ)
    (arXiv 2504.14945), whose gradient is γπ/(π+γ)²·∇log π, scaled to 1 at its peak π = γ."""
    p = torch.exp(policy_logprobs.detach())
    return 4.0 * gamma * p / (p + gamma) ** 2


def scale_gradient(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x in the forward pass, weight·∇x in the backward pass."""
    return x.detach() + weight * (x - x.detach())


def far_off_policy(log_ratio_seq: torch.Tensor, cap: float) -> torch.Tensor:
    """Sequences whose |Σ_t log πθ/π0| exceeds `cap` nats, (B,) bool: a divergence guard drops them from the loss.

    SPO's targets ask for at most 1/β ≈ 11.5 nats up (r − Q̂0 ≤ 1 for r ∈ {0, −1}); a diverging run's samples sat
    at hundreds of nats (docs/results-skill-gap.md), where each wrong one's CE gradient is ~1/ce_eps per token."""
    return log_ratio_seq.detach().abs() > cap
