"""Pure tensor math for sampling and scoring: tensors in, tensors out."""
from __future__ import annotations

import torch


def sampling_log_probs(logits: torch.Tensor, temperature: float | torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probabilities of the distribution actually sampled from.

    logits: [B, V] -> [B, V]. Temperature (one, or a [B, 1] column: one per row) scales the logits; top-p keeps the
    smallest set of most likely tokens whose mass reaches top_p (always at least one) and renormalises over it;
    tokens outside the nucleus get -inf. temperature == 0 means greedy: a point mass on the argmax (log-prob 0).
    """
    logits = logits.float()
    if isinstance(temperature, torch.Tensor):  # rows at temperature 0 are greedy
        cold = temperature == 0
        tempered = sampling_log_probs(logits / temperature.masked_fill(cold, 1.0), 1.0, top_p)
        return torch.where(cold, _greedy(logits), tempered) if bool(cold.any()) else tempered
    if temperature == 0:
        return _greedy(logits)
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    if top_p >= 1.0:
        return log_probs
    sorted_log_probs, order = log_probs.sort(dim=-1, descending=True)
    mass_before = sorted_log_probs.exp().cumsum(dim=-1) - sorted_log_probs.exp()
    drop_sorted = mass_before >= top_p  # the first token always has mass_before 0, so it stays
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return torch.log_softmax(log_probs.masked_fill(drop, float("-inf")), dim=-1)


def _greedy(logits: torch.Tensor) -> torch.Tensor:
    return torch.full_like(logits, float("-inf")).scatter_(-1, logits.argmax(-1, keepdim=True), 0.0)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count only real tokens, so padding on either side does not shift them.

    attention_mask: [B, L] of 0/1 -> [B, L]; padding positions get 0 (their outputs are ignored)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


# Scratch per chunk of positions, in elements (float32: 64 MiB), whatever the vocabulary.
LOGIT_CHUNK_ELEMENTS = 2**24


def gather_token_log_probs(logits: torch.Tensor, targets: torch.Tensor,
                           chunk_elements: int = LOGIT_CHUNK_ELEMENTS) -> torch.Tensor:
    """log softmax(logits)[target] per position, in float32. logits: [..., V], targets: [...] -> [...].

    = logit[target] − logsumexp(logits), computed over chunks of positions: each chunk is upcast to float32, reduced
    and dropped, so neither a float32 copy nor a log-softmax of the [B, T, V] logits ever exists (gigabytes at a
    real model's 150k vocabulary). The backward pass recomputes each chunk's softmax the same way.
    """
    vocab = logits.shape[-1]
    # A view for the shapes callers pass ([B, T, V], a [B, V] or [T, V] slice): no copy of the logits.
    grid = logits.reshape(-1, logits.shape[-2] if logits.dim() >= 2 else 1, vocab)
    out = _TokenLogProbs.apply(grid, targets.reshape(grid.shape[:2]), max(1, chunk_elements // vocab))
    return out.reshape(targets.shape)


def _chunks(rows: int, width: int, positions: int) -> list[tuple[slice, slice]]:
    """(row, column) slices of a [rows, width] grid with about `positions` positions each."""
    if positions >= width:
        step = positions // width
        return [(slice(r, r + step), slice(None)) for r in range(0, rows, step)]
    return [(slice(r, r + 1), slice(c, c + positions)) for r in range(rows) for c in range(0, width, positions)]


class _TokenLogProbs(torch.autograd.Function):
    """Chunked selective log-softmax over [B, T, V] logits; saves only the logits (which exist anyway) and one
    float32 logsumexp per position for the backward pass."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, positions: int) -> torch.Tensor:
        out = torch.empty(targets.shape, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for index in _chunks(targets.shape[0], targets.shape[1], positions):
            chunk = logits[index].float()
            lse[index] = torch.logsumexp(chunk, dim=-1)
            out[index] = chunk.gather(-1, targets[index].unsqueeze(-1)).squeeze(-1) - lse[index]
        ctx.save_for_backward(logits, targets, lse)
        ctx.positions = positions
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, targets, lse = ctx.saved_tensors
        grad_logits = torch.empty_like(logits, memory_format=torch.contiguous_format)
        for index in _chunks(targets.shape[0], targets.shape[1], ctx.positions):
            g = grad[index].unsqueeze(-1)
            # d/dlogits (logit[target] − logsumexp) = onehot(target) − softmax
            chunk = (logits[index].float() - lse[index].unsqueeze(-1)).exp_().mul_(-g)
            grad_logits[index] = chunk.scatter_add_(-1, targets[index].unsqueeze(-1), g)
        return grad_logits, None, None
