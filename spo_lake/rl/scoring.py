"""Per-token log-probs of a batch's responses under a model: the policy (with gradient) and π0 (cached or live)."""
from __future__ import annotations

import torch

from spo_lake.models.sampling import gather_token_log_probs, positions_from_mask
from spo_lake.rl.examples import Batch


def response_log_probs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """log p(a_t | a_<t, x) of every response token, (B, T) float32; padding positions hold garbage.

    Responses all start at column P (see Batch); the logit at position P−1+t predicts response token t, so only
    those T positions' logits are materialised (passing their indices, not the last T+1 positions and a slice,
    also spares the backward pass a zero-filled gradient of all T+1 positions' logits).
    """
    width = batch.response_ids.shape[1]
    start = batch.input_ids.shape[1] - width - 1
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask,
        position_ids=positions_from_mask(batch.attention_mask), use_cache=False,
        logits_to_keep=torch.arange(start, start + width, device=batch.input_ids.device),
    ).logits
    return gather_token_log_probs(logits, batch.response_ids)


@torch.no_grad()
def reference_log_probs(reference: torch.nn.Module | None, batch: Batch, chunk_size: int = 16) -> torch.Tensor:
    """log π0 of every response token, (B, T): the cached values where batch.ref_cached, the live reference
    model (in chunks of `chunk_size` rows) elsewhere."""
    out = batch.ref_logprobs.clone()
    live = (~batch.ref_cached).nonzero().squeeze(-1)
    if not live.numel():
        return out
    if reference is None:
        raise ValueError("rows without cached reference log-probs need a live reference model")
    for start in range(0, live.numel(), chunk_size):
        rows = live[start : start + chunk_size]
        out[rows] = response_log_probs(reference, batch.rows(rows)).to(out.dtype)
    return out
