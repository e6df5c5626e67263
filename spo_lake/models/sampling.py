"""Pure tensor math for sampling and scoring: tensors in, tensors out."""
from __future__ import annotations

import torch


def sampling_log_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probabilities of the distribution actually sampled from.

    logits: [B, V] -> [B, V]. Temperature scales the logits; top-p keeps the smallest set of most likely
    tokens whose mass reaches top_p (always at least one) and renormalises over it; tokens outside the
    nucleus get -inf. temperature == 0 means greedy: a point mass on the argmax (log-prob 0).
    """
    logits = logits.float()
    if temperature == 0:
        greedy = torch.full_like(logits, float("-inf"))
        return greedy.scatter_(-1, logits.argmax(-1, keepdim=True), 0.0)
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    if top_p >= 1.0:
        return log_probs
    sorted_log_probs, order = log_probs.sort(dim=-1, descending=True)
    mass_before = sorted_log_probs.exp().cumsum(dim=-1) - sorted_log_probs.exp()
    drop_sorted = mass_before >= top_p  # the first token always has mass_before 0, so it stays
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return torch.log_softmax(log_probs.masked_fill(drop, float("-inf")), dim=-1)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count only real tokens, so padding on either side does not shift them.

    attention_mask: [B, L] of 0/1 -> [B, L]; padding positions get 0 (their outputs are ignored)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def gather_token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] per position, in float32. logits: [..., V], targets: [...] -> [...]."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
