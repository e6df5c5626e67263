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


# Candidates for top-p: the nucleus is looked for among the most likely tokens first, and only a row whose nucleus
# does not close inside them sorts its whole vocabulary (a full sort of [64, 49152] logits takes ~100 ms on 2 cores).
NUCLEUS_CANDIDATES = 512


def draw_tokens(logits: torch.Tensor, temperature: float | torch.Tensor, top_p: float,
                uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [B], its log-prob under the sampled-from distribution [B]) for logits [B, V]: the distribution of
    `sampling_log_probs`, drawn by inverting its CDF at `uniform` [B] (one draw from U[0, 1) per row).

    Same distribution as `torch.multinomial(sampling_log_probs(...).exp())` (up to float32 rounding of the CDF, and
    which of exactly tied logits counts as inside the nucleus), at a fraction of the cost: multinomial over a
    49k vocabulary takes ~60 ms per step at batch 64 on 2 cores, a cumsum and a binary search ~3 ms. The caller owns
    the randomness: one uniform per row and token, whatever the settings (greedy rows ignore theirs).
    """
    logits = logits.float()
    if isinstance(temperature, torch.Tensor):  # a column: rows at temperature 0 are greedy
        cold = (temperature == 0).squeeze(-1)
        tokens, chosen = _draw(logits / temperature.masked_fill(temperature == 0, 1.0), uniform, top_p)
        if bool(cold.any()):
            tokens = torch.where(cold, logits.argmax(-1), tokens)
            chosen = chosen.masked_fill(cold, 0.0)
        return tokens, chosen
    if temperature == 0:
        return logits.argmax(-1), logits.new_zeros(logits.shape[0])
    return _draw(logits if temperature == 1 else logits / temperature, uniform, top_p)


def _draw(scaled: torch.Tensor, uniform: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)  # exact normaliser (a cumsum's total is only for searching)
    if top_p >= 1.0:
        token = _invert_cdf((scaled - lse).exp_(), uniform)
        return token.squeeze(-1), (scaled.gather(-1, token) - lse).squeeze(-1)
    vocab = scaled.shape[-1]
    values, index = scaled.topk(min(NUCLEUS_CANDIDATES, vocab), dim=-1)  # sorted, most likely first
    probs = (values - lse).exp_()
    keep = probs.cumsum(-1) - probs < top_p  # the smallest prefix whose mass reaches top_p (always the first)
    kept = probs * keep
    pick = _invert_cdf(kept, uniform)
    token = index.gather(-1, pick).squeeze(-1)
    chosen = (kept.gather(-1, pick) / kept.sum(-1, keepdim=True)).log_().squeeze(-1)
    wide = keep[:, -1].nonzero().squeeze(-1) if values.shape[-1] < vocab else keep.new_zeros(0, dtype=torch.long)
    if wide.numel():  # a nucleus wider than the candidates (it may go on past them): those rows sort everything
        full = sampling_log_probs(scaled[wide], 1.0, top_p)
        wide_token = _invert_cdf(full.exp(), uniform[wide])
        token[wide] = wide_token.squeeze(-1)
        chosen[wide] = full.gather(-1, wide_token).squeeze(-1)
    return token, chosen


def _invert_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """[B, 1] index i with cdf[i-1] <= u·total < cdf[i] of non-negative weights [B, K]: a draw ∝ weights. A token of
    weight 0 is never picked (its cdf equals its predecessor's), except at the clamp when rounding puts u·total at the
    very top, which falls back to the heaviest token."""
    cdf = weights.cumsum(-1)
    pick = torch.searchsorted(cdf, uniform.unsqueeze(-1) * cdf[:, -1:], right=True)
    top = pick >= weights.shape[-1]
    return torch.where(top, weights.argmax(-1, keepdim=True), pick.clamp_(max=weights.shape[-1] - 1))


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
