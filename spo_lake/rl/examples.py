"""Training sequences, whatever their source (a lake stream, an online rollout), and the padded tensors a batch of
them becomes: what the data side (spo_lake.rl.data, spo_lake.rl.rollout) produces and the losses consume.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Example:
    """One training sequence, whatever its source."""

    stream: int  # index of the stream it came from
    prompt_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    reward: float
    q0: float  # Q̂0 of the prompt at the run's β; nan when the prompt has no Q0 counts (PPO needs none)
    ref_logprobs: list[float] | None = None  # cached log π0 of response_ids; None = score with the live π0
    behavior_logprobs: list[float] | None = None  # log-probs of the distribution the response was sampled from
    # log π_old: the sampling policy's own log-probs (no temperature, no top-p), PPO's ratio and KL reward
    policy_logprobs: list[float] | None = None
    policy_version: int = -1  # behaviour-policy version of an online rollout; -1 for lake data
    group: int = -1  # GRPO: the step's online group (one prompt's samples, and lake rows injected into it)
    mc_positions: list[int] = field(default_factory=list)  # Monte-Carlo targets: after the first p tokens ...
    mc_success: list[float] = field(default_factory=list)  # ... π0 succeeds with this probability
    trajectory_id: str | None = None


@dataclass
class Batch:
    """Padded tensors of a list of examples. Prompts are left-padded and responses right-padded, so every
    response starts at column P: the logits of the last T+1 positions score all responses at once.

    input_ids, attention_mask: (B, P+T). response_ids: (B, T); response_mask: (B, T) bool, left-aligned.
    ref_logprobs, behavior_logprobs, policy_logprobs: (B, T), valid where ref_cached / has_behavior /
    has_policy (B,) is set.
    reward, q0: (B,). mc_positions, mc_success, mc_mask: (B, M). stream, policy_version: (B,) long.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    ref_logprobs: torch.Tensor
    ref_cached: torch.Tensor
    behavior_logprobs: torch.Tensor
    has_behavior: torch.Tensor
    policy_logprobs: torch.Tensor
    has_policy: torch.Tensor
    reward: torch.Tensor
    q0: torch.Tensor
    mc_positions: torch.Tensor
    mc_success: torch.Tensor
    mc_mask: torch.Tensor
    stream: torch.Tensor
    policy_version: torch.Tensor

    def to(self, device: torch.device | str) -> Batch:
        return Batch(**{name: value.to(device) for name, value in vars(self).items()})

    def rows(self, index: torch.Tensor) -> Batch:
        """The sub-batch of the given rows (same padding)."""
        return Batch(**{name: value[index] for name, value in vars(self).items()})

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())


def _padded(rows: Sequence[Sequence[float] | None], width: int, value: float, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def collate(examples: Sequence[Example], pad_id: int) -> Batch:
    """Pad a list of examples into a Batch (pure: no model, no lake)."""
    if not examples:
        raise ValueError("collate: no examples")
    prompt_width = max(len(e.prompt_ids) for e in examples)
    width = max(max(len(e.response_ids) for e in examples), 1)
    input_ids = torch.full((len(examples), prompt_width + width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, e in enumerate(examples):
        start = prompt_width - len(e.prompt_ids)
        ids = e.prompt_ids + e.response_ids
        input_ids[i, start : start + len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, start : start + len(ids)] = 1
    lengths = torch.tensor([len(e.response_ids) for e in examples])
    mc_width = max(1, max(len(e.mc_positions) for e in examples))
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_ids=_padded([e.response_ids for e in examples], width, pad_id, torch.long),
        response_mask=torch.arange(width)[None, :] < lengths[:, None],
        ref_logprobs=_padded([e.ref_logprobs for e in examples], width, 0.0, torch.float32),
        ref_cached=torch.tensor([e.ref_logprobs is not None for e in examples]),
        behavior_logprobs=_padded([e.behavior_logprobs for e in examples], width, 0.0, torch.float32),
        has_behavior=torch.tensor([e.behavior_logprobs is not None for e in examples]),
        policy_logprobs=_padded([e.policy_logprobs for e in examples], width, 0.0, torch.float32),
        has_policy=torch.tensor([e.policy_logprobs is not None for e in examples]),
        reward=torch.tensor([e.reward for e in examples], dtype=torch.float32),
        q0=torch.tensor([e.q0 for e in examples], dtype=torch.float32),
        mc_positions=_padded([e.mc_positions for e in examples], mc_width, 0, torch.long),
        mc_success=_padded([e.mc_success for e in examples], mc_width, 1.0, torch.float32),
        mc_mask=torch.arange(mc_width)[None, :] < torch.tensor([len(e.mc_positions) for e in examples])[:, None],
        stream=torch.tensor([e.stream for e in examples], dtype=torch.long),
        policy_version=torch.tensor([e.policy_version for e in examples], dtype=torch.long),
    )
